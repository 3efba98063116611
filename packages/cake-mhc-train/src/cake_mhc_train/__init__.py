"""cake-mhc-train: legacy name of cake-mhc-det-train (deprecated).

Import cake_mhc_det_train instead.
This stub resolves the old name to the canonical module's own objects
(cake_core.legacy).
"""

__version__ = "0.1.0"

import cake_core.legacy as _legacy  # noqa: E402

_legacy.alias_legacy_module(__name__)
