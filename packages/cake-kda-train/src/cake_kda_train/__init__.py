"""cake-kda-train: legacy name of cake-kda-det-train and cake-kda-det-train-kcp (deprecated).

Import cake_kda_det_train instead.
Import cake_kda_det_train_kcp instead.
This stub resolves the old name to the canonical modules' own objects
(cake_core.legacy).
"""

__version__ = "0.1.0"

import cake_core.legacy as _legacy  # noqa: E402

_legacy.alias_legacy_module(__name__)
