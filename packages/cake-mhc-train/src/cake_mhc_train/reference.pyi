"""Type stub of the legacy name cake_mhc_train.reference:

cake_mhc_det_train.reference itself.
"""

from cake_mhc_det_train.reference import *  # noqa: F403
