"""``GatedDeltaNet``: FLA's Gated DeltaNet layer (``fla.layers.GatedDeltaNet``) on cake's
deterministic kernels. Needs the ``layers`` extra: ``pip install
cake-gdn-det-train[layers]`` (the short convolution, gated RMSNorm, RMSNorm and dense
projection packages); the core package alone needs only cake-core."""

from __future__ import annotations

import math

import torch
from cake_core.checks import check_flag
from cake_core.layer_utils import (
    RMSNormGatedTorch,
    ShortConvolutionTorch,
    build_qkv,
    check_impl,
    check_training_call,
    head_dims,
    pad,
    positive_int,
    project_qkv,
    torch_core,
    unpad,
)
from torch import nn

from cake_gdn_det_train.api import chunk_gated_delta_rule_det
from cake_gdn_det_train.plan import make_plan
from cake_gdn_det_train.reference import gdn_reference

_EXTRA = ("GatedDeltaNet needs the layers extra: pip install 'cake-gdn-det-train[layers]' "
          "(from this repository: pip install ./packages/cake-causal-conv1d-det-train "
          "./packages/cake-rmsnorm-silu-gate-det-train ./packages/cake-rmsnorm-det-train "
          "./packages/cake-dense-projection-det-gemm)")


def _parts(impl: str):
    if impl == "torch":
        return ShortConvolutionTorch, nn.Linear, nn.RMSNorm, RMSNormGatedTorch
    try:
        from cake_causal_conv1d_det_train import ShortConvolution
        from cake_dense_projection_det_gemm import Linear
        from cake_rmsnorm_det_train import RMSNorm
        from cake_rmsnorm_silu_gate_det_train import RMSNormGated
    except ImportError as e:  # pragma: no cover - the extra is installed in the tests
        raise ImportError(_EXTRA) from e
    return ShortConvolution, Linear, RMSNorm, RMSNormGated


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet layer (Yang, Kautz & Hatamizadeh, 2024, arXiv:2412.06464) with FLA's
    constructor arguments, parameters and ``state_dict`` keys, so FLA checkpoints load as
    they are; every step runs on cake's deterministic kernels.

    Per token (``H = num_heads`` key heads of ``K = head_dim``, ``HV = num_v_heads`` value
    heads of ``V = head_dim * expand_v``, value head ``j`` reading key head
    ``j // (HV // H)``)::

        q, k, v = silu(conv(q_proj(x))), silu(conv(k_proj(x))), silu(conv(v_proj(x)))
        q, k    = l2norm(q), l2norm(k)                       # per head
        g       = -exp(A_log) * softplus(a_proj(x) + dt_bias)
        beta    = sigmoid(b_proj(x))                         # 2 * sigmoid with allow_neg_eigval
        o       = gated delta rule(q, k, v, g, beta), scale K ** -0.5, state from zero
        o       = rmsnorm(o) * o_norm.weight * silu(g_proj(x))   # RMSNorm alone without use_gate
        out     = o_proj(o)

    Modules: ``q_proj`` / ``k_proj`` / ``v_proj`` / ``a_proj`` / ``b_proj`` / ``g_proj`` /
    ``o_proj`` (:class:`cake_dense_projection_det_gemm.Linear`, no bias), ``q_conv1d`` /
    ``k_conv1d`` / ``v_conv1d`` (:class:`cake_causal_conv1d_det_train.ShortConvolution`,
    SiLU), ``o_norm`` (:class:`cake_rmsnorm_silu_gate_det_train.RMSNormGated` with the
    gate, :class:`cake_rmsnorm_det_train.RMSNorm` without), ``A_log`` and ``dt_bias``
    ``[HV]`` (FLA's initialisation, marked ``_no_weight_decay``). The core is
    :func:`chunk_gated_delta_rule_det` with the L2 norm, the gate and beta's sigmoid in the
    kernel.

    Args (FLA's): hidden_size, expand_v, head_dim, num_heads, num_v_heads (default
    num_heads; a multiple of it), mode (``"chunk"`` or ``"fused_recurrent"``: the same
    math, cake runs its chunked kernels for both), use_gate, use_short_conv (without it q,
    k, v get SiLU alone, as in FLA), allow_neg_eigval, conv_size, conv_bias, layer_idx,
    norm_eps; other keywords are accepted and ignored, as FLA's layer does. And cake's
    ``impl``: ``"cake"`` (the default) runs everything above on cake's kernels;
    ``"torch"`` builds the same parameters (same names, shapes and initialisation, so one
    ``state_dict`` loads into both) from plain torch modules (``torch.nn.Linear``,
    ``torch.nn.RMSNorm``, :class:`cake_core.layer_utils.ShortConvolutionTorch` and
    :class:`~cake_core.layer_utils.RMSNormGatedTorch`) and runs the core as
    :func:`~cake_gdn_det_train.gdn_reference` in fp32, token by token: a slow plain-torch
    baseline that needs no ``layers`` extra, launches no Triton kernel and serves any
    head dim. And cake's ``keep_states`` (default False): True runs the core with the rule's
    plan for the call (as the entry picks it) and ``keep_states = 1`` (the core's
    ``disable_recompute=True``): the forward keeps the chunk states for the backward, which
    then skips their recompute: less time for more memory
    (``cake_gdn_det_train.saved_bytes`` counts it; measurements: docs/benchmarks/gdn.md).
    The same bits as False, eagerly and under ``torch.compile`` (where the layer traces as
    one graph, as with False, without a padding ``attention_mask``; tested with the
    ``aot_eager`` backend). No effect with ``impl="torch"``.

    ``forward(hidden_states, attention_mask=None, past_key_values=None, use_cache=False,
    output_attentions=False, **kwargs)`` returns ``(o, None, past_key_values)`` as FLA's:
    ``hidden_states`` ``[B, T, hidden_size]``; ``attention_mask`` ``[B, T]`` of 0 / 1
    (padding: the kept tokens are packed into documents and the padded positions of the
    output are 0); ``kwargs["cu_seqlens"]`` ``[N + 1]`` for packed input ``[1, T, ...]``.

    Raises:
        ValueError: bad constructor arguments (``impl`` included); in forward,
            ``use_cache=True`` or a ``past_key_values`` (decoding is not served: cake
            serves training), ``output_attentions=True``, a mask of the wrong shape or
            given with ``cu_seqlens``, and whatever the kernels refuse (head dims, dtypes).
        ImportError: the ``layers`` extra is not installed.

    Example::

        import torch
        from cake_gdn_det_train import GatedDeltaNet

        layer = GatedDeltaNet(hidden_size=64, head_dim=16, num_heads=2, expand_v=2)
        x = torch.randn(2, 24, 64, requires_grad=True)
        o, _, _ = layer(x)
        o.sum().backward()
    """

    def __init__(self, hidden_size: int = 2048, expand_v: float = 2, head_dim: int = 256,
                 num_heads: int = 6, num_v_heads: int | None = None, mode: str = "chunk",
                 use_gate: bool = True, use_short_conv: bool = True,
                 allow_neg_eigval: bool = False, conv_size: int = 4, conv_bias: bool = False,
                 layer_idx: int | None = None, norm_eps: float = 1e-5, *, impl: str = "cake",
                 keep_states: bool = False, **kwargs) -> None:
        super().__init__()
        self.impl = check_impl(impl)
        self.keep_states = check_flag(keep_states, "keep_states")
        ShortConvolution, Linear, RMSNorm, RMSNormGated = _parts(impl)
        self._core = chunk_gated_delta_rule_det if impl == "cake" else torch_core(gdn_reference)
        self.hidden_size = positive_int("hidden_size", hidden_size)
        self.head_k_dim, self.head_v_dim, self.num_v_heads = head_dims(
            head_dim, expand_v, num_heads, num_v_heads)
        check_training_call(mode, None, False, False)
        self.head_dim, self.num_heads, self.expand_v, self.mode = head_dim, num_heads, \
            expand_v, mode
        self.use_gate, self.use_short_conv = bool(use_gate), bool(use_short_conv)
        self.allow_neg_eigval = bool(allow_neg_eigval)
        self.conv_size, self.conv_bias = conv_size, conv_bias
        self.layer_idx, self.norm_eps = layer_idx, norm_eps
        self.key_dim = self.num_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        hv = self.num_v_heads
        build_qkv(self, Linear, ShortConvolution)
        self.a_proj = Linear(self.hidden_size, hv, bias=False)
        self.b_proj = Linear(self.hidden_size, hv, bias=False)
        # FLA's init: A ~ U(0, 16); dt log-uniform in [1e-3, 0.1] (floor 1e-4), dt_bias its
        # inverse softplus
        a = torch.empty(hv, dtype=torch.float32).uniform_(0, 16)
        self.A_log = nn.Parameter(torch.log(a))
        self.A_log._no_weight_decay = True
        dt = torch.exp(torch.rand(hv) * (math.log(0.1) - math.log(1e-3))
                       + math.log(1e-3)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.dt_bias._no_weight_decay = True
        if self.use_gate:
            self.g_proj = Linear(self.hidden_size, self.value_dim, bias=False)
            self.o_norm = RMSNormGated(self.head_v_dim, eps=norm_eps, activation="swish")
        else:
            self.o_norm = RMSNorm(self.head_v_dim, eps=norm_eps)
        self.o_proj = Linear(self.value_dim, self.hidden_size, bias=False)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                past_key_values=None, use_cache: bool | None = False,
                output_attentions: bool | None = False, **kwargs):
        check_training_call(self.mode, past_key_values, use_cache, output_attentions)
        x, cu_seqlens, keep = unpad(hidden_states, self.hidden_size, attention_mask,
                                    kwargs.get("cu_seqlens"))
        B, T = hidden_states.shape[:2]
        core_kw = {}
        if self.impl == "cake":  # head dims, dtype, device the core serves: before any launch
            make_plan(self.head_k_dim, self.head_v_dim, x.dtype, x.device)
            if self.keep_states:  # the entry's own plan for the call, keep_states = 1
                core_kw["disable_recompute"] = True
        q, k, v = project_qkv(self, x, cu_seqlens)
        q = q.unflatten(-1, (self.num_heads, self.head_k_dim))
        k = k.unflatten(-1, (self.num_heads, self.head_k_dim))
        v = v.unflatten(-1, (self.num_v_heads, self.head_v_dim))
        o, _ = self._core(
            q, k, v, self.a_proj(x), self.b_proj(x), cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=self.A_log,
            dt_bias=self.dt_bias, use_beta_sigmoid_in_kernel=True,
            allow_neg_eigval=self.allow_neg_eigval, **core_kw)
        if self.use_gate:
            o = self.o_norm(o, self.g_proj(x).unflatten(-1, (self.num_v_heads,
                                                              self.head_v_dim)))
        else:
            o = self.o_norm(o)
        return pad(self.o_proj(o.flatten(-2)), keep, B, T), None, past_key_values

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, "
                f"num_v_heads={self.num_v_heads}, head_k_dim={self.head_k_dim}, "
                f"head_v_dim={self.head_v_dim}, use_gate={self.use_gate}, "
                f"use_short_conv={self.use_short_conv}, impl={self.impl}"
                + (", keep_states=True" if self.keep_states else ""))
