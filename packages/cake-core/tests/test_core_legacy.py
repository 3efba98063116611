"""cake_core.legacy on fake canonical packages (no kernels): a good stub passes every
legacy check, a plain re-export stub is caught."""

import dataclasses
import sys
import textwrap

import pytest
from cake_core import legacy, legacy_checks, names

LOCAL = names.NameEntry("cake-fakenorm-det-train", "cake_fakenorm_det_train", "fakenorm",
                        "det", "local")
KCP = names.NameEntry("cake-fakenorm-det-train-kcp", "cake_fakenorm_det_train_kcp",
                      "fakenorm", "det", "kcp")
FAKE_LEGACY = {"cake-fakenorm-train": (LOCAL,), "cake-fakenormboth-train": (LOCAL, KCP),
               "cake-fakebad-train": (LOCAL,)}

FILES = {
    "cake_fakenorm_det_train/__init__.py": '''
        from cake_core.lazy import lazy_exports
        from cake_fakenorm_det_train.api import fakenorm_det, fakenorm_det_bwd
        __version__ = "0.1.0"
        __all__ = ["FakeNormDetPlan", "__version__", "fakenorm_det", "fakenorm_det_bwd",
                   "make_plan"]
        # a canonical package's lazy exports (a reload re-installs its __getattr__)
        __getattr__, __dir__ = lazy_exports(
            __name__, {"FakeNormDetPlan": "plan", "make_plan": "plan"}, __all__)
        ''',
    "cake_fakenorm_det_train/api.py": '''
        def fakenorm_det(x):
            return x
        def fakenorm_det_bwd(x):
            return x
        ''',
    "cake_fakenorm_det_train/plan.py": '''
        import dataclasses
        @dataclasses.dataclass(frozen=True)
        class FakeNormDetPlan:
            block: int = 4
        def make_plan():
            return FakeNormDetPlan()
        ''',
    "cake_fakenorm_det_train/extra.py": '''
        class ExtraDetThing:
            pass
        ''',
    "cake_fakenorm_det_train_kcp/__init__.py": '''
        from cake_fakenorm_det_train_kcp.saved import FakeNormDetKCPSavedSet
        __version__ = "0.1.0"
        __all__ = ["FakeNormDetKCPSavedSet", "__version__", "partition_det_kcp"]
        def partition_det_kcp(n):
            return n
        ''',
    "cake_fakenorm_det_train_kcp/saved.py": '''
        class FakeNormDetKCPSavedSet:
            pass
        ''',
    "cake_fakenorm_train/__init__.py": '''
        __version__ = "0.1.0"
        import cake_core.legacy as _legacy
        _legacy.alias_legacy_module(__name__)
        ''',
    "cake_fakenormboth_train/__init__.py": '''
        __version__ = "0.1.0"
        import cake_core.legacy as _legacy
        _legacy.alias_legacy_module(__name__)
        ''',
    # what a naive stub does: a copy of the names, not the objects' home module
    "cake_fakebad_train/__init__.py": '''
        import warnings
        from cake_fakenorm_det_train import *  # noqa: F403
        from cake_fakenorm_det_train import fakenorm_det as fakenorm
        warnings.warn("cake_fakebad_train is deprecated: import cake_fakenorm_det_train",
                      DeprecationWarning)
        ''',
}

pytestmark = pytest.mark.filterwarnings("ignore:cake_fake:DeprecationWarning")

GOOD_CHECKS = [c for c in legacy_checks.CHECKS if c is not legacy_checks.check_pyi]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    for rel, text in FILES.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(legacy, "LEGACY", FAKE_LEGACY)
    monkeypatch.setattr(legacy_checks, "LEGACY", FAKE_LEGACY)
    yield tmp_path
    for k in [k for k in sys.modules if k.startswith(("cake_fakenorm", "cake_fakebad"))]:
        del sys.modules[k]
    for k in ("cake_fakenorm_train", "cake_fakenormboth_train"):
        legacy._finder().routes.pop(k, None)


@pytest.mark.parametrize("old", ["cake_fakenorm_train", "cake_fakenormboth_train"])
@pytest.mark.parametrize("check", GOOD_CHECKS, ids=lambda c: c.__name__)
def test_good_stub_passes(fake, old, check):
    check(old)


def test_alias_details(fake):
    import cake_fakenorm_det_train as new
    import cake_fakenorm_det_train.plan as new_plan
    import cake_fakenorm_train as old
    import cake_fakenorm_train.plan as old_plan

    assert old is new and old_plan is new_plan
    assert old.FakeNormPlan is new.FakeNormDetPlan and old_plan.FakeNormPlan is not None
    assert old_plan.__spec__.name == "cake_fakenorm_det_train.plan"
    assert old.fakenorm_bwd is new.fakenorm_det_bwd
    with pytest.raises(AttributeError):
        old.no_such_name  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        import cake_fakenorm_train.nope  # noqa: F401


def test_submodule_loaded_after_the_legacy_import_has_old_spellings(fake):
    import cake_fakenorm_train as old

    assert "cake_fakenorm_det_train.extra" not in sys.modules
    import cake_fakenorm_det_train.extra as extra  # canonical name, after the legacy import

    assert old.extra is extra and extra.ExtraThing is extra.ExtraDetThing
    assert extra.__loader__ is extra.__spec__.loader


def test_two_target_details(fake):
    import cake_fakenorm_det_train as local
    import cake_fakenorm_det_train_kcp as kcp
    import cake_fakenormboth_train as old
    import cake_fakenormboth_train.kcp.saved as old_saved

    assert old is not local and isinstance(old, legacy.LegacyReExportModule)
    assert old.kcp is kcp and old_saved is kcp.saved
    assert old.partition_kcp is kcp.partition_det_kcp and old.fakenorm is local.fakenorm_det
    assert old.FakeNormKCPSavedSet is kcp.FakeNormDetKCPSavedSet
    assert "kcp" in dir(old) and "partition_det_kcp" in old.__all__
    assert old.__version__ == "0.1.0"


def test_bad_stub_is_caught(fake):
    with pytest.raises(AssertionError):
        legacy_checks.check_identity("cake_fakebad_train")
    with pytest.raises(AssertionError):
        legacy_checks.check_state_shared("cake_fakebad_train")
    with pytest.raises((AssertionError, AttributeError)):
        legacy_checks.check_det_aliases("cake_fakebad_train")


def test_unknown_legacy_name_raises(fake):
    with pytest.raises(KeyError):
        legacy.alias_legacy_module("cake_nothing_train")


def test_strip_det_is_applied_to_public_names_only():
    mod = type(sys)("m")
    mod.__all__ = ["a_det", "BDetPlan", "_c_det"]
    mod.a_det, mod.BDetPlan, mod._c_det = 1, 2, 3
    assert legacy.legacy_aliases(mod) == {"a": "a_det", "BPlan": "BDetPlan"}
    assert dataclasses.is_dataclass(LOCAL)


def test_warning_from_a_main_without_source(fake):
    """``python -c "import old"``: the warning points at ``<string>`` and importing works
    (``__main__``'s loader has no source to show)."""
    import importlib.machinery
    import warnings

    g = {"__name__": "__main__", "__loader__": importlib.machinery.BuiltinImporter}
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        exec(compile("import cake_fakenorm_train", "<string>", "exec"), g)
    ours = [w for w in rec if "cake_fakenorm_train is deprecated" in str(w.message)]
    assert len(ours) == 1 and ours[0].filename == "<string>" and ours[0].lineno == 1


def test_a_name_the_module_exports_is_never_mapped(fake):
    import cake_fakenorm_det_train as new
    import cake_fakenorm_train as old

    assert type(new) is legacy.LegacyAliasedModule and isinstance(new, type(sys))
    new.__all__ = [*new.__all__, "fakenorm"]  # a module exporting both spellings
    new.fakenorm = "own"
    assert new.fakenorm == "own" and new.fakenorm_det is not None and old.fakenorm == "own"
    del new.fakenorm
    assert new.fakenorm_det(3) == 3
    new._fakenorm = 1  # private names are never mapped
    assert new.__dict__["_fakenorm"] == 1
