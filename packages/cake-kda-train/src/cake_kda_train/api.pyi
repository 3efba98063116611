"""Type stub of the legacy name cake_kda_train.api:

cake_kda_det_train.api itself.
"""

from cake_kda_det_train.api import *  # noqa: F403
