"""Know before you launch: the answer type of every family's support query and the helpers
its size queries share.

Every family exports, with its entry's own arguments:

* ``is_supported(...)`` -> :class:`Support`: whether the entry serves the call (shapes,
  dtypes, device, options); ``Support(False, reason)`` carries the ``ValueError`` message the
  entry would raise. It runs the entry's checks only: no allocation, launch or collective.
* ``workspace_bytes(...)``: the bytes ``<Family>Workspace.for_plan(...)`` allocates, computed
  without allocating.
* ``saved_bytes(...)``: the bytes the forward allocates and its saved set keeps for the
  backward (the forward's outputs the backward reads count, the caller's inputs do not),
  computed without allocating.

(nondet packages name them ``is_supported_nondet``, ``workspace_bytes_nondet``,
``saved_bytes_nondet``; ``-kcp`` packages add ``comm_bytes(ctx, ...)``.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch

__all__ = ["Support", "nbytes_of", "owned_nbytes", "support_of"]


class Support(NamedTuple):
    """The answer of an ``is_supported`` query: ``ok``, and when not, ``reason`` (the
    message of the ``ValueError`` the entry raises). True in a boolean context when ``ok``.

    Example::

        s = is_supported(x, weight)
        if not s:
            print("falls back:", s.reason)
    """

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def support_of(check: Callable[[], object]) -> Support:
    """``Support(True)`` when ``check()`` returns, ``Support(False, message)`` when it raises
    ``ValueError``. ``check`` must be an entry's checks only (no allocation, launch or
    collective); other exceptions propagate."""
    try:
        check()
    except ValueError as e:
        return Support(False, str(e))
    return Support(True, "")


def nbytes_of(shapes: Iterable[tuple[Iterable[int], torch.dtype]]) -> int:
    """Bytes of tensors of these ``(shape, dtype)`` (what allocating them takes)."""
    total = 0
    for shape, dtype in shapes:
        n = 1
        for s in shape:
            n *= int(s)
        total += n * torch.empty((), dtype=dtype).element_size()
    return total


def owned_nbytes(tensors: Iterable[torch.Tensor | None],
                 exclude: Iterable[torch.Tensor | None] = ()) -> int:
    """Bytes of the distinct storages of ``tensors`` that no tensor of ``exclude`` shares
    (e.g. a saved set's tensors less the caller's inputs): what the tests of
    ``saved_bytes`` compare with."""
    def key(t):
        s = t.untyped_storage()
        return (t.device, s.data_ptr(), s.nbytes())

    skip = {key(t) for t in exclude if isinstance(t, torch.Tensor)}
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            k = key(t)
            if k not in skip:
                seen[k] = k[2]
    return sum(seen.values())
