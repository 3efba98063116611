"""The saved set and workspace bases, and the fragment groups, of the state-exchange
``-kcp`` families (GDN, KDA).

A delta-rule KCP forward runs the single-rank package on groups of a rank's fragments and
exchanges fp32 state summaries between ranks (``docs/kcp.md``). What it keeps and the
scratch it needs have the same shape in every such family; only the single-rank types
differ. Each family subclasses these bases with its own names (``GDNDetKCPSavedSet``,
``GDNDetKCPWorkspace``, ...), its own ``tensor_names`` and docstrings, and sets the class
attributes that name its single-rank types; a det backward still refuses another family's
(or the single-rank package's) types by type and mode. :class:`LocalGroup` /
:func:`fragment_groups`: which of a rank's fragments each single-rank call runs.

Plain Python and torch: importing this module imports no Triton.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import torch

from cake_core.checks import check_float_dtype, check_int
from cake_core.kcp import Context, has_middle_fragments
from cake_core.mode import Mode
from cake_core.plan import Plan
from cake_core.saved import SavedSet
from cake_core.support import nbytes_of
from cake_core.workspace import Workspace

__all__ = ["FragmentGroups", "KCPStateSavedSet", "KCPStateWorkspace", "LocalGroup",
           "fragment_groups", "route_runs", "route_saved_shapes"]


class KCPStateSavedSet(SavedSet):
    """A saved set with nested single-rank saved sets: ``local``, one ``local_type`` set
    per single-rank call of the forward, in ``meta["groups"]`` order (``meta["local_meta"]``
    holds their metadata). :meth:`tensors` lists the own tensors (``tensor_names``), then
    each nested set's, so autograd saves all of them; :meth:`from_tensors` rebuilds the
    nesting (the nested sets in the outer set's mode).

    Subclasses set ``tensor_names`` and ``local_type`` (the single-rank package's saved set
    class).

    Raises:
        ValueError: (construction) as many nested sets as ``meta["groups"]`` entries is
            required; (:meth:`from_tensors`) a tensor count that does not match
            ``local_meta``.
    """

    local_type: ClassVar[type[SavedSet]] = SavedSet

    def __init__(self, mode: Mode, tensors: dict[str, torch.Tensor | None],
                 meta: dict[str, Any] | None = None, local: tuple[SavedSet, ...] = ()):
        super().__init__(mode, tensors, meta)
        self.local = tuple(local)
        self.meta["local_meta"] = tuple(s.meta for s in self.local)
        if len(self.meta.get("groups", ())) != len(self.local):
            raise ValueError(f"{type(self).__name__}: {len(self.local)} nested saved sets for "
                             f"{len(self.meta.get('groups', ()))} groups")

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """Own tensors (``tensor_names`` order), then each nested set's ``tensors()``."""
        return super().tensors() + tuple(t for s in self.local for t in s.tensors())

    @classmethod
    def from_tensors(cls, mode: Mode, tensors: tuple[torch.Tensor | None, ...],
                     meta: dict[str, Any] | None = None):
        """Rebuild from ``ctx.saved_tensors`` (the order of :meth:`tensors`) and ``meta``."""
        meta = dict(meta or {})
        n, per = len(cls.tensor_names), len(cls.local_type.tensor_names)
        metas = meta.get("local_meta", ())
        if len(tensors) != n + per * len(metas):
            raise ValueError(f"{cls.__name__}: expected {n + per * len(metas)} tensors, got "
                             f"{len(tensors)}")
        local = tuple(cls.local_type.from_tensors(mode, tuple(tensors[n + i * per:
                                                                      n + (i + 1) * per]), m)
                      for i, m in enumerate(metas))
        return cls(mode, dict(zip(cls.tensor_names, tensors[:n], strict=True)), meta, local)


class KCPStateWorkspace(Workspace):
    """Scratch of a state-exchange KCP forward and backward on one rank, for one plan and
    context.

    Buffers (fp32, all-gather exchange; empty ``[0, ...]`` with the ring or when nothing
    crosses): ``fwd_send`` ``[S_f, HV, K, Wd]`` and ``fwd_recv`` ``[W * S_f, HV, K, Wd]``,
    ``bwd_send`` / ``bwd_recv`` the same with ``S_b``; ``S_f`` / ``S_b`` the context's slots
    per rank, ``Wd = K + V`` when the partition has middle fragments
    (:func:`cake_core.kcp.has_middle_fragments`), else ``V``. Nested: ``local``, a
    ``local_type`` workspace for the plan and the rank's tokens and fragments, and
    ``local_p``, one for the transition run's plan (``transition_plan``) when that differs,
    else ``None``. Attributes ``partition_key``, ``rank``, ``exchange``, ``num_v_heads``,
    ``dtype`` record what it was made for (:meth:`check_for`). Build with
    :meth:`for_context`.

    Subclasses set ``plan_type`` (the single-rank plan class, with ``head_k_dim`` /
    ``head_v_dim``), ``local_type`` (the single-rank workspace class, with ``for_plan(plan,
    device, *, num_v_heads, max_tokens, max_seqs, dtype)``) and ``transition_plan``
    (``staticmethod``: ``(plan, dtype, device) -> plan`` of the ``(K, K)`` run).
    """

    plan_type: ClassVar[type[Plan]] = Plan
    local_type: ClassVar[Any] = None
    transition_plan: ClassVar[Callable[[Any, torch.dtype, torch.device], Any]]

    @classmethod
    def layout(cls, plan: Plan, ctx: Context, *, num_v_heads: int,
               dtype: torch.dtype = torch.float32):
        """What :meth:`for_context` allocates, without allocating: ``(buffers, local)``,
        ``buffers`` ``{name: (shape, torch.float32)}`` and ``local`` the nested workspaces
        as ``(name, plan, for_plan keyword arguments)`` (``local``, then ``local_p`` when
        made). Raises as :meth:`for_context`."""
        if not isinstance(plan, cls.plan_type):
            raise ValueError(f"plan: expected {cls.plan_type.__name__}, got "
                             f"{type(plan).__name__}")
        if not isinstance(ctx, Context):
            raise ValueError(f"ctx: expected a cake_core.kcp.Context, got {type(ctx).__name__}")
        HV = check_int(num_v_heads, "num_v_heads", 1)
        check_float_dtype(dtype)
        K, V = plan.head_k_dim, plan.head_v_dim
        f32 = torch.float32
        width = K + V if has_middle_fragments(ctx.partition) else V
        W = ctx.world_size
        ag = ctx.allgather_plan
        sf = ag.fwd_slots_per_rank if ctx.exchange == "allgather" else 0
        sb = ag.bwd_slots_per_rank if ctx.exchange == "allgather" else 0
        bufs = {"fwd_send": ((sf, HV, K, width), f32),
                "fwd_recv": ((W * sf, HV, K, width), f32),
                "bwd_send": ((sb, HV, K, width), f32),
                "bwd_recv": ((W * sb, HV, K, width), f32)}
        local = [("local", plan, {"num_v_heads": HV, "max_tokens": ctx.num_tokens,
                                  "max_seqs": max(1, ctx.num_fragments), "dtype": dtype})]
        pp = cls.transition_plan(plan, dtype, ctx.device)
        middle = [f for f in ctx.fragments if f.has_prev and f.has_next]
        if ctx.exchange == "allgather" and middle and pp is not plan:
            local.append(("local_p", pp, {"num_v_heads": HV,
                                          "max_tokens": sum(f.length for f in middle),
                                          "max_seqs": len(middle), "dtype": dtype}))
        return bufs, local

    @classmethod
    def layout_nbytes(cls, plan: Plan, ctx: Context, *, num_v_heads: int,
                      dtype: torch.dtype = torch.float32,
                      local_nbytes: Callable[..., int]) -> int:
        """The bytes :meth:`for_context` allocates, without allocating: the buffers of
        :meth:`layout` plus ``local_nbytes(plan, **for_plan_kwargs)`` of each nested
        workspace (the single-rank package's ``workspace_bytes``)."""
        bufs, local = cls.layout(plan, ctx, num_v_heads=num_v_heads, dtype=dtype)
        return nbytes_of(bufs.values()) + sum(local_nbytes(p, **kw) for _, p, kw in local)

    @classmethod
    def for_context(cls, plan: Plan, ctx: Context, *, num_v_heads: int,
                    dtype: torch.dtype = torch.float32):
        """Allocate for calls on ``ctx`` with ``plan`` (K, V), ``num_v_heads`` value heads and
        inputs (q, k, v) of ``dtype`` (:meth:`layout` without allocating).

        Raises:
            ValueError: a plan of another type, ``ctx`` not a Context, ``num_v_heads`` not an
                int >= 1, ``dtype`` not fp32/bf16/fp16.
        """
        bufs, local = cls.layout(plan, ctx, num_v_heads=num_v_heads, dtype=dtype)
        dev = ctx.device
        ws = cls(plan, dev, {name: torch.empty(shape, dtype=dt, device=dev)
                             for name, (shape, dt) in bufs.items()})
        ws.local_p = None
        for name, p, kw in local:
            setattr(ws, name, cls.local_type.for_plan(p, dev, **kw))
        ws.partition_key, ws.rank, ws.exchange = ctx.partition.key, ctx.rank, ctx.exchange
        ws.num_v_heads, ws.dtype = local[0][2]["num_v_heads"], dtype
        return ws

    def check_for(self, plan: Plan, ctx: Context, num_v_heads: int,
                  dtype: torch.dtype, *, name: str = "workspace") -> None:
        """``ValueError`` unless made (:meth:`for_context`) for ``plan`` on ``ctx``'s device,
        partition, rank and exchange, with ``num_v_heads`` and inputs of ``dtype``."""
        self.check(plan, ctx.device, name=name)
        got = (self.partition_key, self.rank, self.exchange, self.num_v_heads, self.dtype)
        want = (ctx.partition.key, ctx.rank, ctx.exchange, num_v_heads, dtype)
        if got != want:
            raise ValueError(f"{name}: made for (partition, rank, exchange, HV, dtype) = {got}, "
                             f"the call has {want}; build it with "
                             f"{type(self).__name__}.for_context(plan, ctx, num_v_heads=HV, "
                             "dtype=q.dtype)")


# ----------------------------------------------------------------------------- groups


@dataclasses.dataclass(frozen=True)
class LocalGroup:
    """Some of this rank's fragments, run by one single-rank call (each fragment its own
    sequence).

    ``kind`` names the role (``"all"``, ``"first"``, ``"middle"``, ``"alone"``, ``"last"``
    for the all-gather; ``"pos<c>"`` for the ring's chain position ``c``); ``frags`` the
    local fragment indices in local order; ``runs`` their tokens as ``(local_offset,
    length)`` (adjacent fragments merged); ``cu`` the int64 CPU offsets ``[len(frags) + 1]``
    of the group's own token array; ``num_tokens`` its size; ``whole`` whether it is every
    fragment of the rank (its tensors are then the rank's own, no copy).
    """

    kind: str
    frags: tuple[int, ...]
    runs: tuple[tuple[int, int], ...]
    cu: torch.Tensor
    num_tokens: int
    whole: bool

    @classmethod
    def of(cls, ctx: Context, kind: str, frags: Sequence[int]) -> LocalGroup:
        frags = tuple(sorted(frags))
        runs: list[tuple[int, int]] = []
        cu = [0]
        for i in frags:
            f = ctx.fragments[i]
            if runs and runs[-1][0] + runs[-1][1] == f.local_offset:
                runs[-1] = (runs[-1][0], runs[-1][1] + f.length)
            else:
                runs.append((f.local_offset, f.length))
            cu.append(cu[-1] + f.length)
        return cls(kind, frags, tuple(runs), torch.tensor(cu, dtype=torch.int64), cu[-1],
                   len(frags) == ctx.num_fragments)

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """The group's tokens of a rank-local ``[1, T_r, ...]`` tensor in group order: ``x``
        itself for the whole rank, a view for one run, else a copy."""
        if self.whole:
            return x
        if len(self.runs) == 1:
            a, n = self.runs[0]
            return x[:, a:a + n]
        return torch.cat([x[:, a:a + n] for a, n in self.runs], dim=1)

    def put(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy a group-ordered ``[1, n, ...]`` tensor into its tokens of ``dst``."""
        off = 0
        for a, n in self.runs:
            dst[:, a:a + n].copy_(src[:, off:off + n])
            off += n


class FragmentGroups(NamedTuple):
    """This rank's fragment groups for ``ctx`` (host data, cached per context): ``all``
    without a crossing document; else the all-gather route's ``first`` / ``middle`` /
    ``alone`` / ``last`` and the ring's ``by_pos``; ``None`` for an empty group."""

    all: LocalGroup | None        # no crossing document: every fragment, one call
    first: LocalGroup | None      # all-gather: sends, does not receive
    middle: LocalGroup | None     # all-gather: receives and sends
    alone: LocalGroup | None      # all-gather: neither (runs while the all-gather is in flight)
    last: LocalGroup | None       # all-gather: receives, does not send
    by_pos: dict[int, LocalGroup]  # ring: fragments by chain position
    recv_index: dict[int, int]    # fragment -> index in ctx.recv
    send_index: dict[int, int]    # fragment -> index in ctx.send
    cu: dict[str, torch.Tensor]   # group kind -> its offsets on ctx.device


_GROUPS: weakref.WeakKeyDictionary[Context, FragmentGroups] = weakref.WeakKeyDictionary()


def fragment_groups(ctx: Context) -> FragmentGroups:
    """This rank's :class:`FragmentGroups` for ``ctx`` (made once per context)."""
    got = _GROUPS.get(ctx)
    if got is not None:
        return got

    def grp(kind, frags):
        return LocalGroup.of(ctx, kind, frags) if frags else None

    n = ctx.num_fragments
    recv = {e.fragment for e in ctx.recv}
    send = {e.fragment for e in ctx.send}
    everything = grp("all", range(n)) if not ctx.crosses else None
    first = middle = alone = last = None
    by_pos: dict[int, LocalGroup] = {}
    if ctx.crosses:
        first = grp("first", [i for i in range(n) if i in send and i not in recv])
        middle = grp("middle", [i for i in range(n) if i in send and i in recv])
        alone = grp("alone", [i for i in range(n) if i not in send and i not in recv])
        last = grp("last", [i for i in range(n) if i in recv and i not in send])
        for c in sorted({f.chain_pos for f in ctx.fragments}):
            by_pos[c] = LocalGroup.of(ctx, f"pos{c}", [i for i, f in enumerate(ctx.fragments)
                                                       if f.chain_pos == c])
    cu = {}
    for g in (everything, first, middle, alone, last, *by_pos.values()):
        if g is not None:
            cu[g.kind] = ctx.cu_seqlens if g.whole else g.cu.to(ctx.device)
    got = FragmentGroups(everything, first, middle, alone, last, by_pos,
                  {e.fragment: i for i, e in enumerate(ctx.recv)},
                  {e.fragment: i for i, e in enumerate(ctx.send)}, cu)
    _GROUPS[ctx] = got
    return got


def route_runs(ctx: Context) -> tuple[list[tuple[LocalGroup, bool]], int]:
    """The single-rank forward calls whose saved sets a KCP forward on ``ctx`` keeps, from
    host data only (no device tables; what the families' ``saved_bytes`` count):
    ``(runs, n_middle)``, ``runs`` the ``(group, starts from a received state)`` pairs in
    :mod:`cake_core.kcp_route`'s order (one ``"all"`` group without a crossing document;
    the all-gather's ``first``, ``alone``, ``middle``, ``last``; the ring's chain
    positions) and ``n_middle`` the middle fragments whose transitions ``P`` the
    all-gather keeps (0 on the ring)."""
    n = ctx.num_fragments
    if not ctx.crosses:
        return ([(LocalGroup.of(ctx, "all", range(n)), False)] if n else []), 0
    recv = {e.fragment for e in ctx.recv}
    send = {e.fragment for e in ctx.send}
    if ctx.exchange == "ring":
        pos = sorted({f.chain_pos for f in ctx.fragments})
        return [(LocalGroup.of(ctx, f"pos{c}", [i for i, f in enumerate(ctx.fragments)
                                                 if f.chain_pos == c]), c > 0)
                for c in pos], 0
    kinds = (("first", lambda i: i in send and i not in recv, False),
             ("alone", lambda i: i not in send and i not in recv, False),
             ("middle", lambda i: i in send and i in recv, True),
             ("last", lambda i: i in recv and i not in send, True))
    runs = []
    for kind, pick, started in kinds:
        frags = [i for i in range(n) if pick(i)]
        if frags:
            runs.append((LocalGroup.of(ctx, kind, frags), started))
    n_mid = sum(1 for i in range(n) if i in send and i in recv)
    return runs, n_mid


def route_saved_shapes(ctx: Context, inputs: Sequence[torch.Tensor], HV: int, K: int, V: int,
                       per_run: Callable[[LocalGroup], list]) -> list:
    """``(shape, dtype)`` of what a state-exchange KCP forward on ``ctx`` allocates and its
    saved set keeps, beyond the caller's tensors and the per-context offset tables:
    ``per_run(group)`` for each kept single-rank call (:func:`route_runs`: the family's own
    intermediates), the received start states (fp32 ``[n_g, HV, K, V]``), the copies of
    ``inputs`` (rank-local ``[1, T_r, ...]``) a group of non-adjacent fragments gathers,
    a contiguous copy of a non-contiguous input that a group keeps a view of, and the
    all-gather's transitions ``P`` (fp32 ``[n_middle, HV, K, K]``)."""
    f32 = torch.float32
    runs, n_mid = route_runs(ctx)
    shapes: list = []
    keeps_view = False
    for grp, started in runs:
        shapes += per_run(grp)
        if started:
            shapes.append(((len(grp.frags), HV, K, V), f32))
        if grp.whole or len(grp.runs) == 1:
            keeps_view = True
        else:  # the group's tokens gathered into new tensors
            shapes += [((1, grp.num_tokens, *t.shape[2:]), t.dtype) for t in inputs]
    if keeps_view:
        shapes += [(tuple(t.shape), t.dtype) for t in inputs if not t.is_contiguous()]
    if n_mid:
        shapes.append(((n_mid, HV, K, K), f32))
    return shapes
