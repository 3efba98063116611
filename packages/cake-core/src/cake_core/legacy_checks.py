"""The properties every legacy distribution must keep, as checks its tests call
(``packages/cake-*-train/tests``, ``packages/cake-*-gemm/tests`` of the legacy names).

Each check takes the legacy import name (``"cake_rmsnorm_train"``) and raises
``AssertionError`` on a broken property. None launches a kernel; the canonical packages'
submodules are imported (Triton included), which takes a second or two.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import pickle
import pkgutil
import sys
import types
import warnings
from pathlib import Path

from cake_core.legacy import legacy_aliases, public_names
from cake_core.names import LEGACY

__all__ = ["CHECKS", "check_det_aliases", "check_identity", "check_old_spelling_writes",
           "check_pickle", "check_pyi", "check_reload", "check_star_import",
           "check_state_shared", "check_warning", "run_all"]


def _targets(legacy: str) -> list[types.ModuleType]:
    return [importlib.import_module(t.import_name) for t in LEGACY[legacy.replace("_", "-")]]


def _submodules(pkg: types.ModuleType) -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__))


def _forget(legacy: str) -> None:
    for k in [k for k in sys.modules if k == legacy or k.startswith(legacy + ".")]:
        del sys.modules[k]


def check_warning(legacy: str) -> None:
    """A fresh ``import old`` raises exactly one DeprecationWarning, naming the canonical
    import(s) and attributed to the importing code (here, not importlib); importing old
    submodules afterwards adds none."""
    targets = _targets(legacy)
    _forget(legacy)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        importlib.import_module(legacy)
        for sub in _submodules(targets[0])[:2]:
            importlib.import_module(f"{legacy}.{sub}")
        importlib.import_module(legacy)
    ours = [w for w in rec if issubclass(w.category, DeprecationWarning)
            and legacy in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert Path(ours[0].filename).resolve() == Path(__file__).resolve(), ours[0].filename
    for t in targets:
        assert t.__name__ in str(ours[0].message), str(ours[0].message)


def check_identity(legacy: str) -> None:
    """``import old`` / ``import old.sub`` give the canonical module objects themselves;
    ``old.Cls is new.Cls`` for every public name."""
    targets = _targets(legacy)
    old = importlib.import_module(legacy)
    local = targets[0]
    if len(targets) == 1:
        assert old is local, (old, local)
        assert sys.modules[legacy] is local
    else:
        kcp = targets[1]
        assert old.kcp is kcp and importlib.import_module(f"{legacy}.kcp") is kcp
        for sub in _submodules(kcp):
            assert importlib.import_module(f"{legacy}.kcp.{sub}") is \
                importlib.import_module(f"{kcp.__name__}.{sub}"), sub
        for n in public_names(kcp):
            if n not in public_names(local):
                assert getattr(old, n) is getattr(kcp, n), n
    for sub in _submodules(local):
        mod = importlib.import_module(f"{legacy}.{sub}")
        assert mod is importlib.import_module(f"{local.__name__}.{sub}"), sub
        assert getattr(old, sub) is mod, sub
        assert mod.__spec__.name == f"{local.__name__}.{sub}", mod.__spec__
    for n in public_names(local):
        assert getattr(old, n) is getattr(local, n), n
    try:
        importlib.import_module(f"{legacy}.no_such_submodule")
    except ModuleNotFoundError:
        pass
    else:  # pragma: no cover
        raise AssertionError("a missing old submodule must raise ModuleNotFoundError")


def check_det_aliases(legacy: str) -> None:
    """Every public name with ``_det`` / ``Det`` reads under its old spelling, as the same
    object, from the old module (and ``from old import <old spelling>`` works)."""
    old = importlib.import_module(legacy)
    n_alias = 0
    for t in _targets(legacy):
        for alias, name in legacy_aliases(t).items():
            assert getattr(old, alias) is getattr(t, name), (alias, name)
            ns: dict = {}
            exec(f"from {legacy} import {alias} as x", ns)
            assert ns["x"] is getattr(t, name)
            n_alias += 1
    assert n_alias > 0


def check_state_shared(legacy: str) -> None:
    """Setting a module attribute through one name is seen through the other, both ways."""
    old = importlib.import_module(legacy)
    for t in _targets(legacy):
        name = sorted(public_names(t))[0]
        orig = getattr(t, name)
        try:
            setattr(old, name, "set-through-old")
            assert getattr(t, name) == "set-through-old", name
            setattr(t, name, "set-through-new")
            assert getattr(old, name) == "set-through-new", name
        finally:
            setattr(t, name, orig)
        assert getattr(old, name) is orig
    # a new attribute set through the old name lives in the (local) canonical module
    old._cake_legacy_probe = 1
    try:
        assert _targets(legacy)[0]._cake_legacy_probe == 1
    finally:
        del old._cake_legacy_probe


def _first_alias(t: types.ModuleType) -> tuple[str, str]:
    return sorted(legacy_aliases(t).items())[0]


def check_old_spelling_writes(legacy: str) -> None:
    """Writing, deleting or ``mock.patch``-ing an old spelling through the old module acts
    on the canonical name (both spellings stay one object) and a patch restores it."""
    from unittest import mock

    old = importlib.import_module(legacy)
    for t in _targets(legacy):
        alias, name = _first_alias(t)
        orig = getattr(t, name)
        had = name in vars(t)
        try:
            setattr(old, alias, "set-through-old")
            assert getattr(t, name) == "set-through-old", (alias, name)
            assert alias not in vars(t), alias
            assert getattr(old, alias) == "set-through-old" == getattr(t, alias)
            delattr(old, alias)
            assert name not in vars(t), name
            if not had:  # a lazy export resolves again
                assert getattr(t, name) is orig, name
        finally:
            if getattr(t, name, None) is not orig:
                setattr(t, name, orig)
        assert getattr(old, alias) is orig is getattr(t, name)
        with mock.patch(f"{legacy}.{alias}", "patched"):
            assert getattr(t, name) == "patched" == getattr(old, alias), (alias, name)
        assert getattr(t, name) is orig is getattr(old, alias), (alias, name)
        assert alias not in vars(t), alias
        with mock.patch.object(t, alias, "patched"):  # the canonical module, old spelling
            assert getattr(t, name) == "patched" == getattr(old, alias), (alias, name)
        assert getattr(t, name) is orig is getattr(old, alias), (alias, name)
    targets = _targets(legacy)
    for i, t in enumerate(targets):  # classes, patched in their submodule (often no __all__)
        prefix = legacy if i == 0 else f"{legacy}.kcp"
        for alias, cls in _classes(t):
            sub = importlib.import_module(cls.__module__)
            name = cls.__name__
            path = f"{prefix}{cls.__module__[len(t.__name__):]}.{alias}"
            with mock.patch(path, "patched"):
                assert getattr(sub, name) == "patched", path
            assert getattr(sub, name) is cls and getattr(sub, alias) is cls, path
            assert alias not in vars(sub), path


def check_reload(legacy: str) -> None:
    """``importlib.reload`` of a canonical package (and of the old name) keeps the old
    spellings and the old pickle paths."""
    importlib.import_module(legacy)
    targets = _targets(legacy)
    for t in targets:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            importlib.reload(t)
        old = importlib.import_module(legacy)
        for alias, name in legacy_aliases(t).items():
            assert getattr(t, alias) is getattr(t, name), (alias, name)
            assert getattr(old, alias) is getattr(t, name), (alias, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.reload(importlib.import_module(legacy))
    for t in targets:
        for alias, name in legacy_aliases(t).items():
            assert getattr(old, alias) is getattr(t, name), (alias, name)
        for alias, cls in _classes(t):
            data = f"c{legacy}\n{alias}\n.".encode()
            assert pickle.loads(data) is cls, alias


def check_star_import(legacy: str) -> None:
    """``from old import *`` binds exactly the runtime ``__all__``: the canonical public
    names (and ``kcp`` for two targets), never an old spelling on its own."""
    old = importlib.import_module(legacy)
    ns: dict = {}
    exec(f"from {legacy} import *", ns)
    bound = set(ns) - {"__builtins__"}
    assert bound == set(old.__all__), sorted(bound ^ set(old.__all__))
    for t in _targets(legacy):
        assert set(public_names(t)) <= bound, sorted(set(public_names(t)) - bound)
        for alias in legacy_aliases(t):
            if alias not in public_names(t):
                assert alias not in bound, alias


def _classes(t: types.ModuleType) -> list[tuple[str, type]]:
    out = []
    for alias, name in sorted(legacy_aliases(t).items()):
        obj = getattr(t, name)
        if isinstance(obj, type) and obj.__module__.startswith(t.__name__ + "."):
            out.append((alias, obj))
    return out


def check_pickle(legacy: str) -> None:
    """Pickles written with old dotted paths (``old.Cls``, ``old.sub.Cls``, with the old
    spelling of the class name) load as the canonical objects."""
    targets = _targets(legacy)
    checked = 0
    for i, t in enumerate(targets):
        prefix = legacy if i == 0 else f"{legacy}.kcp"
        for alias, cls in _classes(t):
            sub = cls.__module__[len(t.__name__):]  # ".saved"
            canon = f"{cls.__module__}\n{cls.__qualname__}\n".encode()
            for path in (f"{legacy}\n{alias}\n", f"{prefix}{sub}\n{alias}\n"):
                data = pickle.dumps(cls, protocol=0)
                assert canon in data
                assert pickle.loads(data.replace(canon, path.encode())) is cls, path
            try:  # an instance, where one can be made without arguments
                data = pickle.dumps(cls.__new__(cls), protocol=0)
            except Exception:
                continue
            got = pickle.loads(data.replace(canon, f"{prefix}{sub}\n{alias}\n".encode()))
            assert type(got) is cls
            checked += 1
    assert checked > 0, "no class instance could be pickled"


def _stub_dir(legacy: str) -> Path:
    spec = importlib.machinery.PathFinder.find_spec(legacy)
    assert spec is not None and spec.submodule_search_locations, legacy
    return Path(list(spec.submodule_search_locations)[0])


def check_pyi(legacy: str) -> None:
    """The stub ships ``__init__.pyi`` (and ``py.typed``) naming every canonical public
    name, re-exported from the canonical modules, and every old spelling, bound to its
    canonical name; its ``__all__`` is the runtime ``__all__`` (a star import gives the
    canonical names only); each public submodule of the (local) canonical package has a
    ``<sub>.pyi`` re-exporting it."""
    d = _stub_dir(legacy)
    assert (d / "py.typed").is_file(), d
    tree = ast.parse((d / "__init__.pyi").read_text())
    seen: dict[str, str] = {}
    pyi_all = None
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                seen[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                seen[a.asname or a.name] = a.name
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = getattr(node.targets[0], "id", None)
            if target == "__all__":
                pyi_all = ast.literal_eval(node.value)
            elif isinstance(node.value, ast.Name) and node.value.id in seen:
                seen[target] = seen[node.value.id]
    targets = _targets(legacy)
    for t in targets:
        for n in public_names(t):
            assert seen.get(n) == f"{t.__name__}.{n}" or n in seen, (n, t.__name__)
        for alias, name in legacy_aliases(t).items():
            assert seen.get(alias) == f"{t.__name__}.{name}", (alias, seen.get(alias))
    if len(targets) == 2:
        assert seen.get("kcp") == targets[1].__name__
    runtime_all = importlib.import_module(legacy).__all__
    assert pyi_all is not None and sorted(pyi_all) == sorted(runtime_all), \
        sorted(set(pyi_all or ()) ^ set(runtime_all))
    local = targets[0]
    for sub in _submodules(local):
        if sub.startswith("_") or sub == "cake_build":  # the build manifest: no stub
            continue
        text = (d / f"{sub}.pyi").read_text()
        assert f"from {local.__name__}.{sub} import *" in text, sub


CHECKS = (check_warning, check_identity, check_det_aliases, check_state_shared,
          check_old_spelling_writes, check_reload, check_star_import, check_pickle,
          check_pyi)


def run_all(legacy: str) -> None:
    """Every check, in order."""
    for c in CHECKS:
        c(legacy)
