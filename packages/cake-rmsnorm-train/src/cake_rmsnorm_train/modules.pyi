"""Type stub of the legacy name cake_rmsnorm_train.modules:

cake_rmsnorm_det_train.modules itself.
"""

from cake_rmsnorm_det_train.modules import *  # noqa: F403
