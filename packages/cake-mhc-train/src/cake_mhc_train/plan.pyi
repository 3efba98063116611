"""Type stub of the legacy name cake_mhc_train.plan:

cake_mhc_det_train.plan itself.
"""

from cake_mhc_det_train.plan import *  # noqa: F403
