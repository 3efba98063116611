"""``KimiDeltaAttention``: FLA's Kimi Delta Attention layer (``fla.layers.KimiDeltaAttention``)
on cake's deterministic kernels. Needs the ``layers`` extra: ``pip install
cake-kda-det-train[layers]`` (the short convolution, gated RMSNorm and dense projection
packages); the core package alone needs only cake-core."""

from __future__ import annotations

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

from cake_kda_det_train.api import chunk_kda_det
from cake_kda_det_train.plan import make_plan
from cake_kda_det_train.reference import kda_recurrence_ref

_EXTRA = ("KimiDeltaAttention needs the layers extra: pip install "
          "'cake-kda-det-train[layers]' (from this repository: pip install "
          "./packages/cake-causal-conv1d-det-train "
          "./packages/cake-rmsnorm-silu-gate-det-train "
          "./packages/cake-dense-projection-det-gemm)")


def _parts(impl: str):
    if impl == "torch":
        return ShortConvolutionTorch, nn.Linear, RMSNormGatedTorch
    try:
        from cake_causal_conv1d_det_train import ShortConvolution
        from cake_dense_projection_det_gemm import Linear
        from cake_rmsnorm_silu_gate_det_train import RMSNormGated
    except ImportError as e:  # pragma: no cover - the extra is installed in the tests
        raise ImportError(_EXTRA) from e
    return ShortConvolution, Linear, RMSNormGated


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention layer (Kimi Team, 2025, "Kimi Linear", arXiv:2510.26692) with
    FLA's constructor arguments, parameters and ``state_dict`` keys, so FLA checkpoints load
    as they are; every step runs on cake's deterministic kernels.

    Per token (``H = num_heads`` heads, ``K = head_dim``, ``V = head_dim * expand_v``)::

        q, k, v = silu(conv(q_proj(x))), silu(conv(k_proj(x))), silu(conv(v_proj(x)))
        q, k    = l2norm(q), l2norm(k)                        # per head
        g       = -exp(A_log) * softplus(f_proj(x) + dt_bias)  # [H, K] per token
        beta    = sigmoid(b_proj(x))                          # 2 * sigmoid with allow_neg_eigval
        o       = gated delta rule(q, k, v, g, beta), scale K ** -0.5, state from zero
        o       = rmsnorm(o) * o_norm.weight * sigmoid(g_proj(x))
        out     = o_proj(o)

    Modules: ``q_proj`` / ``k_proj`` / ``v_proj`` / ``b_proj`` / ``o_proj``
    (:class:`cake_dense_projection_det_gemm.Linear`, no bias), ``f_proj`` and ``g_proj``
    (two-layer low-rank ``nn.Sequential`` through ``V`` channels; ``g_proj``'s second has a
    bias), ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d``
    (:class:`cake_causal_conv1d_det_train.ShortConvolution`, SiLU), ``o_norm``
    (:class:`cake_rmsnorm_silu_gate_det_train.RMSNormGated`, sigmoid gate), ``A_log``
    ``[H]`` (``log U(1, 16)``) and ``dt_bias`` ``[H * K]`` (zeros), both marked
    ``_no_weight_decay``. The core is :func:`chunk_kda_det` with the L2 norm, the gate and
    beta's sigmoid in the kernel.

    Args (FLA's): hidden_size, expand_v, head_dim, num_heads, num_v_heads (must equal
    num_heads: FLA's grouped values repeat q, k and the gate to the value heads while
    ``A_log`` and ``dt_bias`` keep ``num_heads`` heads, which is not served), mode
    (``"chunk"`` or ``"fused_recurrent"``: the same math; cake runs its chunked kernels),
    use_short_conv (without it q, k, v get SiLU alone, as in FLA), allow_neg_eigval,
    conv_size, conv_bias, layer_idx, norm_eps; other keywords are accepted and ignored, as
    FLA's layer does. And cake's ``impl``: ``"cake"`` (the default) runs everything above
    on cake's kernels; ``"torch"`` builds the same parameters (same names, shapes and
    initialisation, so one ``state_dict`` loads into both) from plain torch modules
    (``torch.nn.Linear``, :class:`cake_core.layer_utils.ShortConvolutionTorch` and
    :class:`~cake_core.layer_utils.RMSNormGatedTorch`) and runs the core as
    :func:`~cake_kda_det_train.kda_recurrence_ref` in fp32, token by token: a slow
    plain-torch baseline that needs no ``layers`` extra, launches no Triton kernel and
    serves any head dim. And cake's ``keep_states`` (default False): True runs the core with
    the rule's plan and ``keep_states = 1`` (the core's ``disable_recompute=True``): the
    forward keeps the chunk states for the backward, which then skips their recompute: less
    time for more memory (``cake_kda_det_train.saved_bytes`` counts it; measurements:
    docs/benchmarks/kda.md). The same bits as False, eagerly and under ``torch.compile``
    (where the layer traces as one graph, as with False, without a padding
    ``attention_mask``; tested with the ``aot_eager`` backend). No effect with ``impl="torch"``.

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
        from cake_kda_det_train import KimiDeltaAttention

        layer = KimiDeltaAttention(hidden_size=64, head_dim=16, num_heads=4)
        x = torch.randn(2, 24, 64, requires_grad=True)
        o, _, _ = layer(x)
        o.sum().backward()
    """

    def __init__(self, hidden_size: int = 2048, expand_v: float = 1, head_dim: int = 128,
                 num_heads: int = 16, num_v_heads: int | None = None, mode: str = "chunk",
                 use_short_conv: bool = True, allow_neg_eigval: bool = False,
                 conv_size: int = 4, conv_bias: bool = False, layer_idx: int | None = None,
                 norm_eps: float = 1e-5, *, impl: str = "cake", keep_states: bool = False,
                 **kwargs) -> None:
        super().__init__()
        self.impl = check_impl(impl)
        self.keep_states = check_flag(keep_states, "keep_states")
        ShortConvolution, Linear, RMSNormGated = _parts(impl)
        self._core = chunk_kda_det if impl == "cake" else torch_core(kda_recurrence_ref)
        self.hidden_size = positive_int("hidden_size", hidden_size)
        self.head_k_dim, self.head_v_dim, self.num_v_heads = head_dims(
            head_dim, expand_v, num_heads, num_v_heads)
        if self.num_v_heads != num_heads:
            raise ValueError(f"num_v_heads ({self.num_v_heads}) != num_heads ({num_heads}) "
                             "is not served (FLA's A_log and dt_bias keep num_heads heads)")
        check_training_call(mode, None, False, False)
        self.head_dim, self.num_heads, self.expand_v, self.mode = head_dim, num_heads, \
            expand_v, mode
        self.use_short_conv, self.allow_neg_eigval = bool(use_short_conv), bool(allow_neg_eigval)
        self.conv_size, self.conv_bias = conv_size, conv_bias
        self.layer_idx, self.norm_eps = layer_idx, norm_eps
        self.key_dim = num_heads * self.head_k_dim
        self.value_dim = num_heads * self.head_v_dim
        d, kd, vd, hv = self.hidden_size, self.key_dim, self.value_dim, self.head_v_dim
        build_qkv(self, Linear, ShortConvolution)
        self.f_proj = nn.Sequential(Linear(d, hv, bias=False), Linear(hv, kd, bias=False))
        self.b_proj = Linear(d, num_heads, bias=False)
        # FLA's init: A ~ U(1, 16), dt_bias zeros
        self.A_log = nn.Parameter(torch.empty(num_heads, dtype=torch.float32).uniform_(1, 16)
                                  .log())
        self.A_log._no_weight_decay = True
        self.dt_bias = nn.Parameter(torch.zeros(kd, dtype=torch.float32))
        self.dt_bias._no_weight_decay = True
        self.g_proj = nn.Sequential(Linear(d, hv, bias=False), Linear(hv, vd, bias=True))
        self.o_norm = RMSNormGated(hv, eps=norm_eps, activation="sigmoid")
        self.o_proj = Linear(vd, d, bias=False)

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
        H, K = self.num_heads, self.head_k_dim
        o, _ = self._core(
            q.unflatten(-1, (H, K)), k.unflatten(-1, (H, K)),
            v.unflatten(-1, (H, self.head_v_dim)), self.f_proj(x).unflatten(-1, (H, K)),
            self.b_proj(x), cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, A_log=self.A_log, dt_bias=self.dt_bias,
            use_beta_sigmoid_in_kernel=True, allow_neg_eigval=self.allow_neg_eigval, **core_kw)
        o = self.o_norm(o, self.g_proj(x).unflatten(-1, (H, self.head_v_dim)))
        return pad(self.o_proj(o.flatten(-2)), keep, B, T), None, past_key_values

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, "
                f"head_k_dim={self.head_k_dim}, head_v_dim={self.head_v_dim}, "
                f"use_short_conv={self.use_short_conv}, impl={self.impl}"
                + (", keep_states=True" if self.keep_states else ""))
