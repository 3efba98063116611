"""cake-rmsnorm-silu-gate-train: legacy name of cake-rmsnorm-silu-gate-det-train (deprecated).

Import cake_rmsnorm_silu_gate_det_train instead.
This stub resolves the old name to the canonical module's own objects
(cake_core.legacy).
"""

__version__ = "0.1.0"

import cake_core.legacy as _legacy  # noqa: E402

_legacy.alias_legacy_module(__name__)
