"""Type stub of the legacy name cake_kda_train.plan:

cake_kda_det_train.plan itself.
"""

from cake_kda_det_train.plan import *  # noqa: F403
