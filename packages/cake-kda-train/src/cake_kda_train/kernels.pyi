"""Type stub of the legacy name cake_kda_train.kernels:

cake_kda_det_train.kernels itself.
"""

from cake_kda_det_train.kernels import *  # noqa: F403
