"""Type stub of the legacy name cake_rmsnorm_train.saved:

cake_rmsnorm_det_train.saved itself.
"""

from cake_rmsnorm_det_train.saved import *  # noqa: F403
