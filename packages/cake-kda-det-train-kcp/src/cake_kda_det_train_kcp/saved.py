"""KDADetKCPSavedSet and KDADetKCPWorkspace: this package's own det types (the KCP
backward refuses the single-rank package's types, and any non-det type, by type and mode)."""

from __future__ import annotations

from typing import Any

import torch
from cake_core import Mode, SavedSet, Workspace, check_float_dtype, check_int
from cake_core.kcp import Context
from cake_kda_det_train import KDADetPlan, KDADetSavedSet, KDADetWorkspace, make_plan

from cake_kda_det_train_kcp.context import has_middle_fragments

__all__ = ["KDADetKCPSavedSet", "KDADetKCPWorkspace", "p_plan"]


class KDADetKCPSavedSet(SavedSet):
    """What :func:`~cake_kda_det_train_kcp.chunk_kda_det_fwd_kcp` keeps for its backward.

    Own tensors:
        q, k, v, g, beta: the rank-local inputs as given (``[1, T_r, ...]``; g the raw
            gate with ``use_gate_in_kernel``, beta pre-sigmoid with
            ``use_beta_sigmoid_in_kernel``).
        A_log, dt_bias: as given with ``use_gate_in_kernel`` (``[HV]``, ``[HV * K]``; their
            dtypes are the dtypes of dA_log / ddt_bias), else ``None``.
        P: fp32 ``[n_mid, HV, K, K]``, the state transition of each of this rank's middle
            fragments (fragments that both receive and send a state; all-gather exchange
            only), in local order; ``None`` when there is none.
    Nested: ``local``, one :class:`cake_kda_det_train.KDADetSavedSet` per single-rank call
    of the forward (a group of this rank's fragments), in ``meta["groups"]`` order; their
    ``A_log`` / ``dt_bias`` are fp32 copies (the local backward then returns fp32 sums,
    which this package adds across calls and ranks before one cast). :meth:`tensors` lists
    the own tensors, then each nested set's, so autograd saves all of them
    (:meth:`from_tensors` rebuilds the nesting).

    Meta: ``partition_key``, ``rank``, ``world_size``, ``exchange``, ``num_tokens`` (the
    context the forward ran on: the backward refuses another), ``groups`` (``(kind,
    fragment indices)`` per nested set), ``local_meta`` (their metadata), ``plan`` (the
    local KDADetPlan), ``scale``, ``use_qk_l2norm``, ``use_gate_in_kernel``,
    ``lower_bound``, ``use_beta_sigmoid_in_kernel``, ``allow_neg_eigval``, ``safe_gate``,
    ``reduce_gate_param_grads``, ``has_middle``.
    """

    tensor_names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "P")
    format_version = 1

    def __init__(self, mode: Mode, tensors: dict[str, torch.Tensor | None],
                 meta: dict[str, Any] | None = None,
                 local: tuple[KDADetSavedSet, ...] = ()):
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
                     meta: dict[str, Any] | None = None) -> KDADetKCPSavedSet:
        """Rebuild from ``ctx.saved_tensors`` (the order of :meth:`tensors`) and ``meta``."""
        meta = dict(meta or {})
        n, per = len(cls.tensor_names), len(KDADetSavedSet.tensor_names)
        metas = meta.get("local_meta", ())
        if len(tensors) != n + per * len(metas):
            raise ValueError(f"{cls.__name__}: expected {n + per * len(metas)} tensors, got "
                             f"{len(tensors)}")
        local = tuple(KDADetSavedSet.from_tensors(Mode.DET, tuple(tensors[n + i * per:
                                                                          n + (i + 1) * per]), m)
                      for i, m in enumerate(metas))
        return cls(mode, dict(zip(cls.tensor_names, tensors[:n], strict=True)), meta, local)


def p_plan(plan: KDADetPlan, dtype: torch.dtype, device: torch.device) -> KDADetPlan:
    """The plan of the transition run (value width ``K``): ``plan`` itself when it is for
    ``(K, K)``, else ``make_plan(K, K, dtype, device)``."""
    K = plan.head_k_dim
    return plan if plan.head_v_dim == K else make_plan(K, K, dtype, device)


class KDADetKCPWorkspace(Workspace):
    """Scratch of the KCP forward and backward on one rank, for one plan and context.

    Buffers (fp32, all-gather exchange; empty ``[0, ...]`` with the ring or when nothing
    crosses): ``fwd_send`` ``[S_f, HV, K, Wd]`` and ``fwd_recv`` ``[W * S_f, HV, K, Wd]``,
    ``bwd_send`` / ``bwd_recv`` the same with ``S_b``; ``S_f`` / ``S_b`` the context's slots
    per rank, ``Wd = K + V`` when the partition has middle fragments, else ``V``. Nested:
    ``local``, a :class:`cake_kda_det_train.KDADetWorkspace` for the plan and the rank's
    tokens and fragments (every single-rank call of the route uses it), and ``local_p``, one
    for the transition run's plan when that differs (``K != V``), else ``None``. Contents are
    overwritten by every call (nothing carries over), so one workspace serves every layer
    that shares the context, plan, ``HV`` and input dtype (not two calls at once). Build with
    :meth:`for_context`.
    """

    @classmethod
    def for_context(cls, plan: KDADetPlan, ctx: Context, *, num_v_heads: int,
                    dtype: torch.dtype = torch.float32) -> KDADetKCPWorkspace:
        """Allocate for calls on ``ctx`` with ``plan`` (K, V), ``num_v_heads`` value heads and
        inputs (q, k, v) of ``dtype``.

        Raises:
            ValueError: a plan of another type, ``ctx`` not a Context, ``num_v_heads`` not an
                int >= 1, ``dtype`` not fp32/bf16/fp16.
        """
        if not isinstance(plan, KDADetPlan):
            raise ValueError(f"plan: expected KDADetPlan, got {type(plan).__name__}")
        if not isinstance(ctx, Context):
            raise ValueError(f"ctx: expected a cake_core.kcp.Context, got {type(ctx).__name__}")
        HV = check_int(num_v_heads, "num_v_heads", 1)
        check_float_dtype(dtype)
        K, V = plan.head_k_dim, plan.head_v_dim
        dev = ctx.device
        f32 = torch.float32
        width = K + V if has_middle_fragments(ctx.partition) else V
        W = ctx.world_size
        ag = ctx.allgather_plan
        sf = ag.fwd_slots_per_rank if ctx.exchange == "allgather" else 0
        sb = ag.bwd_slots_per_rank if ctx.exchange == "allgather" else 0
        bufs = {"fwd_send": torch.empty((sf, HV, K, width), dtype=f32, device=dev),
                "fwd_recv": torch.empty((W * sf, HV, K, width), dtype=f32, device=dev),
                "bwd_send": torch.empty((sb, HV, K, width), dtype=f32, device=dev),
                "bwd_recv": torch.empty((W * sb, HV, K, width), dtype=f32, device=dev)}
        ws = cls(plan, dev, bufs)
        ws.local = KDADetWorkspace.for_plan(plan, dev, num_v_heads=HV,
                                            max_tokens=ctx.num_tokens,
                                            max_seqs=max(1, ctx.num_fragments), dtype=dtype)
        ws.local_p = None
        pp = p_plan(plan, dtype, dev)
        middle = [f for f in ctx.fragments if f.has_prev and f.has_next]
        if ctx.exchange == "allgather" and middle and pp is not plan:
            ws.local_p = KDADetWorkspace.for_plan(pp, dev, num_v_heads=HV,
                                                  max_tokens=sum(f.length for f in middle),
                                                  max_seqs=len(middle), dtype=dtype)
        ws.partition_key, ws.rank, ws.exchange = ctx.partition.key, ctx.rank, ctx.exchange
        ws.num_v_heads, ws.dtype = HV, dtype
        return ws

    def check_for(self, plan: KDADetPlan, ctx: Context, num_v_heads: int,
                  dtype: torch.dtype, *, name: str = "workspace") -> None:
        """``ValueError`` unless made (:meth:`for_context`) for ``plan`` on ``ctx``'s device,
        partition, rank and exchange, with ``num_v_heads`` and inputs of ``dtype``."""
        self.check(plan, ctx.device, name=name)
        got = (self.partition_key, self.rank, self.exchange, self.num_v_heads, self.dtype)
        want = (ctx.partition.key, ctx.rank, ctx.exchange, num_v_heads, dtype)
        if got != want:
            raise ValueError(f"{name}: made for (partition, rank, exchange, HV, dtype) = {got}, "
                             f"the call has {want}; build it with "
                             "KDADetKCPWorkspace.for_context(plan, ctx, num_v_heads=HV, "
                             "dtype=q.dtype)")
