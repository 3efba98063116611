"""Legacy import names: the old modules (``cake_rmsnorm_train``, ``cake_kda_train``, ...)
resolve to the canonical modules' own objects.

A legacy distribution holds only an import stub whose ``__init__`` calls
:func:`alias_legacy_module` (see ``packages/cake-rmsnorm-train``). What a user gets:

* **One canonical target** (``cake_rmsnorm_train`` -> ``cake_rmsnorm_det_train``, also
  ``cake_gdn_train`` -> ``cake_gdn_det_train_kcp``): ``import old`` binds the canonical
  module object itself (the stub puts it in ``sys.modules`` under the old name), so
  ``old is new``, ``old.Cls is new.Cls`` and module state is shared both ways.
  ``import old.sub`` binds ``new.sub`` itself: a meta path finder sends every
  ``old.<dotted>`` import to ``new.<dotted>`` without loading a second copy.
* **Two canonical targets** (``cake_kda_train`` and ``cake_causal_conv1d_train``, whose old
  module held the local and the KCP names): no single module can be both, so ``old`` is a
  re-export module (:class:`LegacyReExportModule`). Every public name of the local and of
  the KCP canonical module reads as the same object; ``old.kcp`` is the canonical KCP
  module; every other ``old.<sub>`` is the local module's submodule; setting ``old.X``
  sets ``X`` on the canonical module that owns it (the local one for new names), so module
  state lives in the canonical modules. Where identity is impossible: ``old is not
  new`` and ``old.__name__`` / ``old.__version__`` are the legacy stub's.
* **Names without det**: every public name containing ``_det`` or ``Det``
  (:func:`cake_core.names.strip_det`) also reads under its old spelling, as the same
  object: ``old.rmsnorm is new.rmsnorm_det``. A module ``__getattr__`` fallback resolves
  them lazily on the canonical package and on each of its submodules (those loaded before
  the legacy import get it then; later ones from their loader, as the finder watches the
  canonical packages' imports once a legacy name is in use; ``importlib.reload`` of a
  canonical package or submodule goes through the same finder, so the fallback survives
  it). So once a legacy name is imported the old spellings also read through the
  canonical names; they are not added to ``__all__`` or ``dir()``.
* **Writing an old spelling** writes the canonical name: each canonical module given
  the fallback also gets the class :class:`LegacyAliasedModule` (a ``types.ModuleType``
  subclass: pickling, reload, lazy exports, custom ops and ``torch.compile`` are
  unaffected), whose ``__setattr__`` / ``__delattr__`` map an old spelling to its
  canonical name (only a name the module neither holds nor exports itself). So
  ``old.rmsnorm = f``, ``del old.rmsnorm`` and ``mock.patch("old.rmsnorm", f)`` act on
  ``rmsnorm_det`` and restore it; the two-target re-export module maps writes and deletes
  the same way.
* **Star imports** bind the runtime ``__all__``: the canonical names (and ``kcp`` for two
  targets), never the old spellings (for one target ``__all__`` is the canonical
  module's own, which a legacy import must not change). The stub's ``.pyi`` has the
  same ``__all__`` and binds each old spelling by assignment, so ``from old import
  rmsnorm`` type-checks; each public submodule has a ``<sub>.pyi`` re-exporting the
  canonical submodule (its old spellings are not declared there).
* **Pickles** written with an old dotted path (``cake_rmsnorm_train.plan.RMSNormPlan``)
  load: pickle imports ``cake_rmsnorm_train.plan`` (the canonical submodule) and reads the
  old spelling through the fallback.
* Importing a legacy name raises one :class:`DeprecationWarning` naming the canonical
  import(s), attributed to the importing line (also through
  ``importlib.import_module``); submodule imports through the old name add none.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

from cake_core.names import LEGACY, strip_det

__all__ = ["LegacyAliasedModule", "LegacyReExportModule", "alias_legacy_module", "legacy_aliases",
           "public_names"]


def public_names(module: types.ModuleType) -> list[str]:
    """``module.__all__`` or its globals, without the names starting with ``_``
    (``__version__`` included)."""
    names = vars(module).get("__all__")
    if names is None:
        names = [k for k in vars(module) if not k.startswith("_")]
    return [n for n in names if not n.startswith("_")]


def legacy_aliases(module: types.ModuleType) -> dict[str, str]:
    """Old spelling -> canonical public name, for every public name of ``module`` that
    contains ``_det`` or ``Det`` (``{"rmsnorm": "rmsnorm_det", ...}``)."""
    out = {}
    for n in public_names(module):
        old = strip_det(n)
        if old != n:
            out.setdefault(old, n)
    return out


#: module name -> every old spelling -> canonical name seen on it: a module without
#: ``__all__`` loses an alias while its canonical name is deleted (``mock.patch`` deletes,
#: then sets the old spelling back), and the write must still go to the canonical name.
_KNOWN: dict[str, dict[str, str]] = {}


def _canonical_name(module: types.ModuleType, name: str) -> str:
    """``name``, or the canonical name it is the old spelling of in ``module`` (a public
    ``_det`` / ``Det`` name, now or earlier; a name ``module`` itself holds or exports is
    never mapped)."""
    if name.startswith("_") or name in module.__dict__ or name in public_names(module):
        return name
    known = _KNOWN.setdefault(module.__name__, {})
    for old, new in legacy_aliases(module).items():
        known.setdefault(old, new)
    return known.get(name, name)


class LegacyAliasedModule(types.ModuleType):
    """The class a canonical module gets once a legacy name is in use: writing or deleting
    an old spelling (``new.rmsnorm = f``, ``del new.rmsnorm``, ``mock.patch`` of it) acts on
    the canonical name (``rmsnorm_det``), so both spellings stay one object. Every other
    attribute behaves as on a plain module (pickling, reload, lazy exports and
    ``torch.compile`` see a ``types.ModuleType``)."""

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(_canonical_name(self, name), value)

    def __delattr__(self, name: str) -> None:
        super().__delattr__(_canonical_name(self, name))


def _install_fallback(module: types.ModuleType) -> None:
    """Let ``module`` resolve the old spellings of its ``_det`` / ``Det`` names (lazily,
    after its own module ``__getattr__``, if any), and write or delete them as the
    canonical names (:class:`LegacyAliasedModule`)."""
    if type(module) is types.ModuleType:
        module.__class__ = LegacyAliasedModule
    _KNOWN.setdefault(module.__name__, {}).update(legacy_aliases(module))
    d = module.__dict__
    orig = d.get("__getattr__")
    if getattr(orig, "_cake_legacy", False):
        return

    def __getattr__(name: str) -> object:
        if orig is not None:
            try:
                return orig(name)
            except AttributeError:
                pass
        if name.startswith("__"):
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        target = legacy_aliases(module).get(name)
        if target is not None:
            return getattr(module, target)
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

    __getattr__._cake_legacy = True  # type: ignore[attr-defined]
    d["__getattr__"] = __getattr__


class _AliasLoader(importlib.abc.Loader):
    """Loads ``old.<dotted>`` as the already-importable ``new.<dotted>`` module itself."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec):  # noqa: D102
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        _install_fallback(module)
        return module

    def exec_module(self, module) -> None:  # noqa: D102
        # importlib set module.__spec__ to the alias spec: give the module its own back.
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Sends ``old.<dotted>`` imports to the canonical modules (first on ``sys.meta_path``,
    so the canonical package's files are never loaded a second time under the old name)."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[str, str | None]] = {}
        self.canonical: set[str] = set()

    @staticmethod
    def _watch(fullname, path):
        """A canonical module (re)loaded under its own name once a legacy name is in use
        (a submodule imported later, or ``importlib.reload`` of a package or submodule):
        found as usual (the path finder); its loader gives it the old spellings after it
        runs."""
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        except Exception:
            return None
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _install_fallback(module)

        loader.exec_module = exec_module  # this spec's own loader instance
        return spec

    def target(self, fullname: str) -> str | None:
        top, _, rest = fullname.partition(".")
        if not rest or top not in self.routes:
            return None
        local, kcp = self.routes[top]
        if kcp is not None and (rest == "kcp" or rest.startswith("kcp.")):
            return kcp + rest[len("kcp"):]
        return f"{local}.{rest}"

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102
        name = self.target(fullname)
        if name is None:
            if fullname.partition(".")[0] in self.canonical:
                return self._watch(fullname, path)
            return None
        try:
            found = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(name))


def _finder() -> _AliasFinder:
    for f in sys.meta_path:
        if type(f).__name__ == "_AliasFinder" and hasattr(f, "routes"):
            return f  # type: ignore[return-value]
    f = _AliasFinder()
    sys.meta_path.insert(0, f)
    return f


class LegacyReExportModule(types.ModuleType):
    """A legacy module that held a family's local and KCP names: reads every public name
    of both canonical modules (the same objects), ``kcp`` is the canonical KCP module, and
    attribute writes go to the canonical module that owns the name."""

    def _cake_targets(self) -> tuple[types.ModuleType, types.ModuleType]:
        local, kcp = self.__dict__["_cake_legacy_targets"]
        return importlib.import_module(local), importlib.import_module(kcp)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") or "_cake_legacy_targets" not in self.__dict__:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        local, kcp = self._cake_targets()
        if name == "kcp":
            return kcp
        for m in (local, kcp):
            try:
                return getattr(m, name)
            except AttributeError:
                pass
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __setattr__(self, name: str, value: object) -> None:
        if name.startswith("__") or name == "kcp" or "_cake_legacy_targets" not in self.__dict__:
            super().__setattr__(name, value)
            return
        local, kcp = self._cake_targets()
        for m in (local, kcp):
            aliases = legacy_aliases(m)
            if name in aliases:
                setattr(m, aliases[name], value)
                return
            if name in vars(m) or name in public_names(m):
                setattr(m, name, value)
                return
        setattr(local, name, value)

    def __delattr__(self, name: str) -> None:
        if name.startswith("__") or "_cake_legacy_targets" not in self.__dict__:
            super().__delattr__(name)
            return
        if name in self.__dict__ or name == "kcp":
            super().__delattr__(name)
            return
        local, kcp = self._cake_targets()
        for m in (local, kcp):
            aliases = legacy_aliases(m)
            if name in aliases and aliases[name] in vars(m):
                delattr(m, aliases[name])
                return
            if name in vars(m):
                delattr(m, name)
                return
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        local, kcp = self._cake_targets()
        return sorted(set(public_names(local)) | set(public_names(kcp)) | {"kcp"}
                      | {k for k in self.__dict__ if k.startswith("__")})


def _warn_importer(message: str) -> None:
    """A DeprecationWarning attributed to the code that imports the legacy stub: the first
    frame above the stub's ``__init__`` outside importlib (so ``import old`` and
    ``importlib.import_module("old")`` both point at the importing line)."""
    frame = sys._getframe(2)  # 0: here, 1: alias_legacy_module, 2: the stub's __init__
    if frame is not None:
        frame = frame.f_back
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (frame.f_code.co_filename.startswith("<frozen importlib")
                or name == "importlib" or name.startswith("importlib.")):
            break
        frame = frame.f_back
    if frame is None:  # pragma: no cover - imported from nowhere
        warnings.warn(message, DeprecationWarning, stacklevel=3)
        return
    g = frame.f_globals
    warnings.warn_explicit(message, DeprecationWarning, frame.f_code.co_filename,
                           frame.f_lineno, module=g.get("__name__", "<string>"),
                           registry=g.setdefault("__warningregistry__", {}))


def alias_legacy_module(legacy: str) -> types.ModuleType:
    """Turn the legacy stub ``legacy`` (its ``__name__``, being imported) into its
    canonical module(s); called once at the end of the stub's ``__init__``.

    One target: ``sys.modules[legacy]`` becomes the canonical module, which the ``import``
    statement then binds. Two targets: the stub becomes a :class:`LegacyReExportModule`.
    Raises one :class:`DeprecationWarning` naming the canonical import(s).

    Raises:
        KeyError: ``legacy`` is not a legacy name of :data:`cake_core.names.LEGACY`.
    """
    targets = LEGACY[legacy.replace("_", "-")]
    new = [t.import_name for t in targets]
    finder = _finder()
    _warn_importer(
        f"{legacy} is deprecated: import {' and '.join(new)} instead (distribution"
        f"{'s' if len(new) > 1 else ''} {', '.join(t.dist for t in targets)}); the old name "
        "resolves to the same objects")
    modules = [importlib.import_module(n) for n in new]
    finder.canonical.update(new)
    for key, m in list(sys.modules.items()):
        if key.partition(".")[0] in new and isinstance(m, types.ModuleType):
            _install_fallback(m)
    if len(modules) == 1:
        finder.routes[legacy] = (new[0], None)
        sys.modules[legacy] = modules[0]
        return modules[0]
    local, kcp = new
    finder.routes[legacy] = (local, kcp)
    stub = sys.modules[legacy]
    stub.__class__ = LegacyReExportModule
    stub.__dict__["_cake_legacy_targets"] = (local, kcp)
    stub.__dict__["__all__"] = sorted(set(public_names(modules[0]))
                                      | set(public_names(modules[1])) | {"kcp"})
    return stub
