"""Type stub of the legacy name cake_mhc_train.api:

cake_mhc_det_train.api itself.
"""

from cake_mhc_det_train.api import *  # noqa: F403
