"""LMHeadLossDetSavedSet and LMHeadLossDetWorkspace (modes checked through cake_core)."""

from __future__ import annotations

from typing import ClassVar

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.checks import check_alloc_device

from cake_lm_head_loss_det_train.plan import LMHeadLossDetPlan


class LMHeadLossDetSavedSet(SavedSet):
    """What the det forward keeps for the backward.

    Tensors (``None`` where unused):
        hidden: ``[T, H]`` (the input, flattened; not a copy). weight: ``[V, H]``.
        bias: ``[V]`` or ``None``. labels: ``[T]`` int64. lse: fp32 ``[T]``, the
        logsumexp of each token's (soft-capped) logits. n_valid: int64 ``[]``, the count of
        non-ignored tokens.
        dhidden, dweight32, dbias32: with ``grad_in_forward`` only, the gradients of the
        returned loss for an upstream gradient of 1 (``dhidden`` in hidden's dtype, the
        others fp32; ``None`` where that input needs no gradient).
        dlogits: ``[T, V]`` in hidden's dtype, instead of ``dweight32``, on the deferred
        route (``T <= plan.defer_dw_tokens``, 16-bit inputs): the backward makes dweight
        from it in one GEMM.
    Meta: ``plan``, ``reduction``, ``ignore_index``, ``label_smoothing``, ``z_loss``,
    ``logit_softcap`` (0.0 = off), ``grad_in_forward`` (bool), ``lead_shape`` (labels'
    shape).
    """

    tensor_names = ("hidden", "weight", "bias", "labels", "lse", "n_valid", "dhidden",
                    "dweight32", "dlogits", "dbias32")
    format_version = 2


def workspace_buffers(plan: LMHeadLossDetPlan, dtype: torch.dtype = torch.bfloat16, *,
                      plan_cls: type = LMHeadLossDetPlan
                      ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``{name: (shape, dtype)}`` of what ``for_plan`` allocates for ``plan`` and ``dtype``
    inputs (what ``workspace_bytes`` sums; the entries check a given workspace against
    it), after checking that ``plan`` is a ``plan_cls`` of its mode (``plan_cls``: the
    nondet sibling's) and ``dtype``.

    Raises:
        ValueError: ``plan`` of another type or mode, ``dtype`` not fp32 / bf16 / fp16.
    """
    if not isinstance(plan, plan_cls):
        raise ValueError(f"plan: expected {plan_cls.__name__}, got {type(plan).__name__}")
    if plan.mode != plan_cls.expected_mode:  # a sibling mode's plan (a subclass)
        raise ValueError(f"plan: got {type(plan).__name__} with mode={plan.mode}, "
                         f"expected {plan_cls.__name__} with mode={plan_cls.expected_mode}")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype: expected float32, bfloat16 or float16, got {dtype}")
    C, V, H = plan.chunk_tokens, plan.vocab_size, plan.hidden_size
    bufs = {"logits": ((C, V), torch.float32)}
    if dtype != torch.float32:  # fp32 inputs: the fp32 dlogits overwrite the logits
        bufs["dlogits"] = ((C, V), dtype)
    if plan.dh_split > 1:
        bufs["dh_partials"] = ((plan.dh_split * C * H,), torch.float32)
    return bufs


class LMHeadLossDetWorkspace(Workspace):
    """Chunk buffers for one plan and one input dtype.

    Buffers: ``logits`` fp32 ``[chunk_tokens, V]``; ``dlogits`` ``[chunk_tokens, V]`` in
    the inputs' dtype (absent for fp32 inputs: the fp32 dlogits overwrite ``logits``);
    ``dh_partials`` fp32 ``[dh_split * chunk_tokens * H]`` when ``plan.dh_split > 1``.
    Build with :meth:`for_plan`; reusable call after call (every buffer a kernel reads is
    written first by the same call).
    """

    #: the plan class (and through it the mode) :meth:`for_plan` takes
    plan_class: ClassVar[type[LMHeadLossDetPlan]] = LMHeadLossDetPlan

    @classmethod
    def for_plan(cls, plan: LMHeadLossDetPlan, device: torch.device | str,
                 dtype: torch.dtype = torch.bfloat16) -> LMHeadLossDetWorkspace:
        """Allocate the buffers ``plan`` needs on ``device`` for ``dtype`` inputs."""
        device = check_alloc_device(device)
        bufs = {n: torch.empty(s, dtype=dt, device=device) for n, (s, dt) in
                workspace_buffers(plan, dtype, plan_cls=cls.plan_class).items()}
        return cls(plan, device, bufs)


__all__ = ["LMHeadLossDetSavedSet", "LMHeadLossDetWorkspace", "Mode", "workspace_buffers"]
