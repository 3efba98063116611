"""Type stub of the legacy name cake_mhc_train.saved:

cake_mhc_det_train.saved itself.
"""

from cake_mhc_det_train.saved import *  # noqa: F403
