"""The name registry of cake: every canonical distribution, its import name, family, mode
and kind, the legacy names that still import, and the recorded exceptions to the ``det``
rule.

This module is plain data and imports nothing outside the standard library (no torch, no
Triton, nothing else of cake_core), so tools can load it from its file alone, e.g.
``shared/names_doc.py`` which writes ``docs/training_backend_names.md`` from it.

The rules (:func:`check_name_rules`):

* a distribution name is lower case, ``-``-separated and starts with ``cake-``; its import
  name is the distribution name with ``_`` for ``-``;
* a deterministic family is ``cake-<family>-det-train`` or ``cake-<family>-det-gemm``
  (``det`` right before ``train`` / ``gemm``); a non-deterministic sibling uses
  ``nondet`` in the same place;
* a context-parallel (KCP) route adds ``-kcp`` as the last part, and only there;
* only the recorded exceptions (:data:`EXCEPTIONS`: GQA, DSA, MoK) keep a training name
  without ``det``, with the reason recorded;
* ``cake-core``, the main job ``cake-tinylm`` and the integration ``cake-transformers`` are
  not kernel families (mode ``none``).

What ``det`` promises: the same inputs, on the same hardware, with the same execution plan
and the same initial accumulation buffers give the same bits, run after run and process
after process. It does not promise identical bits across GPU architectures, across plans,
or across context-parallel partitions (a KCP route is repeatable for a fixed partition).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

MODES = ("det", "nondet", "exception", "none")
KINDS = ("local", "kcp", "job", "integration", "core")

#: families that keep names without ``det``, and why (recorded before they exist)
EXCEPTIONS: Mapping[str, str] = MappingProxyType({
    "gqa": "the backward pass (dk, dv) uses floating-point atomic reductions, whose "
           "order changes from run to run",
    "dsa": "the backward pass of the sparse attention uses floating-point atomic "
           "reductions, whose order changes from run to run",
    "mok": "full distributed determinism (across ranks and expert placement) is not "
           "established",
})


@dataclass(frozen=True)
class NameEntry:
    """One canonical distribution.

    Attributes:
        dist: distribution name, e.g. ``"cake-rmsnorm-det-train"``.
        import_name: import name, ``dist`` with ``_`` for ``-``.
        family: the family part of the name (``"rmsnorm"``, ``"lm-head-loss"``); the KCP
            route of a family shares the local one's.
        mode: ``"det"``, ``"nondet"``, ``"exception"`` (a recorded exception without
            ``det``) or ``"none"`` (cake-core and the main job).
        kind: ``"local"`` (one device), ``"kcp"`` (context parallel), ``"job"``,
            ``"integration"`` (patches another library's models onto the families) or
            ``"core"``.
        legacy: older distribution names whose import stubs resolve to this package (one
            legacy name may point at two entries: the local and the KCP package).
        exception_reason: why a ``mode="exception"`` family keeps its name without
            ``det``; ``None`` otherwise.
        summary: one line for the docs.
        planned: True while the distribution is recorded but not yet under ``packages/``
            of the main branch.
    """

    dist: str
    import_name: str
    family: str
    mode: str
    kind: str
    legacy: tuple[str, ...] = ()
    exception_reason: str | None = None
    summary: str = ""
    planned: bool = False


def _e(dist: str, family: str, mode: str, kind: str, summary: str,
       legacy: tuple[str, ...] = (), reason: str | None = None,
       planned: bool = False) -> NameEntry:
    return NameEntry(dist=dist, import_name=dist.replace("-", "_"), family=family,
                     mode=mode, kind=kind, legacy=legacy, exception_reason=reason,
                     summary=summary, planned=planned)


#: every canonical distribution, in the order the docs list them
REGISTRY: tuple[NameEntry, ...] = (
    _e("cake-core", "core", "none", "core",
       "shared contract: modes, plans, workspaces, saved sets, checks, Triton helpers"),
    _e("cake-rmsnorm-det-train", "rmsnorm", "det", "local",
       "RMSNorm forward and backward (optional fused residual)",
       legacy=("cake-rmsnorm-train",)),
    _e("cake-rmsnorm-nondet-train", "rmsnorm", "nondet", "local",
       "RMSNorm, bits not promised (the det sibling's kernels today)"),
    _e("cake-rmsnorm-silu-gate-det-train", "rmsnorm-silu-gate", "det", "local",
       "RMSNorm gated by SiLU(z) or sigmoid(z)",
       legacy=("cake-rmsnorm-silu-gate-train",)),
    _e("cake-rmsnorm-silu-gate-nondet-train", "rmsnorm-silu-gate", "nondet", "local",
       "gated RMSNorm, bits not promised (the det sibling's kernels today)"),
    _e("cake-dense-projection-det-gemm", "dense-projection", "det", "local",
       "dense projection y = x W^T + b with split-K wgrad",
       legacy=("cake-dense-projection-gemm",)),
    _e("cake-dense-projection-nondet-gemm", "dense-projection", "nondet", "local",
       "dense projection, bits not promised (runs the det sibling's kernels today)"),
    _e("cake-lm-head-loss-det-train", "lm-head-loss", "det", "local",
       "chunked fused LM head and cross entropy",
       legacy=("cake-lm-head-loss-train",)),
    _e("cake-lm-head-loss-nondet-train", "lm-head-loss", "nondet", "local",
       "chunked fused LM head and cross entropy, bits not promised (runs the det kernels "
       "today)"),
    _e("cake-moe-grouped-det-gemm", "moe-grouped", "det", "local",
       "MoE grouped GEMM over stacked expert weights",
       legacy=("cake-moe-grouped-gemm",)),
    _e("cake-moe-grouped-nondet-gemm", "moe-grouped", "nondet", "local",
       "MoE grouped GEMM, bits not promised (runs the det sibling's kernels today)"),
    _e("cake-mhc-det-train", "mhc", "det", "local",
       "manifold-constrained hyper-connections (mHC)",
       legacy=("cake-mhc-train",)),
    _e("cake-mhc-nondet-train", "mhc", "nondet", "local",
       "mHC, bits not promised (runs the det sibling's kernels today)"),
    _e("cake-causal-conv1d-det-train", "causal-conv1d", "det", "local",
       "causal depthwise conv1d (short convolution)",
       legacy=("cake-causal-conv1d-train",)),
    _e("cake-causal-conv1d-det-train-kcp", "causal-conv1d", "det", "kcp",
       "context-parallel causal conv1d (halo exchange)",
       legacy=("cake-causal-conv1d-train",)),
    _e("cake-causal-conv1d-nondet-train", "causal-conv1d", "nondet", "local",
       "causal depthwise conv1d, bits not promised (runs the det kernels today)"),
    _e("cake-gdn-det-train", "gdn", "det", "local",
       "chunked Gated DeltaNet"),
    _e("cake-gdn-det-train-kcp", "gdn", "det", "kcp",
       "context-parallel chunked Gated DeltaNet",
       legacy=("cake-gdn-train",)),
    _e("cake-gdn-nondet-train", "gdn", "nondet", "local",
       "chunked Gated DeltaNet, non-deterministic sibling (cake-gdn-det-train's kernels today)"),
    _e("cake-gdn-nondet-train-kcp", "gdn", "nondet", "kcp",
       "context-parallel chunked Gated DeltaNet, non-deterministic sibling"),
    _e("cake-kda-det-train", "kda", "det", "local",
       "chunked Kimi Delta Attention",
       legacy=("cake-kda-train",)),
    _e("cake-kda-det-train-kcp", "kda", "det", "kcp",
       "context-parallel chunked Kimi Delta Attention",
       legacy=("cake-kda-train",)),
    _e("cake-kda-nondet-train", "kda", "nondet", "local",
       "chunked Kimi Delta Attention, bits not promised (runs the det kernels today)"),
    _e("cake-kda-nondet-train-kcp", "kda", "nondet", "kcp",
       "context-parallel chunked Kimi Delta Attention, bits not promised"),
    _e("cake-gqa-det-train", "gqa", "det", "local",
       "causal / windowed grouped-query attention (flash-attn drop-in)"),
    _e("cake-gqa-train", "gqa", "exception", "local",
       "grouped-query attention with atomic dK / dV sums (flash-attn drop-in)",
       reason=EXCEPTIONS["gqa"]),
    _e("cake-dsa-train", "dsa", "exception", "local",
       "DeepSeek sparse attention", reason=EXCEPTIONS["dsa"], planned=True),
    _e("cake-mok-train", "mok", "exception", "local",
       "MoK layer", reason=EXCEPTIONS["mok"], planned=True),
    _e("cake-tinylm", "tinylm", "none", "job",
       "the main job: a tiny LM trained twice to prove identical bits"),
    _e("cake-transformers", "transformers", "none", "integration",
       "Hugging Face transformers models (Qwen3-Next, Qwen3, Llama) patched onto the det families"),
)

_BY_DIST = {e.dist: e for e in REGISTRY}
_BY_IMPORT = {e.import_name: e for e in REGISTRY}


def _legacy_map(registry: tuple[NameEntry, ...]) -> dict[str, tuple[NameEntry, ...]]:
    out: dict[str, list[NameEntry]] = {}
    for e in registry:
        for old in e.legacy:
            out.setdefault(old, []).append(e)
    # local before kcp: the local package owns every legacy submodule except ``kcp``
    return {k: tuple(sorted(v, key=lambda e: e.kind != "local")) for k, v in out.items()}


#: legacy distribution name -> its canonical target(s): one entry, or for the old modules
#: that held both routes, (local entry, KCP entry)
LEGACY: Mapping[str, tuple[NameEntry, ...]] = MappingProxyType(_legacy_map(REGISTRY))


def by_dist(name: str) -> NameEntry:
    """The canonical entry of distribution ``name`` (``KeyError`` if unknown; a legacy name
    is not canonical: see :data:`LEGACY`)."""
    return _BY_DIST[name]


def by_import(name: str) -> NameEntry:
    """The canonical entry of import name ``name`` (``KeyError`` if unknown)."""
    return _BY_IMPORT[name]


def import_name(dist: str) -> str:
    """``dist`` with ``_`` for ``-`` (the import name of any cake distribution)."""
    return dist.replace("-", "_")


def legacy_targets(name: str) -> tuple[NameEntry, ...]:
    """Canonical target(s) of a legacy distribution or import name (``KeyError`` if it is
    not a legacy name)."""
    return LEGACY[name.replace("_", "-")]


def is_known(name: str) -> bool:
    """True when ``name`` (distribution or import name) is canonical or legacy."""
    dist = name.replace("_", "-")
    return dist in _BY_DIST or dist in LEGACY


_STRIP_RE = re.compile(r"_det(?=_|$)|(?<=[A-Za-z0-9])Det(?=[A-Z_]|$)")


def strip_det(name: str) -> str:
    """The legacy spelling of a public name: ``_det`` / ``Det`` removed where it is a whole
    part of the name (``rmsnorm_det`` -> ``rmsnorm``, ``partition_det_kcp`` ->
    ``partition_kcp``, ``RMSNormDetSavedSet`` -> ``RMSNormSavedSet``,
    ``KDADetKCPGrads`` -> ``KDAKCPGrads``); other names come back unchanged
    (``determinant`` stays)."""
    return _STRIP_RE.sub("", name)


_PART_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_FAMILY_RE = re.compile(
    r"^cake-(?P<family>[a-z0-9]+(?:-[a-z0-9]+)*?)-(?P<mode>det-|nondet-)?(?P<op>train|gemm)"
    r"(?P<kcp>-kcp)?$")


def check_name_rules(entry: NameEntry) -> list[str]:
    """The naming rules ``entry`` breaks (empty list: it obeys them all).

    Checks: lower case ``cake-`` name; import name = dist with ``_``; known mode and kind;
    for kernel families ``cake-<family>-det-(train|gemm)[-kcp]`` with ``det`` right before
    ``train`` / ``gemm``, ``kcp`` only as the last part and only for kind ``kcp``, family
    equal to the name's family part; ``nondet`` likewise; names without ``det`` only for
    the recorded exceptions (GQA, DSA, MoK) with their reason; legacy names are
    ``cake-`` names that differ from the canonical one.
    """
    p: list[str] = []
    d = entry.dist
    if not (d.startswith("cake-") and _PART_RE.match(d)):
        p.append(f"{d!r}: a distribution name is lower case, '-'-separated, starts 'cake-'")
    if entry.import_name != d.replace("-", "_"):
        p.append(f"{d!r}: import name {entry.import_name!r} must be "
                 f"{d.replace('-', '_')!r} (the dist name with '_')")
    if entry.mode not in MODES:
        p.append(f"{d!r}: mode {entry.mode!r} is not one of {MODES}")
    if entry.kind not in KINDS:
        p.append(f"{d!r}: kind {entry.kind!r} is not one of {KINDS}")
    parts = d.split("-")
    if "kcp" in parts and parts[-1] != "kcp":
        p.append(f"{d!r}: 'kcp' must be the last part of the name")
    if (parts[-1] == "kcp") != (entry.kind == "kcp"):
        p.append(f"{d!r}: a name ends in '-kcp' exactly when its kind is 'kcp' "
                 f"(kind {entry.kind!r})")
    if entry.exception_reason is not None and entry.mode != "exception":
        p.append(f"{d!r}: only mode 'exception' records an exception reason")
    for old in entry.legacy:
        if not (old.startswith("cake-") and _PART_RE.match(old)) or old == d:
            p.append(f"{d!r}: legacy name {old!r} must be a different 'cake-' name")
    if entry.kind in ("core", "job", "integration"):
        if entry.mode != "none":
            p.append(f"{d!r}: cake-core and the job are not kernel families (mode 'none')")
        if "det" in parts or "nondet" in parts:
            p.append(f"{d!r}: only kernel families carry 'det'/'nondet'")
        return p
    if entry.mode == "none":
        p.append(f"{d!r}: a kernel family has mode 'det', 'nondet' or 'exception'")
        return p
    m = _FAMILY_RE.match(d)
    if "det" in parts:
        i = parts.index("det")
        if parts.count("det") > 1 or i + 1 >= len(parts) or parts[i + 1] not in ("train",
                                                                                "gemm"):
            p.append(f"{d!r}: 'det' must come once, right before 'train' or 'gemm'")
    if "nondet" in parts:
        i = parts.index("nondet")
        if i + 1 >= len(parts) or parts[i + 1] not in ("train", "gemm"):
            p.append(f"{d!r}: 'nondet' must come right before 'train' or 'gemm'")
    if m is None:
        p.append(f"{d!r}: a family name is cake-<family>-det-(train|gemm), '-kcp' last "
                 "for context-parallel routes")
        return p
    if m["family"] != entry.family:
        p.append(f"{d!r}: family {entry.family!r} differs from the name's {m['family']!r}")
    marker = (m["mode"] or "").rstrip("-")
    if entry.mode == "exception":
        if entry.family not in EXCEPTIONS:
            p.append(f"{d!r}: only {sorted(EXCEPTIONS)} may keep a name without 'det' "
                     f"(family {entry.family!r})")
        if marker:
            p.append(f"{d!r}: a recorded exception does not carry {marker!r}")
        if not entry.exception_reason:
            p.append(f"{d!r}: an exception must record its reason")
    else:
        if marker != entry.mode:
            p.append(f"{d!r}: mode {entry.mode!r} needs '{entry.mode}' right before "
                     f"'{m['op']}' in the name")
    return p


def check_registry(registry: tuple[NameEntry, ...] = REGISTRY) -> list[str]:
    """Rule violations of every entry plus the registry-wide ones: duplicate distribution
    or import names, a legacy name that is also canonical, a legacy name pointing at more
    than a family's local and KCP packages, a KCP package without its local one."""
    p = [v for e in registry for v in check_name_rules(e)]
    dists = [e.dist for e in registry]
    for d in sorted({d for d in dists if dists.count(d) > 1}):
        p.append(f"{d!r}: listed more than once")
    canon = set(dists)
    for old, targets in _legacy_map(registry).items():
        if old in canon:
            p.append(f"legacy name {old!r} is also a canonical name")
        kinds = sorted(t.kind for t in targets)
        if len({t.family for t in targets}) != 1 or kinds not in (
                ["local"], ["kcp"], ["kcp", "local"]):
            p.append(f"legacy name {old!r} must point at one package, or at one family's "
                     f"local and KCP packages (points at {[t.dist for t in targets]})")
    locals_ = {(e.family, e.mode) for e in registry if e.kind == "local"}
    for e in registry:
        if e.kind == "kcp" and (e.family, e.mode) not in locals_:
            p.append(f"{e.dist!r}: a KCP package needs its family's local package")
    return p


def canonical_rows() -> list[tuple[str, str, str, str, str, tuple[str, ...]]]:
    """(dist, import, family, mode, kind, legacy dists) for every entry, registry order."""
    return [(e.dist, e.import_name, e.family, e.mode, e.kind, e.legacy) for e in REGISTRY]


def _code(names_: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names_) if names_ else "—"


def render_names_doc() -> str:
    """The text of ``docs/training_backend_names.md`` (written by ``nox -s names_doc``;
    a test checks the committed file equals it)."""
    out: list[str] = []
    w = out.append
    w("# Training backend names")
    w("")
    w("<!-- Generated from packages/cake-core/src/cake_core/names.py by `nox -s names_doc`"
      " (shared/names_doc.py). Do not edit by hand. -->")
    w("")
    w("cake's names are its contract: `det` in the name of every deterministic training "
      "family, a final `kcp` for context-parallel routes, and the older names still "
      "importable, resolving to the very same objects. The registry "
      "(`cake_core.names.REGISTRY`) is the single source of this page, of the legacy "
      "distributions (`shared/legacy_packages.py`) and of the name checks in the tests.")
    w("")
    w("## The rules")
    w("")
    w("- A distribution name is lower case, `-`-separated and starts with `cake-`; its "
      "import name is the same with `_` for `-`.")
    w("- A deterministic family is `cake-<family>-det-train` (training kernels) or "
      "`cake-<family>-det-gemm` (GEMMs): `det` comes right before `train` / `gemm`. A "
      "non-deterministic sibling carries `nondet` in the same place.")
    w("- A context-parallel (KCP) route of a family adds `-kcp`, always as the last part "
      "(`cake-gdn-det-train-kcp`), and needs the family's local package.")
    w("- Public names inside a package carry the mode too: `rmsnorm_det`, "
      "`RMSNormDetPlan`, `chunk_gdn_det_bwd_kcp`.")
    w("- Only the recorded exceptions below keep a training name without `det`.")
    w("- `cake-core` (the shared contract), `cake-tinylm` (the main job) and "
      "`cake-transformers` (the transformers integration) are not kernel families and carry "
      "neither.")
    w("")
    w("## What `det` promises")
    w("")
    w("The same inputs, on the same hardware, with the same execution plan and the same "
      "initial accumulation buffers (e.g. the `main_grad` or `dweight_accumulator` passed "
      "in) give the same bits, run after run and process after process: no floating "
      "atomics in a det path, every reduction in a fixed order. It does **not** promise "
      "identical bits across GPU architectures or Triton versions, across execution plans, "
      "or across context-parallel partitions: a KCP route is bitwise repeatable for a "
      "fixed partition, exchange and plan, and agrees with the single-rank package within "
      "rounding otherwise. See [determinism.md](determinism.md).")
    w("")
    w("## Canonical names")
    w("")
    w("| distribution | import | family | mode | kind | legacy names | what |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    for e in REGISTRY:
        what = e.summary + (" (planned: not yet a package)" if e.planned else "")
        w(f"| `{e.dist}` | `{e.import_name}` | {e.family} | {e.mode} | {e.kind} | "
          f"{_code(e.legacy)} | {what} |")
    w("")
    w("## Legacy names")
    w("")
    w("Each legacy name is its own distribution under `packages/` holding only an import "
      "stub, a `.pyi` and tests; it depends on its canonical distribution(s) with a "
      "compatible version range (`>=X.Y,<X.(Y+1)`). Importing it raises one "
      "`DeprecationWarning` naming the new import.")
    w("")
    w("| legacy distribution | legacy import | canonical distribution(s) | canonical "
      "import(s) | how it resolves |")
    w("| --- | --- | --- | --- | --- |")
    for old, targets in sorted(LEGACY.items()):
        how = ("alias: `import old` is the canonical module" if len(targets) == 1 else
               "re-export of both; `old.kcp` is the KCP module")
        w(f"| `{old}` | `{import_name(old)}` | {_code([t.dist for t in targets])} | "
          f"{_code([t.import_name for t in targets])} | {how} |")
    w("")
    w("### How a legacy name resolves (`cake_core.legacy`)")
    w("")
    w("- **One canonical target** (every legacy name but two): `import old` binds the "
      "canonical module object itself (the stub puts it in `sys.modules` under the old "
      "name) and `import old.sub` binds `new.sub` itself (a meta path finder sends every "
      "`old.<dotted>` import to `new.<dotted>`, never loading a second copy). So "
      "`old is new`, `old.sub is new.sub`, `old.Cls is new.Cls`, and setting a module "
      "attribute through one name is seen through the other.")
    w("- **Two canonical targets** (`cake_kda_train`, `cake_causal_conv1d_train`: the old "
      "modules held the local and the KCP names): one module cannot be two, so `old` is a "
      "re-export module. Every public name of both canonical modules reads as the same "
      "object; `old.kcp` (and `import old.kcp`) is the canonical KCP module and every "
      "other `old.<sub>` is the local module's submodule; setting `old.X` sets `X` on the "
      "canonical module that owns it (the local one for a new name), so module state "
      "lives in the canonical modules. Strict identity is impossible here only for the "
      "top module: `old is not new`, and `old.__name__`, `old.__version__` (the legacy "
      "distribution's) and `dir(old)` are the stub's.")
    w("- **Old spellings**: every public name containing `_det` or `Det` also reads "
      "without it, as the same object: `rmsnorm_det` → `rmsnorm`, `partition_det_kcp` → "
      "`partition_kcp`, `chunk_gdn_det_bwd_kcp` → `chunk_gdn_bwd_kcp`, "
      "`RMSNormDetSavedSet` → `RMSNormSavedSet` (`cake_core.names.strip_det`). They are "
      "resolved lazily by a module `__getattr__` fallback on the canonical package and "
      "each of its submodules (so `old.plan.RMSNormPlan` works too), installed at the "
      "legacy import and, for submodules loaded later or reloaded (`importlib.reload`), "
      "by their loader. After a legacy import they also read through the canonical "
      "names; they are not in `__all__` or `dir()`, so `from old import *` binds the "
      "canonical names only (for one target `__all__` is the canonical module's own).")
    w("- **Writing an old spelling** writes the canonical name: `old.rmsnorm = f`, "
      "`del old.rmsnorm` and `mock.patch(\"old.rmsnorm\", f)` act on `rmsnorm_det` (and "
      "restore it). The canonical modules get a `types.ModuleType` subclass "
      "(`cake_core.legacy.LegacyAliasedModule`) at the legacy import for this; the "
      "two-target re-export module maps writes and deletes the same way.")
    w("- **Pickles** written with an old dotted path (`cake_rmsnorm_train.plan."
      "RMSNormPlan`, `cake_kda_train.kcp.saved.KDAKCPSavedSet`) load as the canonical "
      "classes.")
    w("- **Type checkers** read the stub's `__init__.pyi` (with `py.typed`), which "
      "re-exports every canonical public name (and `kcp` for the two-target stubs), binds "
      "every old spelling to its canonical name and has the runtime `__all__`; each "
      "public submodule has a `<sub>.pyi` re-exporting the canonical submodule.")
    w("")
    w("## Exceptions to the `det` rule")
    w("")
    w("These families keep names without `det` and may not claim the det contract. They "
      "are recorded before they exist; the distribution names are the ones they will "
      "take.")
    w("")
    w("| family | distribution | import | why no `det` |")
    w("| --- | --- | --- | --- |")
    for e in REGISTRY:
        if e.mode == "exception":
            w(f"| {e.family} | `{e.dist}` | `{e.import_name}` | {e.exception_reason} |")
    w("")
    w("## Adding or renaming a package")
    w("")
    w("1. Record it in `cake_core.names.REGISTRY` (a renamed package lists its old "
      "distribution name in `legacy`); `packages/cake-core/tests/test_core_names.py` fails "
      "while a folder under `packages/` is missing from the registry or breaks a rule.")
    w("2. `nox -s names_doc` rewrites this page.")
    w("3. For a legacy name: `nox -s legacy_packages -- <legacy-dist>` writes its "
      "distribution, then add its id to `LEGACY` in `noxfile.py` "
      "(`nox -s \"family(legacy_<id>)\"` runs its tests).")
    w("")
    return "\n".join(out)
