"""Type stub of the legacy name cake_rmsnorm_silu_gate_train.kernels:

cake_rmsnorm_silu_gate_det_train.kernels itself.
"""

from cake_rmsnorm_silu_gate_det_train.kernels import *  # noqa: F403
