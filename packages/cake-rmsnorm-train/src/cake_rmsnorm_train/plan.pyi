"""Type stub of the legacy name cake_rmsnorm_train.plan:

cake_rmsnorm_det_train.plan itself.
"""

from cake_rmsnorm_det_train.plan import *  # noqa: F403
