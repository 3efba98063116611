"""Type stub of the legacy name cake_gdn_train.exchange:

cake_gdn_det_train_kcp.exchange itself.
"""

from cake_gdn_det_train_kcp.exchange import *  # noqa: F403
