"""The mixture-of-experts feed-forward layer on the nondet grouped GEMM.

The math (top-k softmax router, SwiGLU experts, the combine, the Switch load-balancing
loss), the sources and the checks are those of :mod:`cake_moe_grouped_det_gemm.moe`: this
module runs that layer's code with :func:`~cake_moe_grouped_nondet_gemm.moe_grouped_nondet_gemm`
for its three grouped GEMMs (router, gate/up, down) and :class:`MoEGroupedNondetPlan` s.
The routing helpers are the det package's code under ``nondet`` names. Bits not promised.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_moe_grouped_det_gemm.moe import (
    MoEFeedForward,
    MoERouting,
    _experts_entry,
    _feed_forward,
    _make_moe_plans,
    moe_permute_det,
    moe_route_det,
    moe_topk_det,
    moe_unpermute_det,
)

from cake_moe_grouped_nondet_gemm.api import _resolve_nondet_plan, routed_nondet_gemm
from cake_moe_grouped_nondet_gemm.plan import MoEGroupedNondetPlan, make_nondet_plan

__all__ = [
    "MoEFeedForwardNondet",
    "MoEFeedForwardNondetPlans",
    "MoERoutingNondet",
    "make_nondet_moe_plans",
    "moe_experts_nondet",
    "moe_feed_forward_nondet",
    "moe_permute_nondet",
    "moe_route_nondet",
    "moe_topk_nondet",
    "moe_unpermute_nondet",
]


class MoERoutingNondet(MoERouting):
    """Where each token's k assignments go, from :func:`moe_route_nondet`: the fields of
    ``cake_moe_grouped_det_gemm.MoERouting`` (``ids``, ``weights``, ``probs``, ``order``,
    ``slot``, ``offs``; all on the device)."""

    __slots__ = ()


def moe_topk_nondet(probs: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, ids)``: the ``top_k`` largest entries of each row of ``probs`` ``[T, E]``,
    as ``cake_moe_grouped_det_gemm.moe_topk_det`` (its code; ties to the lower expert
    index). Raises ``ValueError`` as that function."""
    return moe_topk_det(probs, top_k)


def moe_route_nondet(logits: torch.Tensor, top_k: int, *,
                     normalize_topk: bool = True) -> MoERoutingNondet:
    """Top-k softmax routing of ``logits`` ``[T, E]`` and the stable sort of the
    assignments by expert, as ``cake_moe_grouped_det_gemm.moe_route_det`` (its code), in a
    :class:`MoERoutingNondet`. Raises ``ValueError`` as that function."""
    return MoERoutingNondet(*moe_route_det(logits, top_k, normalize_topk=normalize_topk))


def moe_permute_nondet(x: torch.Tensor, routing: MoERouting) -> torch.Tensor:
    """Tokens ``x`` ``[T, d]`` to expert-sorted rows ``[T·k, d]``, as
    ``cake_moe_grouped_det_gemm.moe_permute_det`` (its code)."""
    return moe_permute_det(x, routing)


def moe_unpermute_nondet(out: torch.Tensor, routing: MoERouting) -> torch.Tensor:
    """The combine ``y[t] = Σ_j weights[t, j] · out[slot[t·k + j]]`` ``[T, d]``, as
    ``cake_moe_grouped_det_gemm.moe_unpermute_det`` (its code)."""
    return moe_unpermute_det(out, routing)


class MoEFeedForwardNondetPlans(NamedTuple):
    """The three grouped-GEMM plans of one :func:`moe_feed_forward_nondet` call: ``router``
    (E=1 group, N = num_experts, K = d_model, fp32), ``gate_up`` (N = 2·d_ff, K = d_model)
    and ``down`` (N = d_model, K = d_ff), each a :class:`MoEGroupedNondetPlan`."""

    router: MoEGroupedNondetPlan
    gate_up: MoEGroupedNondetPlan
    down: MoEGroupedNondetPlan


def make_nondet_moe_plans(num_tokens: int, d_model: int, d_ff: int, num_experts: int,
                          top_k: int, dtype: torch.dtype, device: torch.device | str
                          ) -> MoEFeedForwardNondetPlans:
    """The plans :func:`moe_feed_forward_nondet` picks for ``num_tokens`` tokens
    (:func:`make_nondet_plan`'s rule, as ``cake_moe_grouped_det_gemm.make_moe_plans``).
    Raises ``ValueError`` as that function."""
    return _make_moe_plans(num_tokens, d_model, d_ff, num_experts, top_k, dtype, device,
                           rule=make_nondet_plan, plans_cls=MoEFeedForwardNondetPlans)


def moe_feed_forward_nondet(x: torch.Tensor, router_weight: torch.Tensor,
                            w_gate_up: torch.Tensor, w_down: torch.Tensor, top_k: int, *,
                            normalize_topk: bool = True, aux_loss_coef: float = 0.01,
                            plans: MoEFeedForwardNondetPlans | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """MoE feed-forward (top-k softmax router, SwiGLU experts) with autograd, bits not
    promised: ``(y, aux_loss)``.

    Arguments (x ``[..., d_model]``, router_weight ``[E, d_model]``, w_gate_up
    ``[E, 2·d_ff, d_model]``, w_down ``[E, d_model, d_ff]``, top_k, normalize_topk,
    aux_loss_coef), math, numerics and errors are those of
    ``cake_moe_grouped_det_gemm.moe_feed_forward_det``; its grouped GEMMs are
    :func:`moe_grouped_nondet_gemm` with ``plans`` (:class:`MoEFeedForwardNondetPlans`,
    default: :func:`make_nondet_moe_plans`' rule per call).

    Raises:
        ValueError: as the det layer, and for det plans; before any launch.
        RuntimeError: in the backward under ``torch.use_deterministic_algorithms(True)``
            (the grouped GEMMs' backward; ``warn_only=True``: one warning).
    """
    return _feed_forward(x, router_weight, w_gate_up, w_down, top_k, normalize_topk,
                         aux_loss_coef, plans, gemm=routed_nondet_gemm,
                         plans_cls=MoEFeedForwardNondetPlans, resolve=_resolve_nondet_plan)


def moe_experts_nondet(x: torch.Tensor, router_logits: torch.Tensor,
                       w_gate_up: torch.Tensor, w_down: torch.Tensor, top_k: int, *,
                       normalize_topk: bool = True,
                       plans: MoEFeedForwardNondetPlans | None = None) -> torch.Tensor:
    """The experts half of :func:`moe_feed_forward_nondet`, for a router the caller runs:
    ``y`` like x from ``router_logits [..., E]``, bits not promised.

    Arguments, math, numerics and errors are those of
    ``cake_moe_grouped_det_gemm.moe_experts_det``; its grouped GEMMs are
    :func:`moe_grouped_nondet_gemm` with ``plans`` (:class:`MoEFeedForwardNondetPlans`).

    Raises:
        ValueError: as the det entry, and for det plans; before any launch.
        RuntimeError: in the backward under ``torch.use_deterministic_algorithms(True)``
            (the grouped GEMMs' backward; ``warn_only=True``: one warning).
    """
    return _experts_entry(x, router_logits, w_gate_up, w_down, top_k, normalize_topk, plans,
                          gemm=routed_nondet_gemm, plans_cls=MoEFeedForwardNondetPlans,
                          resolve=_resolve_nondet_plan)



class MoEFeedForwardNondet(MoEFeedForward):
    """Mixture-of-experts feed-forward on :func:`moe_feed_forward_nondet` (bits not
    promised).

    Constructor (``d_model, d_ff, num_experts, top_k, *, aux_loss_coef=0.01,
    normalize_topk=True, device=None, dtype=None``), parameters (``router_weight``,
    ``w_gate_up``, ``w_down``), initialisation, ``state_dict`` and errors are those of
    ``cake_moe_grouped_det_gemm.MoEFeedForward``; ``forward(x, *, plans=None)`` returns
    ``(y, aux_loss)`` with :class:`MoEFeedForwardNondetPlans`.
    """

    def forward(self, x: torch.Tensor, *, plans: MoEFeedForwardNondetPlans | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return moe_feed_forward_nondet(
            x, self.router_weight, self.w_gate_up, self.w_down, self.top_k,
            normalize_topk=self.normalize_topk, aux_loss_coef=self.aux_loss_coef, plans=plans)
