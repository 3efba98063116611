"""What the families' whole layers (FLA's ``fla.layers`` drop-ins) share: the checks of
FLA's layer arguments, the q / k / v projections with their short convolutions, the
padding mask turned into packed documents and back (FLA's ``get_unpad_data`` /
``pad_input``), and the plain-torch parts of their ``impl="torch"`` build (the same
parameters run without cake's kernels: a baseline to compare against)."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from cake_core.plan import cached_plan

#: a layer's ``impl``: ``"cake"`` (cake's kernels) or ``"torch"`` (plain torch, same parameters)
IMPLS: tuple[str, ...] = ("cake", "torch")


def check_impl(impl) -> str:
    """``impl`` if it is one of :data:`IMPLS`, else ``ValueError``."""
    if not isinstance(impl, str) or impl not in IMPLS:
        raise ValueError(f"impl: one of {IMPLS}, got {impl!r}")
    return impl


def positive_int(name: str, v) -> int:
    """``v`` if it is an int >= 1, else ``ValueError``."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: must be an int >= 1, got {v!r}")
    return v


def head_dims(head_dim: int, expand_v: float, num_heads: int,
              num_v_heads: int | None) -> tuple[int, int, int]:
    """``(K, V, HV)`` of FLA's layer arguments (``V = head_dim * expand_v``, ``HV`` defaults
    to ``num_heads`` and is a multiple of it), or ``ValueError``."""
    positive_int("head_dim", head_dim)
    positive_int("num_heads", num_heads)
    hv = num_heads if num_v_heads is None else positive_int("num_v_heads", num_v_heads)
    if hv % num_heads:
        raise ValueError(f"num_v_heads ({hv}) must be a multiple of num_heads ({num_heads})")
    v = head_dim * expand_v
    if isinstance(expand_v, bool) or not math.isclose(v, round(v)) or round(v) < 1:
        raise ValueError(f"head_dim * expand_v must be a positive integer, got "
                         f"{head_dim} * {expand_v!r}")
    return head_dim, int(round(v)), hv


def check_training_call(mode: str, past_key_values, use_cache, output_attentions) -> None:
    """The FLA layer arguments a training kernel does not serve, as ``ValueError``."""
    if mode not in ("chunk", "fused_recurrent"):
        raise ValueError(f"mode: 'chunk' or 'fused_recurrent', got {mode!r}")
    if use_cache or past_key_values is not None:
        raise ValueError("use_cache / past_key_values: decoding is not served (cake "
                         "serves training); run FLA's layer to generate")
    if output_attentions:
        raise ValueError("output_attentions=True: a linear-attention layer has no "
                         "attention weights (FLA's returns None)")


def build_qkv(layer, Linear, ShortConvolution) -> None:
    """Give ``layer`` FLA's ``q_proj`` / ``k_proj`` / ``v_proj`` (no bias) and, with
    ``layer.use_short_conv``, ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d`` (SiLU), from its
    ``hidden_size``, ``key_dim``, ``value_dim``, ``conv_size`` and ``conv_bias``; the
    module classes are the caller's (cake's dense projection and short convolution)."""
    d, kd, vd = layer.hidden_size, layer.key_dim, layer.value_dim
    layer.q_proj = Linear(d, kd, bias=False)
    layer.k_proj = Linear(d, kd, bias=False)
    layer.v_proj = Linear(d, vd, bias=False)
    if layer.use_short_conv:
        for name, width in (("q", kd), ("k", kd), ("v", vd)):
            setattr(layer, f"{name}_conv1d", ShortConvolution(
                width, layer.conv_size, bias=layer.conv_bias, activation="silu"))


def project_qkv(layer, x: torch.Tensor, cu_seqlens: torch.Tensor | None):
    """``(q, k, v)`` ``[B, T, H * K]`` / ``[B, T, HV * V]`` of a layer made by
    :func:`build_qkv`: projected, then its short convolutions (each document from a zero
    state), or SiLU alone without them, as FLA's layers."""
    q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
    if not layer.use_short_conv:
        return tuple(torch.nn.functional.silu(t) for t in (q, k, v))
    return tuple(getattr(layer, f"{n}_conv1d")(t, cu_seqlens=cu_seqlens)[0]
                 for n, t in zip("qkv", (q, k, v), strict=True))


class Unpadded(NamedTuple):
    """A layer's input as its kernels take it: ``x`` (``[B, T, D]``, or the kept tokens
    packed as ``[1, T', D]``), ``cu_seqlens`` (or None) and ``keep`` (the kept positions
    of the flattened ``[B * T]``, or None when nothing was unpadded)."""

    x: torch.Tensor
    cu_seqlens: torch.Tensor | None
    keep: torch.Tensor | None


def unpad(hidden_states: torch.Tensor, hidden_size: int,
          attention_mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None) -> Unpadded:
    """``hidden_states [B, T, hidden_size]`` with FLA's padding mask ``[B, T]`` of 0 / 1
    (each row's kept tokens become one document, in order) or packed ``cu_seqlens``.

    Raises:
        ValueError: a wrong shape, a mask of the wrong shape, or both a mask and
            ``cu_seqlens``. Nothing the caller owns is modified.
    """
    x = hidden_states
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != hidden_size:
        raise ValueError(f"hidden_states: expected [B, T, {hidden_size}], got "
                         f"{tuple(getattr(x, 'shape', ()))}")
    B, T, _ = x.shape
    if attention_mask is None:
        return Unpadded(x, cu_seqlens, None)
    if tuple(attention_mask.shape) != (B, T):
        raise ValueError(f"attention_mask: expected [B, T] = [{B}, {T}] of 0 / 1 (padding), "
                         f"got {tuple(attention_mask.shape)}")
    if cu_seqlens is not None:
        raise ValueError("attention_mask and cu_seqlens: give one (packed input has no "
                         "padding)")
    mask = attention_mask.bool()
    if bool(mask.all()):
        return Unpadded(x, None, None)
    keep = mask.reshape(-1).nonzero().squeeze(1)
    lens = mask.sum(1, dtype=torch.int32)
    cu = torch.cat([lens.new_zeros(1), lens.cumsum(0, dtype=torch.int32)])
    return Unpadded(x.reshape(B * T, -1).index_select(0, keep).unsqueeze(0), cu, keep)


def pad(o: torch.Tensor, keep: torch.Tensor | None, B: int, T: int) -> torch.Tensor:
    """A packed output ``[1, T', D]`` back to ``[B, T, D]`` (padded positions 0), or ``o``
    as it is when ``keep`` is None."""
    if keep is None:
        return o
    out = o.new_zeros(B * T, o.shape[-1]).index_copy(0, keep, o[0])
    return out.reshape(B, T, o.shape[-1])


# ----------------------------------------------------------------- the impl="torch" build


class ShortConvolutionTorch(nn.Conv1d):
    """Plain-torch stand-in for ``cake_causal_conv1d_det_train.ShortConvolution`` in a
    layer's ``impl="torch"`` build: the same constructor arguments (``hidden_size``,
    ``kernel_size``, ``bias``, ``activation``), the same ``nn.Conv1d`` parameters and
    initialisation (``weight`` ``[D, 1, W]``, ``bias`` ``[D]`` or None).

    ``forward(x, cu_seqlens=None) -> (y, None)``: x ``[B, T, D]`` (packed ``[1, T, D]``
    with ``cu_seqlens`` ``[N + 1]``); ``y[t, c] = act(sum_j w[c, j] x[t - W + 1 + j, c]
    + bias[c])``, each sequence from a zero state, ``act`` SiLU (``"silu"`` / ``"swish"``)
    or none (``None``); y like x.
    """

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False,
                 activation: str | None = "silu") -> None:
        if activation not in (None, "silu", "swish"):
            raise ValueError(f"activation: None, 'silu' or 'swish', got {activation!r}")
        super().__init__(hidden_size, hidden_size, kernel_size, padding=kernel_size - 1,
                         groups=hidden_size, bias=bias)
        self.hidden_size, self.activation = hidden_size, activation

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None):
        W = self.kernel_size[0]
        bounds = [0, x.shape[1]] if cu_seqlens is None else [int(c) for c in cu_seqlens]
        ys = [F.conv1d(F.pad(x[:, s:e].transpose(1, 2), (W - 1, 0)), self.weight, self.bias,
                       groups=self.hidden_size).transpose(1, 2)
              for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
        y = torch.cat(ys, 1)
        return (F.silu(y) if self.activation else y), None


class RMSNormGatedTorch(nn.Module):
    """Plain-torch stand-in for ``cake_rmsnorm_silu_gate_det_train.RMSNormGated`` (norm
    before gate) in a layer's ``impl="torch"`` build: ``weight`` ``[hidden_size]`` (ones),
    ``forward(x, z) = rmsnorm(x) * weight * gate(z)`` over the last dim, in fp32, returned
    in x's dtype; ``gate`` is SiLU (``activation="swish"`` / ``"silu"``) or sigmoid."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *,
                 activation: str = "swish") -> None:
        super().__init__()
        if activation not in ("silu", "swish", "sigmoid"):
            raise ValueError(f"activation: 'silu', 'swish' or 'sigmoid', got {activation!r}")
        self.hidden_size, self.eps, self.activation = hidden_size, eps, activation
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        xf, zf = x.float(), z.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        gate = torch.sigmoid(zf) if self.activation == "sigmoid" else F.silu(zf)
        return (y * gate).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, activation={self.activation}"


def torch_core(reference):
    """A layer's core for its ``impl="torch"`` build: ``reference`` (the family's
    token-by-token spec, called with the keywords of its ``chunk_*_det``) computed in fp32,
    ``o`` returned in v's dtype, as the kernels return it."""

    def core(q, k, v, g, beta, **kwargs):
        o, state = reference(q, k, v, g, beta, dtype=torch.float32, **kwargs)
        return o.to(v.dtype), state

    return core


def kept_states_plan(cache: dict, plan):
    """``plan`` with ``keep_states = 1`` (the core keeps the chunk states for the backward),
    made once per plan and kept in ``cache`` (a dict its caller owns: the GDN and KDA
    entries keep one per package and mode for FLA's ``disable_recompute=True``;
    :func:`cake_core.plan.cached_plan`'s rules: bounded, not consulted while
    ``torch.compile`` traces)."""
    return cached_plan(cache, (plan,), lambda: dataclasses.replace(plan, keep_states=1))
