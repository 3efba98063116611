"""Type stub of the legacy name cake_mhc_train.kernels:

cake_mhc_det_train.kernels itself.
"""

from cake_mhc_det_train.kernels import *  # noqa: F403
