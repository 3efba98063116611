"""Type stub of the legacy name cake_rmsnorm_silu_gate_train.modules:

cake_rmsnorm_silu_gate_det_train.modules itself.
"""

from cake_rmsnorm_silu_gate_det_train.modules import *  # noqa: F403
