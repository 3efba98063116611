"""A tiny byte-level pre-norm decoder LM built from cake modules.

Structure (``x`` is ``[B, T, d_model]``)::

    x = tok_emb(idx) + pos_emb(arange(T))
    for block in blocks:
        x = x + block.mixer(block.norm1(x))     # causal self-attention, GDN or KDA
        x = x + block.mlp(block.norm2(x))       # Linear -> GELU/SiLU -> Linear, or MoE
    loss = cross_entropy(lm_head(norm_f(x)), targets)   # fused in the cake model
    loss = loss + sum of the MoE blocks' aux losses      # training mode, with moe_experts

With ``mhc = n`` (``--mhc N``: 2, 4 or 8; 0, the default, is the plain residual above) the
residual is widened into n streams X ``[B, T, n, d]`` (n copies of the embeddings) and every
sub-layer becomes a manifold-constrained hyper-connection (DeepSeek mHC) around the same
branch: ``X = HC(X, branch=lambda u: mixer(norm1(u)))``, then the MLP alike; the mean of the
streams feeds ``norm_f``. The cake build runs ``cake_mhc_det_train.HyperConnection``, the
torch build :class:`HyperConnectionTorch` (the same math and parameters in plain torch).

Every norm is built by :func:`make_norm`, every projection by :func:`make_linear`, the
output head by :func:`make_head`, every mixer by :func:`make_mixer`, every MLP by
:func:`make_mlp`. ``impl="cake"`` uses cake's modules:

- norms: ``cake_rmsnorm_det_train.RMSNorm``;
- projections (attention ``qkv``/``proj``, MLP ``fc1``/``fc2``):
  ``cake_dense_projection_det_gemm.Linear``;
- the attention core (``mixer="attention"``): ``cake_gqa_det_train.gqa_det``;
- head + loss: ``cake_lm_head_loss_det_train.LMHeadLoss`` (``lm_head.weight`` ``[V, d]``),
  which computes the cross entropy chunk by chunk without materializing the logits;
- with ``mixer="gdn"``, the Gated DeltaNet layer ``cake_gdn_det_train.GatedDeltaNet``
  (FLA's layer: projections, short convs on ``cake_causal_conv1d_det_train``, the core
  ``chunk_gated_delta_rule_det``, the gated output norm on
  ``cake_rmsnorm_silu_gate_det_train``) as :class:`GatedDeltaNet`;
- with ``mixer="kda"``, the Kimi Delta Attention layer
  ``cake_kda_det_train.KimiDeltaAttention`` (the same parts, the core ``chunk_kda_det``)
  as :class:`KimiDeltaAttention`;
- with ``moe_experts`` > 0, every block's MLP is
  ``cake_moe_grouped_det_gemm.MoEFeedForward`` (top-k router, SwiGLU experts on the det
  grouped GEMM), imported only then.

``impl="torch"`` uses ``torch.nn.RMSNorm``, ``torch.nn.Linear`` and ``nn.Linear`` +
``F.cross_entropy`` with the same parameter names and shapes, so one ``state_dict`` loads
into both. Token and position embeddings are plain torch in both; the cake build's
attention core is ``cake_gqa_det_train.gqa_det``, the torch build's is plain torch; the
torch build's Gated DeltaNet and Kimi Delta Attention mixers are the same layers built with
``impl="torch"`` (``torch.nn.Linear``, ``F.conv1d``, the families' token-by-token
reference cores in fp32, an fp32 gated norm; the same parameters), its MoE
:class:`MoEFeedForwardTorch` (every expert on every token, masked; same routing rule).

The torch build's attention is written out in plain torch (``softmax(QK^T / sqrt(d)) V``
with an explicit causal mask) rather than ``scaled_dot_product_attention``, so that its CUDA
backward stays deterministic under ``torch.use_deterministic_algorithms(True)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from cake_dense_projection_det_gemm import Linear as CakeLinear
from cake_dense_projection_det_gemm import dense_projection_det
from cake_gdn_det_train.layers import GatedDeltaNet as _GDNLayer
from cake_kda_det_train.layers import KimiDeltaAttention as _KDALayer
from cake_lm_head_loss_det_train import LMHeadLoss as CakeLMHeadLoss
from cake_rmsnorm_det_train import RMSNorm as CakeRMSNorm
from torch import nn

__all__ = [
    "CausalSelfAttention",
    "Block",
    "GatedDeltaNet",
    "HyperConnectionTorch",
    "KimiDeltaAttention",
    "MIXERS",
    "MLP",
    "MoEFeedForwardTorch",
    "ModelConfig",
    "TinyLM",
    "build_model",
    "make_head",
    "make_linear",
    "make_mixer",
    "make_mlp",
    "make_norm",
]

Impl = Literal["cake", "torch"]
IMPLS: tuple[str, ...] = ("cake", "torch")
MIXERS: tuple[str, ...] = ("attention", "gdn", "kda")
#: accepted ``ModelConfig.mhc`` values (0: no hyper-connections).
MHC_STREAMS: tuple[int, ...] = (0, 2, 4, 8)
#: Sinkhorn-Knopp iterations of every hyper-connection (the paper's 20).
MHC_SINKHORN_ITERS = 20


#: Head dims of the attention mixer (those cake-gqa-det-train serves).
ATTN_HEAD_DIMS = (64, 128, 256)


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of :class:`TinyLM`.

    Attributes:
        vocab_size: number of token ids (256 for bytes).
        d_model: residual width; must be divisible by ``n_heads``.
        n_layers: number of blocks.
        n_heads: attention heads.
        attn_head_dim: head dim of the attention mixer (q, k and v), 64, 128 or 256 (what
            cake-gqa-det-train serves; transformers' ``head_dim``): its projections are
            ``d_model -> 3 * n_heads * attn_head_dim`` and back.
        max_seq_len: longest sequence (size of the learned position table).
        mlp_ratio: MLP hidden width = ``mlp_ratio * d_model``.
        activation: ``"gelu"`` (tanh approximation) or ``"silu"``.
        norm_eps: epsilon of every RMSNorm.
        mixer: token mixer of every block: ``"attention"`` (causal self-attention),
            ``"gdn"`` (Gated DeltaNet, :class:`GatedDeltaNet`) or ``"kda"`` (Kimi Delta
            Attention, :class:`KimiDeltaAttention`); the last two with ``n_heads`` heads of
            ``d_model // n_heads`` for q, k and v.
        moe_experts: 0 (default): every block's MLP is the dense :class:`MLP`. E >= 1:
            a mixture-of-experts feed-forward of E SwiGLU experts of width
            ``mlp_ratio * d_model`` each (``activation`` is then unused) and a top-k
            softmax router (cake's ``MoEFeedForward``, or :class:`MoEFeedForwardTorch`).
        moe_top_k: experts per token, ``1 <= moe_top_k <= moe_experts`` (0 when dense).
        mhc: residual streams of manifold-constrained hyper-connections around every
            sub-layer (2, 4 or 8), or 0 (default) for the plain residual.
    """

    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    attn_head_dim: int = 64
    max_seq_len: int = 128
    mlp_ratio: int = 4
    activation: str = "gelu"
    norm_eps: float = 1e-5
    mixer: str = "attention"
    moe_experts: int = 0
    moe_top_k: int = 0
    mhc: int = 0

    def __post_init__(self) -> None:
        if self.moe_experts < 0 or not (
                (self.moe_experts == 0 and self.moe_top_k == 0)
                or 1 <= self.moe_top_k <= self.moe_experts):
            raise ValueError(f"moe: top-k must be in [1, experts] (or both 0 for the dense "
                             f"MLP), got experts={self.moe_experts}, top_k={self.moe_top_k}")
        if self.attn_head_dim not in ATTN_HEAD_DIMS:
            raise ValueError(f"attn_head_dim must be one of {ATTN_HEAD_DIMS} (cake-gqa-det-"
                             f"train's head dims), got {self.attn_head_dim!r}")
        if self.mhc not in MHC_STREAMS:
            raise ValueError(f"mhc must be one of {MHC_STREAMS}, got {self.mhc!r}")
        if self.mhc and self.moe_experts:
            raise ValueError("mhc and moe together are not supported yet (the hyper-connection "
                             "branch takes one tensor, the MoE feed-forward returns two)")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {MIXERS}, got {self.mixer!r}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps}")

    def to_dict(self) -> dict[str, object]:
        """Plain ``dict`` of the fields (JSON-serialisable)."""
        return asdict(self)


_ACTIVATIONS = {"gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}


def _check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


# --------------------------------------------------------------------------- factories
def make_norm(dim: int, eps: float, impl: Impl = "cake") -> nn.Module:
    """Build one RMSNorm over the last dimension (``weight`` ``[dim]``).

    Args:
        dim: normalized size ``H``; input ``[..., H]``, output same shape and dtype.
        eps: epsilon added to the mean square.
        impl: ``"cake"`` -> ``cake_rmsnorm_det_train.RMSNorm`` (deterministic backward),
            ``"torch"`` -> ``torch.nn.RMSNorm``.

    Raises:
        ValueError: on an unknown ``impl``.
    """
    _check_impl(impl)
    cls = CakeRMSNorm if impl == "cake" else nn.RMSNorm
    return cls(dim, eps=eps)


def make_linear(in_features: int, out_features: int, bias: bool = True,
                impl: Impl = "cake") -> nn.Module:
    """Build one dense projection ``y = x Wᵀ + b`` (``weight`` ``[out, in]``, ``bias`` ``[out]``).

    Args:
        in_features, out_features: ``K`` and ``N``; input ``[..., K]``, output ``[..., N]``
            in the input's dtype.
        bias: whether the projection has a bias.
        impl: ``"cake"`` -> ``cake_dense_projection_det_gemm.Linear`` (deterministic GEMMs,
            fixed-order weight-gradient sum), ``"torch"`` -> ``torch.nn.Linear``. Same
            arguments, parameter names and initialization.

    Raises:
        ValueError: on an unknown ``impl``.
    """
    _check_impl(impl)
    cls = CakeLinear if impl == "cake" else nn.Linear
    return cls(in_features, out_features, bias=bias)


def make_head(d_model: int, vocab_size: int, impl: Impl = "cake") -> nn.Module:
    """Build the output head (no bias, ``weight`` ``[vocab_size, d_model]``).

    Args:
        d_model: hidden size ``H``.
        vocab_size: number of classes ``V``.
        impl: ``"cake"`` -> ``cake_lm_head_loss_det_train.LMHeadLoss`` (head and mean cross
            entropy fused, called as ``head(hidden, labels) -> loss``; the logits are never
            materialized), ``"torch"`` -> ``torch.nn.Linear(d_model, vocab_size,
            bias=False)`` (called as ``head(hidden) -> logits``; :class:`TinyLM` applies
            ``F.cross_entropy``). Both own ``weight`` ``[V, H]`` with ``nn.Linear``'s init.

    Raises:
        ValueError: on an unknown ``impl``.
    """
    _check_impl(impl)
    if impl == "cake":
        return CakeLMHeadLoss(d_model, vocab_size, bias=False)
    return nn.Linear(d_model, vocab_size, bias=False)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: ``n_heads`` heads of ``attn_head_dim``.

    Parameters: ``qkv`` (``Linear(d, 3 * n_heads * attn_head_dim)``), ``proj``
    (``Linear(n_heads * attn_head_dim, d)``), both built by :func:`make_linear`. The core:
    ``impl="cake"`` -> ``cake_gqa_det_train.gqa_det`` (causal; dQ, dK, dV in a fixed
    order); ``impl="torch"`` -> plain torch (``softmax(QK^T / sqrt(hd)) V`` with an
    explicit causal mask, no SDPA, so its CUDA backward stays deterministic under
    ``torch.use_deterministic_algorithms(True)``).
    Input ``[B, T, d]`` with ``T <= max_seq_len``; output ``[B, T, d]``, same dtype.
    """

    def __init__(self, cfg: ModelConfig, impl: Impl = "cake") -> None:
        super().__init__()
        self.impl = impl
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.attn_head_dim
        inner = cfg.n_heads * cfg.attn_head_dim
        self.qkv = make_linear(cfg.d_model, 3 * inner, impl=impl)
        self.proj = make_linear(inner, cfg.d_model, impl=impl)
        if impl == "torch":
            mask = torch.ones(cfg.max_seq_len, cfg.max_seq_len, dtype=torch.bool).tril()
            self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        inner = self.n_heads * self.head_dim
        q, k, v = (z.view(b, t, self.n_heads, self.head_dim)
                   for z in self.qkv(x).split(inner, dim=-1))
        if self.impl == "cake":
            from cake_gqa_det_train import gqa_det

            y = gqa_det(q, k, v, causal=True)
        else:
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            att = att.masked_fill(~self.causal_mask[:t, :t], float("-inf"))
            y = (torch.softmax(att, dim=-1) @ v).transpose(1, 2)
        return self.proj(y.reshape(b, t, inner))


#: kernel size of the short causal convolutions of the GDN and KDA layers (FLA's default).
SHORT_CONV_SIZE = 4


def _layer_args(cfg: ModelConfig, impl: Impl) -> dict:
    """FLA layer arguments of tinylm's GDN / KDA mixer: ``n_heads`` heads with
    ``K = V = d_model // n_heads`` (``expand_v=1``), short conv size 4, ``cfg.norm_eps``."""
    return dict(hidden_size=cfg.d_model, expand_v=1, head_dim=cfg.d_model // cfg.n_heads,
                num_heads=cfg.n_heads, conv_size=SHORT_CONV_SIZE, norm_eps=cfg.norm_eps,
                impl=impl)


def _qkv_cp(layer: nn.Module, x: torch.Tensor, cp) -> tuple[torch.Tensor, ...]:
    """``(q, k, v)`` ``[1, T_r, H, K]`` of a GDN / KDA layer on this rank's tokens
    ``[1, T_r, d]``: each projection's short conv (SiLU, no bias) takes the rows before
    each fragment from the ranks that hold them
    (``cake_causal_conv1d_det_train_kcp.causal_conv1d_det_kcp``; dweight is this rank's
    share, summed across ranks with every other gradient by the CP trainer)."""
    from cake_causal_conv1d_det_train_kcp import causal_conv1d_det_kcp

    if layer.impl != "cake":
        raise ValueError("cp: only the cake build has a context-parallel route")
    out = []
    for name, heads, dim in (("q", layer.num_heads, layer.head_k_dim),
                             ("k", layer.num_heads, layer.head_k_dim),
                             ("v", layer.num_v_heads, layer.head_v_dim)):
        conv = getattr(layer, f"{name}_conv1d")
        w = conv.weight.reshape(conv.weight.shape[0], conv.weight.shape[-1])
        y = causal_conv1d_det_kcp(getattr(layer, f"{name}_proj")(x), w, None, cp.ctx,
                                  activation="silu")
        out.append(y.unflatten(-1, (heads, dim)))
    return tuple(out)


class GatedDeltaNet(_GDNLayer):
    """tinylm's ``gdn`` mixer: ``cake_gdn_det_train.GatedDeltaNet`` (FLA's Gated DeltaNet
    layer: its parameters, ``state_dict`` keys and initialisation, ``A_log`` and
    ``dt_bias`` included) with ``n_heads`` heads of ``K = V = d_model // n_heads``, called
    as ``mixer(x) -> o`` on ``[B, T, d]``.

    ``impl="cake"`` runs the layer on cake's kernels; ``impl="torch"`` is the layer's plain
    torch build (``torch.nn.Linear``, ``F.conv1d``, the token-by-token reference core in
    fp32, an fp32 gated norm), the same parameters. ``mixer(x, cp=...)`` (a
    :class:`cake_tinylm.cp.CPContext`, cake only) runs it on this rank's ``[1, T_r, d]``
    of a context-parallel packed batch: the short convs and the core
    (``cake_gdn_det_train_kcp``) exchange across ranks, the gate
    ``-exp(A_log) softplus(a + dt_bias)`` and beta's sigmoid run in fp32 torch.
    """

    def __init__(self, cfg: ModelConfig, impl: Impl = "cake") -> None:
        _check_impl(impl)
        super().__init__(**_layer_args(cfg, impl))

    def forward(self, x: torch.Tensor, cp=None) -> torch.Tensor:
        if cp is None:
            return super().forward(x)[0]
        from cake_gdn_det_train.reference import gdn_gate_reference
        from cake_gdn_det_train_kcp import chunk_gated_delta_rule_det_kcp

        q, k, v = _qkv_cp(self, x, cp)
        g = gdn_gate_reference(self.a_proj(x).float(), self.A_log, self.dt_bias)
        beta = self.b_proj(x).float().sigmoid()
        o = chunk_gated_delta_rule_det_kcp(q, k, v, g, beta, cp.ctx,
                                           use_qk_l2norm_in_kernel=True)
        o = self.o_norm(o, self.g_proj(x).unflatten(-1, (self.num_v_heads, self.head_v_dim)))
        return self.o_proj(o.flatten(-2))


class KimiDeltaAttention(_KDALayer):
    """tinylm's ``kda`` mixer: ``cake_kda_det_train.KimiDeltaAttention`` (FLA's Kimi Delta
    Attention layer: its parameters, ``state_dict`` keys and initialisation, ``A_log`` and
    ``dt_bias`` included) with ``n_heads`` heads of ``K = V = d_model // n_heads``, called
    as ``mixer(x) -> o`` on ``[B, T, d]``.

    ``impl="cake"`` runs the layer on cake's kernels; ``impl="torch"`` is the layer's plain
    torch build (``torch.nn.Linear``, ``F.conv1d``, the token-by-token reference core in
    fp32, an fp32 gated norm), the same parameters. ``mixer(x, cp=...)`` (a
    :class:`cake_tinylm.cp.CPContext`, cake only) runs it on this rank's ``[1, T_r, d]``
    of a context-parallel packed batch: the short convs and the core
    (``cake_kda_det_train_kcp``, gate in the kernel) exchange across ranks, beta's sigmoid
    runs in fp32 torch.
    """

    def __init__(self, cfg: ModelConfig, impl: Impl = "cake") -> None:
        _check_impl(impl)
        super().__init__(**_layer_args(cfg, impl))

    def forward(self, x: torch.Tensor, cp=None) -> torch.Tensor:
        if cp is None:
            return super().forward(x)[0]
        from cake_kda_det_train_kcp import chunk_kda_det_kcp

        q, k, v = _qkv_cp(self, x, cp)
        f = self.f_proj(x).unflatten(-1, (self.num_heads, self.head_k_dim))
        beta = self.b_proj(x).float().sigmoid()
        o = chunk_kda_det_kcp(q, k, v, f, beta, cp.ctx, A_log=self.A_log,
                              dt_bias=self.dt_bias, use_qk_l2norm_in_kernel=True,
                              use_gate_in_kernel=True, reduce_gate_param_grads=False)
        o = self.o_norm(o, self.g_proj(x).unflatten(-1, (self.num_heads, self.head_v_dim)))
        return self.o_proj(o.flatten(-2))


class MLP(nn.Module):
    """``fc2(act(fc1(x)))``; input/output ``[..., d]``, hidden ``mlp_ratio * d``.

    ``fc1``, ``fc2`` are built by :func:`make_linear` (cake's ``Linear`` for ``impl="cake"``).
    """

    def __init__(self, cfg: ModelConfig, impl: Impl = "cake") -> None:
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.d_model
        self.fc1 = make_linear(cfg.d_model, hidden, impl=impl)
        self.fc2 = make_linear(hidden, cfg.d_model, impl=impl)
        self.act = _ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


#: weight of every MoE block's load-balancing loss in the training loss.
MOE_AUX_LOSS_COEF = 0.01


class MoEFeedForwardTorch(nn.Module):
    """The MoE feed-forward of ``cake_moe_grouped_det_gemm.MoEFeedForward`` in plain torch
    (the torch build's): same parameters (``router_weight`` ``[E, d]``, ``w_gate_up``
    ``[E, 2f, d]`` gate rows first, ``w_down`` ``[E, d, f]``), same routing rule (fp32
    softmax of ``x Rᵀ``, top-k by a stable descending sort: ties to the lower expert index,
    weights renormalised), same aux loss; every expert runs on every token and a
    ``[T, E]`` combine matrix (zero off the top-k) weights them, summed over experts in
    fp32. Input ``[..., d]``; returns ``(y, aux_loss)``. Dense, so E times the MLP cost."""

    def __init__(self, d_model: int, d_ff: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.d_ff, self.num_experts, self.top_k = d_ff, num_experts, top_k
        self.router_weight = nn.Parameter(torch.empty(num_experts, d_model))
        self.w_gate_up = nn.Parameter(torch.empty(num_experts, 2 * d_ff, d_model))
        self.w_down = nn.Parameter(torch.empty(num_experts, d_model, d_ff))
        with torch.no_grad():
            for p, fan_in in ((self.router_weight, d_model), (self.w_gate_up, d_model),
                              (self.w_down, d_ff)):
                p.uniform_(-fan_in ** -0.5, fan_in ** -0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        E, f, k = self.num_experts, self.d_ff, self.top_k
        x2 = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(F.linear(x2.float(), self.router_weight.float()), dim=-1)
        ids = torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices[:, :k]
        mask = F.one_hot(ids, E).to(probs.dtype)                         # [T, k, E]
        w = (probs[:, None, :] * mask).sum(-1)                           # [T, k]
        w = w / w.sum(-1, keepdim=True)
        combine = (w[:, :, None] * mask).sum(1)                          # [T, E]
        y = torch.zeros(x2.shape, dtype=torch.float32, device=x.device)
        for e in range(E):
            h = F.linear(x2, self.w_gate_up[e])
            o = F.linear(F.silu(h[:, :f]) * h[:, f:], self.w_down[e])
            y = y + combine[:, e, None] * o.float()
        frac = mask.sum((0, 1)) / max(ids.numel(), 1)
        aux = MOE_AUX_LOSS_COEF * E * (frac * probs.sum(0) / max(x2.shape[0], 1)).sum()
        return y.to(x.dtype).view(x.shape), aux


def make_mixer(cfg: ModelConfig, impl: Impl = "cake") -> nn.Module:
    """Build a block's token mixer, by ``cfg.mixer``: ``"attention"`` ->
    :class:`CausalSelfAttention` whose ``qkv`` and ``proj`` projections are ``impl``'s Linear
    and whose core is cake-gqa-det-train (cake) or plain torch; ``"gdn"`` ->
    :class:`GatedDeltaNet` (cake-gdn-det-train's layer, its ``impl``); ``"kda"`` ->
    :class:`KimiDeltaAttention` (cake-kda-det-train's layer, its ``impl``).

    Raises:
        ValueError: on an unknown ``impl``.
    """
    _check_impl(impl)
    if cfg.mixer == "gdn":
        return GatedDeltaNet(cfg, impl)
    if cfg.mixer == "kda":
        return KimiDeltaAttention(cfg, impl)
    return CausalSelfAttention(cfg, impl)


def make_mlp(cfg: ModelConfig, impl: Impl = "cake") -> nn.Module:
    """Build a block's channel MLP: :class:`MLP` with ``impl``'s Linear for ``fc1``, ``fc2``;
    with ``cfg.moe_experts`` > 0 a mixture of experts called as ``mlp(x) -> (y, aux_loss)``:
    ``cake_moe_grouped_det_gemm.MoEFeedForward(d_model, mlp_ratio * d_model, moe_experts,
    moe_top_k, aux_loss_coef=MOE_AUX_LOSS_COEF)`` (cake) or :class:`MoEFeedForwardTorch`.

    Raises:
        ValueError: on an unknown ``impl``.
    """
    _check_impl(impl)
    if cfg.moe_experts:
        args = (cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.moe_experts, cfg.moe_top_k)
        if impl == "torch":
            return MoEFeedForwardTorch(*args)
        from cake_moe_grouped_det_gemm import MoEFeedForward

        return MoEFeedForward(*args, aux_loss_coef=MOE_AUX_LOSS_COEF)
    return MLP(cfg, impl)


class HyperConnectionTorch(nn.Module):
    """``cake_mhc_det_train.HyperConnection`` in plain torch: the same parameters (``phi``
    ``[n d, 2n + n^2]``, ``alpha`` ``[3]``, ``bias`` ``[2n + n^2]``, fp32), initialisation
    and math (DeepSeek mHC), calling no cake code. Per token, X ``[n, d]``::

        mix = (vec(X) @ phi) / sqrt(mean(vec(X)^2) + 1e-6)
        H_pre = sigmoid(alpha[0] mix[:n] + bias[:n]),  H_post = 2 sigmoid(alpha[1] ...)
        H_res = Sinkhorn(exp(alpha[2] mix[2n:] + bias[2n:]) as [n, n]), 20 iterations
        Y[j] = H_post[j] branch(sum_i H_pre[i] X[i]) + sum_i H_res[j, i] X[i]

    ``branch`` is any callable ``[..., d] -> [..., d]`` (not registered here).
    """

    def __init__(self, branch, hidden_size: int, n_streams: int, *,
                 sinkhorn_iters: int = MHC_SINKHORN_ITERS, eps: float = 1e-6) -> None:
        super().__init__()
        self.branch, self.n_streams, self.sinkhorn_iters, self.eps = (
            branch, n_streams, sinkhorn_iters, eps)
        m = 2 * n_streams + n_streams * n_streams
        self.phi = nn.Parameter(torch.empty(n_streams * hidden_size, m))
        self.alpha = nn.Parameter(torch.empty(3))
        self.bias = nn.Parameter(torch.empty(m))
        with torch.no_grad():
            nn.init.normal_(self.phi, std=0.02)
            self.alpha.fill_(0.01)
            self.bias.zero_()
            self.bias[:n_streams] = math.log(1.0 / (n_streams - 1))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        n, d = X.shape[-2], X.shape[-1]
        phi, alpha, bias = (p.float() for p in (self.phi, self.alpha, self.bias))
        x = X.float().reshape(*X.shape[:-2], n * d)
        mix = (x @ phi) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        h_pre = torch.sigmoid(alpha[0] * mix[..., :n] + bias[:n])
        h_post = 2 * torch.sigmoid(alpha[1] * mix[..., n:2 * n] + bias[n:2 * n])
        logits = (alpha[2] * mix[..., 2 * n:] + bias[2 * n:]).reshape(*X.shape[:-2], n, n)
        h_res = torch.exp(logits - logits.amax(-1, keepdim=True))
        for _ in range(self.sinkhorn_iters):
            h_res = h_res / h_res.sum(-1, keepdim=True)
            h_res = h_res / h_res.sum(-2, keepdim=True)
        u = (h_pre.unsqueeze(-1) * X.float()).sum(-2).to(X.dtype)
        b = self.branch(u).float()
        y = h_post.unsqueeze(-1) * b.unsqueeze(-2) + h_res @ X.float()
        return y.to(X.dtype)


def make_hyper_connection(branch, cfg: ModelConfig, impl: Impl = "cake") -> nn.Module:
    """One hyper-connection of ``cfg.mhc`` streams of width ``d_model`` around ``branch``
    (a callable, not registered): ``cake_mhc_det_train.HyperConnection`` (``impl="cake"``)
    or :class:`HyperConnectionTorch`. Both own ``phi``, ``alpha``, ``bias``.

    Raises:
        ValueError: on an unknown ``impl`` or ``cfg.mhc == 0``.
    """
    _check_impl(impl)
    if not cfg.mhc:
        raise ValueError("make_hyper_connection: cfg.mhc is 0 (no hyper-connections)")
    if impl == "cake":
        from cake_mhc_det_train import HyperConnection

        return HyperConnection(branch, cfg.d_model, cfg.mhc, sinkhorn_iters=MHC_SINKHORN_ITERS)
    return HyperConnectionTorch(branch, cfg.d_model, cfg.mhc)


# --------------------------------------------------------------------------- model
class Block(nn.Module):
    """Pre-norm residual block: ``x + mixer(norm1(x))`` then ``x + mlp(norm2(x))``; an MoE
    mlp's aux loss is appended to ``aux_losses`` when a list is given.

    With ``cfg.mhc = n`` the block maps streams X ``[B, T, n, d]`` to ``[B, T, n, d]``:
    ``X = mhc_mixer(X)`` around ``mixer(norm1(u))``, then ``X = mhc_mlp(X)`` around
    ``mlp(norm2(u))`` (two hyper-connections, :func:`make_hyper_connection`; the norms,
    mixer and MLP keep their names and parameters).
    """

    def __init__(self, cfg: ModelConfig, impl: Impl = "cake") -> None:
        super().__init__()
        self.norm1 = make_norm(cfg.d_model, cfg.norm_eps, impl)
        self.mixer = make_mixer(cfg, impl)
        self.norm2 = make_norm(cfg.d_model, cfg.norm_eps, impl)
        self.mlp = make_mlp(cfg, impl)
        if cfg.mhc:
            self.mhc_mixer = make_hyper_connection(self._mixer_branch, cfg, impl)
            self.mhc_mlp = make_hyper_connection(self._mlp_branch, cfg, impl)

    def _mixer_branch(self, u: torch.Tensor) -> torch.Tensor:
        return self.mixer(self.norm1(u))

    def _mlp_branch(self, u: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm2(u))

    def forward(self, x: torch.Tensor, cp=None, aux_losses: list | None = None) -> torch.Tensor:
        if hasattr(self, "mhc_mixer"):
            if cp is not None:
                raise ValueError("cp: hyper-connections (mhc) have no context-parallel route")
            return self.mhc_mlp(self.mhc_mixer(x))
        h = self.norm1(x)
        x = x + (self.mixer(h) if cp is None else self.mixer(h, cp=cp))
        y = self.mlp(self.norm2(x))
        if isinstance(y, tuple):  # MoE: (y, aux_loss)
            y, aux = y
            if aux_losses is not None:
                aux_losses.append(aux)
        return x + y


class TinyLM(nn.Module):
    """Byte-level decoder LM.

    Args:
        cfg: the :class:`ModelConfig`.
        impl: ``"cake"`` (cake RMSNorm, cake Linear for every projection, cake fused
            LM head + cross entropy) or ``"torch"`` (``torch.nn.RMSNorm``,
            ``torch.nn.Linear``, ``F.cross_entropy``); both have identical parameter names
            and shapes.

    Raises:
        ValueError: on an unknown ``impl``.
    """

    def __init__(self, cfg: ModelConfig, impl: Impl = "cake") -> None:
        super().__init__()
        _check_impl(impl)
        self.cfg = cfg
        self.impl = impl
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, impl) for _ in range(cfg.n_layers))
        self.norm_f = make_norm(cfg.d_model, cfg.norm_eps, impl)
        self.lm_head = make_head(cfg.d_model, cfg.vocab_size, impl)
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2 style: N(0, 0.02) for embeddings and linears, zero biases, residual
        # projections (a mixer's proj / o_proj, the MLP's fc2, the MoE's w_down) scaled by
        # 1/sqrt(2 * n_layers). RMSNorm weights stay at one; conv weights keep their init.
        std = 0.02
        for name, p in self.named_parameters():
            if name.endswith(("A_log", "dt_bias")):  # the GDN / KDA blocks' own init
                continue
            if ".mhc_" in name:  # hyper-connections keep their own init
                continue
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.endswith((".proj.weight", ".o_proj.weight", ".fc2.weight", ".w_down")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layers))
            elif p.dim() == 2 or name.endswith(".w_gate_up"):  # stacked MoE experts: 3-D
                nn.init.normal_(p, 0.0, std)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, *,
        positions: torch.Tensor | None = None, cp=None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the LM.

        Args:
            idx: ``int64`` token ids ``[B, T]`` in ``[0, vocab_size)``,
                ``1 <= T <= max_seq_len``.
            targets: optional ``int64`` ``[B, T]`` next-token ids.
            positions: optional ``int64`` ``[B, T]`` (or ``[1, T]``) position of each token
                in its window (default ``arange(T)``), each ``< max_seq_len``.
            cp: a :class:`cake_tinylm.cp.CPContext`: ``idx`` is this rank's ``[1, T_r]``
                share of a context-parallel packed batch (GDN / KDA mixers only, the cake
                build); ``T_r`` may then exceed ``max_seq_len``.

        Returns:
            ``(logits, loss)``. Without targets: logits ``[B, T, vocab_size]`` in the
            parameter dtype (the cake model runs the head through cake's dense projection)
            and ``None``. With targets: loss is a ``float32`` scalar (mean cross entropy,
            computed in fp32); the cake model fuses head and loss and never materializes
            the logits, so its logits are ``None``; the torch model returns them. With
            ``moe_experts`` in training mode the loss also holds the sum over blocks of
            the MoE load-balancing losses (not in eval mode: validation is pure CE).

        Raises:
            ValueError: if ``idx`` is not 2-D or ``T`` exceeds ``max_seq_len``,
                ``targets`` has a different shape, or ``positions`` is not int64 ``[B, T]``
                / ``[1, T]`` with values in ``[0, max_seq_len)`` (values checked for CPU
                tensors only: no device sync).
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must be [B, T], got shape {tuple(idx.shape)}")
        t = idx.shape[1]
        if cp is None and not 1 <= t <= self.cfg.max_seq_len:
            raise ValueError(f"sequence length {t} not in [1, {self.cfg.max_seq_len}]")
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(
                f"targets shape {tuple(targets.shape)} != idx shape {tuple(idx.shape)}"
            )
        if positions is not None:
            if (not isinstance(positions, torch.Tensor) or positions.dtype != torch.int64
                    or positions.dim() != 2 or positions.shape[1] != t
                    or positions.shape[0] not in (1, idx.shape[0])):
                raise ValueError(f"positions must be int64 [B, T] or [1, T] with T = {t}, got "
                                 f"{getattr(positions, 'dtype', type(positions).__name__)} "
                                 f"{tuple(getattr(positions, 'shape', ()))}")
            # values: read on the host only where that costs no device sync (CPU tensors;
            # on a GPU the CP job builds them in range by construction)
            if positions.numel() and positions.device.type == "cpu" \
                    and not torch.compiler.is_compiling():
                lo, hi = int(positions.min()), int(positions.max())
                if lo < 0 or hi >= self.cfg.max_seq_len:
                    raise ValueError(f"positions must lie in [0, {self.cfg.max_seq_len}), got "
                                     f"values in [{lo}, {hi}]")
        if positions is None:
            x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))[None]
        else:
            x = self.tok_emb(idx) + self.pos_emb(positions)
        aux_losses: list[torch.Tensor] = []
        n = self.cfg.mhc
        if n:
            if cp is not None:
                raise ValueError("cp: hyper-connections (mhc) have no context-parallel route")
            if self.impl == "cake":
                from cake_mhc_det_train import expand_streams

                x = expand_streams(x, n)  # [B, T, n, d]: n copies
            else:
                x = x.unsqueeze(-2).expand(*x.shape[:-1], n, x.shape[-1]).contiguous()
        for block in self.blocks:
            x = block(x, aux_losses=aux_losses) if cp is None else block(x, cp=cp)
        if n:
            x = x.mean(dim=-2)  # collapse the streams (cake_mhc_det_train.collapse_streams)
        h = self.norm_f(x)
        if targets is None:
            if self.impl == "cake":
                return dense_projection_det(h, self.lm_head.weight), None
            return self.lm_head(h), None
        logits = None if self.impl == "cake" else self.lm_head(h)
        if self.impl == "cake":
            loss = self.lm_head(h, targets)
        else:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                   targets.reshape(-1))
        if self.training:
            for aux in aux_losses:  # block order
                loss = loss + aux
        return logits, loss


def build_model(
    cfg: ModelConfig,
    impl: Impl = "cake",
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> TinyLM:
    """Construct a :class:`TinyLM` (initialised from the current torch RNG state).

    Args:
        cfg: model hyper-parameters.
        impl: ``"cake"`` or ``"torch"`` modules (see :class:`TinyLM`).
        device: target device.
        dtype: parameter dtype (``torch.float32`` or ``torch.bfloat16``).

    Raises:
        ValueError: on an unknown ``impl`` or an unsupported ``dtype``.
    """
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
    return TinyLM(cfg, impl).to(device=device, dtype=dtype)
