"""Package surface: lazy imports, public names, the manifest and its sibling registry."""

import importlib

from cake_core.testing import assert_imports_without_triton


def test_import_is_lazy():
    assert_imports_without_triton("cake_gdn_nondet_train_kcp",
                                  "cake_gdn_nondet_train_kcp.cake_build")


def test_public_names():
    import cake_gdn_nondet_train_kcp as pkg

    for name in pkg.__all__:
        assert getattr(pkg, name) is not None
    assert pkg.chunk_gated_delta_rule_nondet_kcp.__doc__.startswith("Context-parallel")


def test_manifest_and_sibling_registry():
    from cake_core.build import validate_manifest
    from cake_core.naming import check_name, parse_name
    from cake_gdn_nondet_train import cake_build as sibling
    from cake_gdn_nondet_train_kcp.cake_build import FAMILY, MANIFEST, manifest

    m = manifest()
    assert validate_manifest(m) == [] and m["source_digest"].startswith("sha256:")
    assert FAMILY["kind"] == "kcp" and FAMILY["mode"] == "nondet"
    assert check_name(FAMILY["name"]) == [] and parse_name(FAMILY["name"])["kind"] == "kcp"
    assert m["kernels"] == sibling.MANIFEST["kernels"] and m["kernels"]
    (reuse,) = MANIFEST["reuses"]
    assert reuse["name"] == sibling.FAMILY["name"]
    mod = importlib.import_module(reuse["import_name"])
    assert all(callable(getattr(mod, e)) for e in reuse["entry_points"])
