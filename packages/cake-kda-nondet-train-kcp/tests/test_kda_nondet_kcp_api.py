"""Package surface: lazy imports (no Triton), the build manifest and its sibling registry
(cake-kda-nondet-train, whose entries each rank runs)."""

import importlib

from cake_core.testing import assert_imports_without_triton


def test_import_is_lazy():
    assert_imports_without_triton("cake_kda_nondet_train_kcp",
                                  "cake_kda_nondet_train_kcp.cake_build")


def test_manifest_and_sibling_registry():
    from cake_core.build import validate_manifest
    from cake_core.naming import check_name, parse_name
    from cake_kda_nondet_train import cake_build as sibling
    from cake_kda_nondet_train_kcp import __all__ as public
    from cake_kda_nondet_train_kcp import __version__
    from cake_kda_nondet_train_kcp.cake_build import FAMILY, manifest

    m = manifest()
    assert validate_manifest(m) == [] and m["source_digest"].startswith("sha256:")
    assert check_name(FAMILY["name"]) == [] and FAMILY["version"] == __version__
    assert parse_name(FAMILY["name"]) == {"family": "kda", "mode": "nondet", "op": "train",
                                          "kind": "kcp"}
    assert set(FAMILY["entry_points"]) <= set(public)
    assert m["kernels"] == sibling.MANIFEST["kernels"] and m["kernels"]
    (reuse,) = m["reuses"]
    assert reuse["name"] == sibling.FAMILY["name"]
    mod = importlib.import_module(reuse["import_name"])
    assert all(getattr(mod, e) is not None for e in reuse["entry_points"])
