"""Package surface: lazy imports, public names, the manifest (the det kernels it launches)."""

import importlib

from cake_core.testing import assert_imports_without_triton


def test_import_is_lazy():
    assert_imports_without_triton("cake_gdn_nondet_train", "cake_gdn_nondet_train.cake_build")


def test_public_names():
    import cake_gdn_nondet_train as pkg

    for name in pkg.__all__:
        assert getattr(pkg, name) is not None
    assert pkg.chunk_gated_delta_rule_nondet.__doc__.startswith("Non-deterministic drop-in")


def test_manifest_lists_the_det_kernels_it_launches():
    from cake_core.build import validate_manifest
    from cake_core.naming import check_name
    from cake_gdn_det_train import cake_build as det
    from cake_gdn_nondet_train.cake_build import FAMILY, manifest

    m = manifest()
    assert validate_manifest(m) == [] and m["source_digest"].startswith("sha256:")
    assert FAMILY["mode"] == "nondet" and check_name(FAMILY["name"]) == []
    assert m["kernels"] == det.MANIFEST["kernels"] and m["kernels"]
    for k in m["kernels"]:
        assert hasattr(importlib.import_module(k["module"]), k["function"])
    assert m["source_digest"] != det.manifest()["source_digest"]
