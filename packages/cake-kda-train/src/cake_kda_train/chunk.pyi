"""Type stub of the legacy name cake_kda_train.chunk:

cake_kda_det_train.chunk itself.
"""

from cake_kda_det_train.chunk import *  # noqa: F403
