"""Type stub of the legacy name cake_rmsnorm_train.kernels:

cake_rmsnorm_det_train.kernels itself.
"""

from cake_rmsnorm_det_train.kernels import *  # noqa: F403
