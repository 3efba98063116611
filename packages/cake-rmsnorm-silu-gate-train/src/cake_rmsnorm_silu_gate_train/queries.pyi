"""Type stub of the legacy name cake_rmsnorm_silu_gate_train.queries:

cake_rmsnorm_silu_gate_det_train.queries itself.
"""

from cake_rmsnorm_silu_gate_det_train.queries import *  # noqa: F403
