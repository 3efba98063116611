"""Type stub of the legacy name cake_gdn_train.queries:

cake_gdn_det_train_kcp.queries itself.
"""

from cake_gdn_det_train_kcp.queries import *  # noqa: F403
