"""Type stub of the legacy name cake_gdn_train.api:

cake_gdn_det_train_kcp.api itself.
"""

from cake_gdn_det_train_kcp.api import *  # noqa: F403
