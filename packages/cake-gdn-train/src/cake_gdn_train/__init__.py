"""cake-gdn-train: legacy name of cake-gdn-det-train-kcp (deprecated).

Import cake_gdn_det_train_kcp instead.
This stub resolves the old name to the canonical module's own objects
(cake_core.legacy).
"""

__version__ = "0.1.0"

import cake_core.legacy as _legacy  # noqa: E402

_legacy.alias_legacy_module(__name__)
