"""Type stub of the legacy name cake_kda_train.reference:

cake_kda_det_train.reference itself.
"""

from cake_kda_det_train.reference import *  # noqa: F403
