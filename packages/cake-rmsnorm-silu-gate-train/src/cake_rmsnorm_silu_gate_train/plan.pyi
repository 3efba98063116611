"""Type stub of the legacy name cake_rmsnorm_silu_gate_train.plan:

cake_rmsnorm_silu_gate_det_train.plan itself.
"""

from cake_rmsnorm_silu_gate_det_train.plan import *  # noqa: F403
