"""The naming rules of cake distributions, as data, and a check of one name.

The registry of every canonical and legacy name, with the full rule check of an entry, is
:mod:`cake_core.names`; this module keeps the name-only check families' tests use.
"""

from __future__ import annotations

import re

from cake_core.names import EXCEPTIONS

#: Families whose backward uses floating atomics or whose distributed determinism is
#: unproven: they keep names without ``det`` (and may not claim the det contract).
NAME_EXCEPTIONS: dict[str, str] = dict(EXCEPTIONS)

#: Suffix kinds: training families end in ``-det-train``, GEMM families in ``-det-gemm``,
#: context-parallel routes add ``-kcp``. Non-deterministic siblings carry ``nondet``.
RULES: dict[str, str] = {
    "prefix": "cake-",
    "det_before": "train|gemm",
    "kcp_suffix": "-kcp",
    "nondet_marker": "nondet",
}

#: Packages that are not kernel families (no det/train rule applies).
NON_FAMILY: frozenset[str] = frozenset({"cake-core", "cake-tinylm", "cake-transformers"})

_FAMILY_RE = re.compile(
    r"^cake-(?P<family>[a-z0-9]+(?:-[a-z0-9]+)*?)-(?P<mode>det|nondet)-(?P<kind>train|gemm)"
    r"(?P<kcp>-kcp)?$"
)


def check_name(name: str) -> list[str]:
    """Return the naming problems of distribution ``name`` (empty list: the name is right).

    Rules: lower-case, starts with ``cake-``; a family name carries ``det`` (or ``nondet``)
    right before ``train`` or ``gemm``; context-parallel routes end in ``-kcp``; the
    recorded exceptions (:data:`NAME_EXCEPTIONS`) keep names without ``det``.
    """
    problems: list[str] = []
    if name != name.lower() or "_" in name:
        problems.append("use lower case and '-' (import names swap '-' for '_')")
    if not name.startswith("cake-"):
        problems.append("must start with 'cake-'")
        return problems
    if name in NON_FAMILY:
        return problems
    stem = name[len("cake-"):].split("-")[0]
    if stem in NAME_EXCEPTIONS:
        if "-det-" in name or name.endswith("-det"):
            problems.append(f"'{stem}' is a recorded exception and must not carry 'det' "
                            f"({NAME_EXCEPTIONS[stem]})")
        return problems
    if not _FAMILY_RE.match(name):
        problems.append(
            "a family name is cake-<family>-det-train or cake-<family>-det-gemm "
            "(nondet siblings: -nondet-), with '-kcp' at the end for context-parallel routes"
        )
    return problems


def parse_name(name: str) -> dict[str, str | bool] | None:
    """Split a canonical family name into family, mode, kind (``local``/``kcp``), op kind."""
    m = _FAMILY_RE.match(name)
    if not m:
        return None
    return {"family": m["family"], "mode": m["mode"], "op": m["kind"],
            "kind": "kcp" if m["kcp"] else "local"}
