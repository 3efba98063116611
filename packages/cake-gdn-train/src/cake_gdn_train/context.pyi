"""Type stub of the legacy name cake_gdn_train.context:

cake_gdn_det_train_kcp.context itself.
"""

from cake_gdn_det_train_kcp.context import *  # noqa: F403
