"""Type stub of the legacy name cake_mhc_train.modules:

cake_mhc_det_train.modules itself.
"""

from cake_mhc_det_train.modules import *  # noqa: F403
