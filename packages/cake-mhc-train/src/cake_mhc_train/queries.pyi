"""Type stub of the legacy name cake_mhc_train.queries:

cake_mhc_det_train.queries itself.
"""

from cake_mhc_det_train.queries import *  # noqa: F403
