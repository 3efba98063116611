"""Type stub of the legacy name cake_gdn_train.saved:

cake_gdn_det_train_kcp.saved itself.
"""

from cake_gdn_det_train_kcp.saved import *  # noqa: F403
