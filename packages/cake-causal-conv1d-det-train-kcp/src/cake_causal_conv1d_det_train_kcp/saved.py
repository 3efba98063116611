"""CausalConv1dDetKCPSavedSet and CausalConv1dDetKCPWorkspace: this package's own det types
(the KCP entries refuse the single-rank package's types, and any non-det type, by type
and mode)."""

from __future__ import annotations

from typing import Any

import torch
from cake_causal_conv1d_det_train import (
    CausalConv1dDetPlan,
    CausalConv1dDetSavedSet,
    CausalConv1dDetWorkspace,
)
from cake_core import Mode, SavedSet, Workspace, check_float_dtype
from cake_core.kcp import Context

from cake_causal_conv1d_det_train_kcp.context import (
    bwd_payload_bytes,
    fwd_payload_bytes,
    halo_plan,
)

__all__ = ["CausalConv1dDetKCPSavedSet", "CausalConv1dDetKCPWorkspace"]


class CausalConv1dDetKCPSavedSet(SavedSet):
    """What :func:`~cake_causal_conv1d_det_train_kcp.causal_conv1d_det_fwd_kcp` keeps for
    its backward.

    Own tensors: ``x`` ``[1, T_r, D]``, ``weight`` ``[D, W]`` and ``bias`` ``[D]`` (or
    ``None``), as the caller gave them.
    Nested: ``local``, the :class:`cake_causal_conv1d_det_train.CausalConv1dDetSavedSet`
    of the single-rank forward over this rank's fragments (x, the fp32 weight and bias
    the local call ran with, the halo as its ``initial_state`` ``[n_frag, D, W - 1]`` or
    ``None``, the local ``cu_seqlens``), or ``None`` on a rank without tokens.
    :meth:`tensors` lists the own tensors, then the nested set's, so autograd can save all
    of them (:meth:`from_tensors` rebuilds the nesting).

    Meta: ``partition_key``, ``rank``, ``world_size``, ``num_tokens``, ``kernel_size``
    (the context the forward ran on: the backward refuses another), ``activation``
    (``None`` or ``"silu"``), ``plan`` (the local CausalConv1dDetPlan), ``has_local``,
    ``local_meta`` (the nested set's metadata).
    """

    tensor_names = ("x", "weight", "bias")
    format_version = 1

    def __init__(self, mode: Mode, tensors: dict[str, torch.Tensor | None],
                 meta: dict[str, Any] | None = None,
                 local: CausalConv1dDetSavedSet | None = None):
        super().__init__(mode, tensors, meta)
        self.local = local
        self.meta["has_local"] = local is not None
        self.meta["local_meta"] = local.meta if local is not None else None

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """Own tensors (``tensor_names`` order), then the nested set's ``tensors()``."""
        own = super().tensors()
        return own + (self.local.tensors() if self.local is not None else ())

    @classmethod
    def from_tensors(cls, mode: Mode, tensors: tuple[torch.Tensor | None, ...],
                     meta: dict[str, Any] | None = None) -> CausalConv1dDetKCPSavedSet:
        """Rebuild from ``ctx.saved_tensors`` (the order of :meth:`tensors`) and ``meta``."""
        meta = dict(meta or {})
        n = len(cls.tensor_names)
        has_local = bool(meta.get("has_local"))
        want = n + (len(CausalConv1dDetSavedSet.tensor_names) if has_local else 0)
        if len(tensors) != want:
            raise ValueError(f"{cls.__name__}: expected {want} tensors, got {len(tensors)}")
        local = None
        if has_local:
            local = CausalConv1dDetSavedSet.from_tensors(Mode.DET, tuple(tensors[n:]),
                                                         meta["local_meta"])
        return cls(mode, dict(zip(cls.tensor_names, tensors[:n], strict=True)), meta, local)


class CausalConv1dDetKCPWorkspace(Workspace):
    """Scratch of the KCP forward and backward on one rank, for one plan and context.

    Buffers (uint8: the collectives move bytes): ``fwd_send`` ``[S_f * D * b]`` and
    ``fwd_recv`` ``[W, S_f * D * b]`` (the halo rows, ``b`` the input dtype's size);
    ``bwd_send`` ``[n_b]`` and ``bwd_recv`` ``[W, n_b]`` with ``n_b`` the largest backward
    row (fp32 weight-gradient shares for ``reduce_weight_grads`` with a bias, then ``S_b``
    halo-gradient rows, padded to 8 bytes); empty when the call never runs that
    collective. ``S_f`` / ``S_b``: the halo plan's rows per rank
    (:func:`~cake_causal_conv1d_det_train_kcp.context.halo_plan`). Nested: ``local``, a
    :class:`cake_causal_conv1d_det_train.CausalConv1dDetWorkspace` for the plan and this
    rank's tokens and fragments (the local backward's fp32 partials). Contents are
    overwritten by every call, so one workspace serves every layer sharing the context,
    plan and input dtype. The halo itself is not workspace: it lives from the forward to
    the backward in the saved set. Build with :meth:`for_context`.
    """

    @classmethod
    def layout(cls, plan: CausalConv1dDetPlan, ctx: Context, *,
               dtype: torch.dtype = torch.float32):
        """What :meth:`for_context` allocates, without allocating: ``(buffers, local)``,
        ``buffers`` ``{name: (shape, torch.uint8)}`` and ``local`` the keyword arguments of
        the nested ``CausalConv1dDetWorkspace.for_plan`` (``max_tokens``, ``max_seqs``).
        Raises as :meth:`for_context`."""
        if not isinstance(plan, CausalConv1dDetPlan):
            raise ValueError(f"plan: expected CausalConv1dDetPlan, got {type(plan).__name__}")
        if not isinstance(ctx, Context):
            raise ValueError(f"ctx: expected a cake_core.kcp.Context, got {type(ctx).__name__}")
        check_float_dtype(dtype)
        D, Wk = plan.hidden_size, plan.kernel_size
        if ctx.conv_kernel_size != Wk:
            raise ValueError(f"ctx: built with conv_kernel_size={ctx.conv_kernel_size}, the "
                             f"plan is for kernel_size={Wk}")
        hp = halo_plan(ctx.partition, Wk)
        b = torch.empty((), dtype=dtype).element_size()
        nf = fwd_payload_bytes(hp, D, b)
        nb = bwd_payload_bytes(hp, D, b, D * Wk + D)
        W, u8 = ctx.world_size, torch.uint8
        bufs = {"fwd_send": ((nf,), u8), "fwd_recv": ((W, nf), u8),
                "bwd_send": ((nb,), u8), "bwd_recv": ((W, nb), u8)}
        return bufs, {"max_tokens": ctx.num_tokens, "max_seqs": max(1, ctx.num_fragments)}

    @classmethod
    def for_context(cls, plan: CausalConv1dDetPlan, ctx: Context, *,
                    dtype: torch.dtype = torch.float32) -> CausalConv1dDetKCPWorkspace:
        """Allocate for calls on ``ctx`` with ``plan`` (D, W) and inputs x of ``dtype``
        (:meth:`layout` without allocating).

        Raises:
            ValueError: a plan of another type, ``ctx`` not a Context or built for another
                kernel size than the plan's, ``dtype`` not fp32/bf16/fp16.
        """
        bufs, local = cls.layout(plan, ctx, dtype=dtype)
        dev = ctx.device
        ws = cls(plan, dev, {name: torch.empty(shape, dtype=dt, device=dev)
                             for name, (shape, dt) in bufs.items()})
        ws.local = CausalConv1dDetWorkspace.for_plan(plan, dev, **local)
        ws.partition_key, ws.rank, ws.dtype = ctx.partition.key, ctx.rank, dtype
        return ws

    def check_for(self, plan: CausalConv1dDetPlan, ctx: Context, dtype: torch.dtype, *,
                  name: str = "workspace") -> None:
        """``ValueError`` unless made (:meth:`for_context`) for ``plan`` on ``ctx``'s
        device, partition and rank, with inputs of ``dtype``."""
        self.check(plan, ctx.device, name=name)
        got = (self.partition_key, self.rank, self.dtype)
        want = (ctx.partition.key, ctx.rank, dtype)
        if got != want:
            raise ValueError(f"{name}: made for (partition, rank, dtype) = {got}, the call has "
                             f"{want}; build it with CausalConv1dDetKCPWorkspace.for_context("
                             "plan, ctx, dtype=x.dtype)")

    def bytes_view(self, name: str, n: int) -> torch.Tensor:
        """The first ``n`` bytes (send buffers, ``[n]``) or the first ``n`` bytes of every
        rank's row (receive buffers, as a contiguous ``[W, n]`` view of the buffer's start)."""
        t = self[name]
        if t.dim() == 1:
            return t[:n]
        return t.view(-1)[:t.shape[0] * n].view(t.shape[0], n)
