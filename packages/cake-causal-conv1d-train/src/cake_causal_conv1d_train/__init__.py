"""cake-causal-conv1d-train: legacy name (deprecated) of

- cake-causal-conv1d-det-train
- cake-causal-conv1d-det-train-kcp

Import cake_causal_conv1d_det_train instead.
Import cake_causal_conv1d_det_train_kcp instead.
This stub resolves the old name to the canonical modules' own objects
(cake_core.legacy).
"""

__version__ = "0.1.0"

import cake_core.legacy as _legacy  # noqa: E402

_legacy.alias_legacy_module(__name__)
