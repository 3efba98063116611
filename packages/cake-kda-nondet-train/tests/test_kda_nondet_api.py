"""Package surface: lazy imports (no Triton), the build manifest and its sibling registry
(the det package whose kernels it launches), the custom ops' namespace."""

import importlib

import torch
from cake_core.testing import assert_imports_without_triton


def test_import_is_lazy():
    assert_imports_without_triton("cake_kda_nondet_train", "cake_kda_nondet_train.cake_build")


def test_manifest_and_sibling_registry():
    from cake_core.build import validate_manifest
    from cake_core.naming import check_name, parse_name
    from cake_kda_det_train import cake_build as det
    from cake_kda_nondet_train import __all__ as public
    from cake_kda_nondet_train import __version__
    from cake_kda_nondet_train.cake_build import FAMILY, manifest

    m = manifest()
    assert validate_manifest(m) == [] and m["source_digest"].startswith("sha256:")
    assert check_name(FAMILY["name"]) == [] and FAMILY["version"] == __version__
    assert parse_name(FAMILY["name"]) == {"family": "kda", "mode": "nondet", "op": "train",
                                          "kind": "local"}
    assert set(FAMILY["entry_points"]) <= set(public)
    assert m["kernels"] == det.MANIFEST["kernels"] and m["kernels"]  # det's, not copies
    (reuse,) = m["reuses"]
    assert reuse["name"] == det.FAMILY["name"]
    mod = importlib.import_module(reuse["import_name"])
    assert all(getattr(mod, e) is not None for e in reuse["entry_points"])
    assert m["source_digest"] != det.manifest()["source_digest"]


def test_own_custom_ops():
    import cake_kda_nondet_train.api  # noqa: F401 - registers the ops

    assert torch.ops.cake_kda_nondet_train.fwd is not None
    assert torch.ops.cake_kda_nondet_train.bwd is not None
