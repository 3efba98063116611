"""Type stub of the legacy name cake_rmsnorm_silu_gate_train.reference:

cake_rmsnorm_silu_gate_det_train.reference itself.
"""

from cake_rmsnorm_silu_gate_det_train.reference import *  # noqa: F403
