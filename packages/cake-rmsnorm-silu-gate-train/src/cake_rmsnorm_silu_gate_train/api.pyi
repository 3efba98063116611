"""Type stub of the legacy name cake_rmsnorm_silu_gate_train.api:

cake_rmsnorm_silu_gate_det_train.api itself.
"""

from cake_rmsnorm_silu_gate_det_train.api import *  # noqa: F403
