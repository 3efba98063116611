"""Type stub of the legacy name cake_kda_train.queries:

cake_kda_det_train.queries itself.
"""

from cake_kda_det_train.queries import *  # noqa: F403
