"""Type stub of the legacy name cake_rmsnorm_train.api:

cake_rmsnorm_det_train.api itself.
"""

from cake_rmsnorm_det_train.api import *  # noqa: F403
