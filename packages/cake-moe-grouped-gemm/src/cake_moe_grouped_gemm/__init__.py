"""cake-moe-grouped-gemm: legacy name of cake-moe-grouped-det-gemm (deprecated).

Import cake_moe_grouped_det_gemm instead.
This stub resolves the old name to the canonical module's own objects
(cake_core.legacy).
"""

__version__ = "0.1.0"

import cake_core.legacy as _legacy  # noqa: E402

_legacy.alias_legacy_module(__name__)
