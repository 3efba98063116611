"""KDANondetSavedSet and KDANondetWorkspace (mode ``nondet``; modes checked through
cake_core)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_kda_det_train.saved import KDADetSavedSet, allocate_workspace

from cake_kda_nondet_train.plan import KDANondetPlan


class KDANondetSavedSet(SavedSet):
    """What :func:`~cake_kda_nondet_train.chunk_kda_nondet_fwd` keeps for
    :func:`~cake_kda_nondet_train.chunk_kda_nondet_bwd` (mode ``nondet``): the same tensors
    and meta as ``cake_kda_det_train.KDADetSavedSet`` (its docstring gives their shapes and
    dtypes), with ``meta["plan"]`` a :class:`~cake_kda_nondet_train.KDANondetPlan`. The det
    backward refuses it and this package's backward refuses the det one (``ValueError``).
    """

    tensor_names = KDADetSavedSet.tensor_names
    format_version = KDADetSavedSet.format_version


class KDANondetWorkspace(Workspace):
    """Scratch of the forward (and of the backward's recompute) for one
    :class:`~cake_kda_nondet_train.KDANondetPlan` (mode ``nondet``), sized for a token and
    sequence capacity: the buffers of ``cake_kda_det_train.KDADetWorkspace`` (``w``, ``u``,
    ``v_new``, ``h``, ``aqk``, in the chunk intermediates' dtype). One workspace serves many
    calls, not two at once. Build with :meth:`for_plan`.
    """

    @classmethod
    def for_plan(cls, plan: KDANondetPlan, device: torch.device | str, *, num_v_heads: int,
                 max_tokens: int, max_seqs: int = 1,
                 dtype: torch.dtype = torch.float32) -> KDANondetWorkspace:
        """Allocate the buffers for calls of ``plan`` with ``num_v_heads`` (HV) value heads,
        at most ``max_tokens`` tokens (B * T), at most ``max_seqs`` sequences and q/k/v of
        ``dtype``.

        Raises:
            ValueError: a plan of another type or mode (a ``KDADetPlan`` too), counts that
                are not ints (HV >= 1, max_tokens >= 0, max_seqs >= 1), ``dtype`` not
                fp32/bf16/fp16.
        """
        return allocate_workspace(cls, KDANondetPlan, Mode.NONDET, plan, device, num_v_heads,
                                  max_tokens, max_seqs, dtype)


__all__ = ["KDANondetSavedSet", "KDANondetWorkspace"]
