"""SwiGLU's gate: ``a = silu(g) * u`` (Shazeer, 2020, "GLU Variants Improve Transformer"), one
launch each way, shared by the families whose feed-forward layers gate (the MoE experts, a
dense MLP's gate and up projections).

Forward: ``a = g * sigmoid(g) * u`` computed in fp32 and rounded once to the output dtype
(torch's ``F.silu(g) * u`` in bf16 rounds twice: after the silu and after the product).
Backward, with ``s = sigmoid(g)``: ``dg = da * u * s * (1 + g * (1 - s))``,
``du = da * g * s``, in fp32, each rounded once to its input's dtype.

Two layouts:

* :func:`swiglu` ``(h)``: ``h`` ``[..., 2F]`` with the gate in the first half and the up
  projection in the second (a fused gate/up GEMM's output, e.g. an MoE layer's ``gate_up``
  rows); its backward writes ``dh`` ``[..., 2F]`` in one launch (no slice gradients to pad
  and add).
* :func:`silu_mul` ``(g, u)``: two tensors of one shape (separate gate and up projections,
  transformers' ``act_fn(gate_proj(x)) * up_proj(x)``).

Elementwise: every output element is written by one program from its own inputs, so equal
inputs and launch parameters give equal bits (no reductions, no atomics). Both entries are
autograd functions whose launches are ``torch.library`` custom ops while ``torch.compile``
traces (``cake_core::swiglu_fwd`` / ``cake_core::swiglu_bwd``) and the same bodies eagerly.

Example::

    import torch
    from cake_core.swiglu import swiglu
    h = torch.randn(8, 2 * 64, requires_grad=True)   # CPU: Triton's interpreter
    swiglu(h).sum().backward()                        # a: [8, 64], h.grad: [8, 128]
"""

from __future__ import annotations

import math

import torch

from cake_core.autograd import once_differentiable
from cake_core.compile import custom_op, op_or_body
from cake_core.gemm import direct_store_dtype
from cake_core.triton_utils import (
    cdiv,
    launch_device_check,
    next_power_of_2,
    select_backend,
    tl,
    triton,
)

select_backend()

__all__ = ["silu_mul", "silu_mul_bwd_kernel", "silu_mul_fwd_kernel", "swiglu"]

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _tile(n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's (int64 rows, columns) of a one-dimensional grid over (row blocks ×
    column blocks): CUDA caps a grid's second dimension at 65535 blocks, which a long row
    (over 65535 column blocks) would exceed."""
    n_cb = tl.cdiv(n_cols, BLOCK_C)
    pid = tl.program_id(0).to(tl.int64)
    r = (pid // n_cb) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = (pid % n_cb) * BLOCK_C + tl.arange(0, BLOCK_C)
    return r, c


@triton.jit(do_not_specialize=["n_rows"])
def silu_mul_fwd_kernel(
    G, U, A, n_rows, n_cols, stride_g, stride_u, stride_a,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """``A = G * sigmoid(G) * U`` over ``[n_rows, n_cols]`` (unit column strides), fp32,
    stored in A's dtype. Grid: (row blocks × column blocks,), column blocks fastest."""
    r, c = _tile(n_cols, BLOCK_R, BLOCK_C)
    m = (r < n_rows)[:, None] & (c < n_cols)[None, :]
    g = tl.load(G + r[:, None] * stride_g + c[None, :], mask=m, other=0.0).to(tl.float32)
    u = tl.load(U + r[:, None] * stride_u + c[None, :], mask=m, other=0.0).to(tl.float32)
    a = g * tl.sigmoid(g) * u
    tl.store(A + r[:, None] * stride_a + c[None, :], a.to(A.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n_rows"])
def silu_mul_bwd_kernel(
    G, U, DA, DG, DU, n_rows, n_cols, stride_g, stride_u, stride_da, stride_dg, stride_du,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """``DG = DA * U * s * (1 + G * (1 - s))``, ``DU = DA * G * s`` with ``s = sigmoid(G)``,
    fp32, stored in DG's / DU's dtypes. Grid: (row blocks × column blocks,), column blocks
    fastest."""
    r, c = _tile(n_cols, BLOCK_R, BLOCK_C)
    m = (r < n_rows)[:, None] & (c < n_cols)[None, :]
    g = tl.load(G + r[:, None] * stride_g + c[None, :], mask=m, other=0.0).to(tl.float32)
    u = tl.load(U + r[:, None] * stride_u + c[None, :], mask=m, other=0.0).to(tl.float32)
    da = tl.load(DA + r[:, None] * stride_da + c[None, :], mask=m, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    gs = g * s
    dg = da * u * (s + gs * (1.0 - s))
    du = da * gs
    tl.store(DG + r[:, None] * stride_dg + c[None, :], dg.to(DG.dtype.element_ty), mask=m)
    tl.store(DU + r[:, None] * stride_du + c[None, :], du.to(DU.dtype.element_ty), mask=m)


def _blocks(device: torch.device, n_cols: int) -> tuple[int, int]:
    """(rows, columns) per program: 2048 elements on CUDA (a streaming elementwise pass);
    larger tiles under the interpreter, where each program costs Python time."""
    bc = min(1024 if device.type == "cuda" else 256, next_power_of_2(n_cols))
    return max(1, (2048 if device.type == "cuda" else 8192) // bc), bc


def _rows(t: torch.Tensor) -> int:
    """The number of rows of ``t`` ``[..., n_cols]`` (also for ``n_cols == 0``, where
    ``reshape(-1, 0)`` is ambiguous)."""
    return math.prod(t.shape[:-1])


def _rows2d(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``t`` as ``[rows, n_cols]`` with a unit column stride (a view where one exists)."""
    t2 = t.reshape(_rows(t), n_cols)
    return t2 if t2.stride(-1) == 1 or n_cols <= 1 else t2.contiguous()


def _fwd(g2: torch.Tensor, u2: torch.Tensor, a: torch.Tensor) -> None:
    R, F = g2.shape
    if R and F:
        br, bc = _blocks(g2.device, F)
        silu_mul_fwd_kernel[(cdiv(R, br) * cdiv(F, bc),)](
            g2, u2, a, R, F, g2.stride(0), u2.stride(0), a.stride(0),
            BLOCK_R=br, BLOCK_C=bc, num_warps=4)


def _bwd(g2, u2, da2, dg2, du2) -> None:
    R, F = g2.shape
    if R and F:
        br, bc = _blocks(g2.device, F)
        silu_mul_bwd_kernel[(cdiv(R, br) * cdiv(F, bc),)](
            g2, u2, da2, dg2, du2, R, F, g2.stride(0), u2.stride(0), da2.stride(0),
            dg2.stride(0), du2.stride(0), BLOCK_R=br, BLOCK_C=bc, num_warps=4)


@custom_op("cake_core::swiglu_fwd", mutates_args=())
def _swiglu_fwd_op(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    F = g.shape[-1]
    a = torch.empty(g.shape, dtype=direct_store_dtype(g.dtype), device=g.device)
    _fwd(_rows2d(g, F), _rows2d(u, F), a.view(_rows(a), F))
    return a.to(g.dtype)  # a no-op but under the interpreter (its bf16 stores truncate)


@_swiglu_fwd_op.register_fake
def _swiglu_fwd_fake(g, u):
    return g.new_empty(g.shape)


@custom_op("cake_core::swiglu_bwd", mutates_args=())
def _swiglu_bwd_op(g: torch.Tensor, u: torch.Tensor, da: torch.Tensor,
                   packed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dg, du)``; ``packed``: g and u are the halves of one ``[..., 2F]`` tensor and the
    result is ``(dh, empty)`` with ``dh`` ``[..., 2F]`` (both halves written here)."""
    F = g.shape[-1]
    g2, u2, da2 = _rows2d(g, F), _rows2d(u, F), _rows2d(da, F)
    sd = direct_store_dtype(g.dtype)
    if packed:
        dh = torch.empty((*g.shape[:-1], 2 * F), dtype=sd, device=g.device)
        dh2 = dh.view(_rows(dh), 2 * F)
        _bwd(g2, u2, da2, dh2[:, :F], dh2[:, F:])
        return dh.to(g.dtype), g.new_empty((0,))
    dg = torch.empty(g.shape, dtype=sd, device=g.device)
    du = torch.empty(u.shape, dtype=sd, device=u.device)
    _bwd(g2, u2, da2, dg.view(_rows(dg), F), du.view(_rows(du), F))
    return dg.to(g.dtype), du.to(u.dtype)


@_swiglu_bwd_op.register_fake
def _swiglu_bwd_fake(g, u, da, packed):
    if packed:
        return g.new_empty((*g.shape[:-1], 2 * g.shape[-1])), g.new_empty((0,))
    return g.new_empty(g.shape), u.new_empty(u.shape)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        F = h.shape[-1] // 2
        g, u = h[..., :F], h[..., F:]
        ctx.save_for_backward(h)
        return op_or_body("cake_core::swiglu_fwd")(g, u)

    @staticmethod
    @once_differentiable
    def backward(ctx, da):
        (h,) = ctx.saved_tensors
        F = h.shape[-1] // 2
        dh, _ = op_or_body("cake_core::swiglu_bwd")(h[..., :F], h[..., F:], da, True)
        return dh


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, u):
        ctx.save_for_backward(g, u)
        return op_or_body("cake_core::swiglu_fwd")(g, u)

    @staticmethod
    @once_differentiable
    def backward(ctx, da):
        g, u = ctx.saved_tensors
        dg, du = op_or_body("cake_core::swiglu_bwd")(g, u, da, False)
        return (dg if ctx.needs_input_grad[0] else None,
                du if ctx.needs_input_grad[1] else None)


def _check(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
    if t.dtype not in _FLOATS:
        raise ValueError(f"{name}: expected dtype float32, bfloat16 or float16, got {t.dtype}")
    if t.dim() < 1:
        raise ValueError(f"{name}: expected at least 1-D, got 0-D")
    launch_device_check(t.device, name)  # before any allocation or launch (meta, wrong device)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """``silu(h[..., :F]) * h[..., F:]`` for ``h`` ``[..., 2F]`` (gate first, then up), with
    autograd; one launch forward, one backward (which writes ``dh`` whole).

    Args:
        h: ``[..., 2F]``, fp32 / bf16 / fp16, on the backend's device; any strides (rows
            without a unit column stride are copied first).

    Returns:
        ``a`` ``[..., F]`` in h's dtype (computed in fp32, rounded once).

    Raises:
        ValueError: h not a float tensor of at least one dim, an odd last dim, or on a
            device the backend cannot launch on (a CPU tensor with CUDA Triton, a CUDA one
            under the interpreter, a meta tensor).
    """
    _check(h, "h")
    if h.shape[-1] % 2:
        raise ValueError(f"h: the last dim must be even (gate and up halves), got "
                         f"{h.shape[-1]}")
    return _SwiGLU.apply(h)


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` with autograd, one launch each way (transformers'
    ``act_fn(gate_proj(x)) * up_proj(x)`` with ``hidden_act="silu"``).

    Args:
        g, u: one shape ``[..., F]`` and dtype (fp32 / bf16 / fp16), one device.

    Returns:
        ``a`` like g (computed in fp32, rounded once).

    Raises:
        ValueError: not float tensors, shapes, dtypes or devices that differ, or a device
            the backend cannot launch on.
    """
    _check(g, "g")
    _check(u, "u")
    if g.shape != u.shape or g.dtype != u.dtype or g.device != u.device:
        raise ValueError(f"u: must match g's shape, dtype and device ({list(g.shape)} "
                         f"{g.dtype} {g.device}), got {list(u.shape)} {u.dtype} {u.device}")
    return _SiluMul.apply(g, u)
