"""Launches of the forward and the delta kernel (shared with ``cake_gqa_train``) and of the
det backward. Kernels never allocate: buffers come from here (and the descriptors'
scratch from torch's allocator, :func:`cake_core.triton_utils.ensure_scratch_allocator`)."""

from __future__ import annotations

import torch
from cake_core.triton_utils import cdiv, ensure_scratch_allocator

from cake_gqa_det_train.kernels.bwd import (
    gqa_bwd_delta_kernel,
    gqa_bwd_dkdv_kernel,
    gqa_bwd_dq_kernel,
)
from cake_gqa_det_train.kernels.fwd import gqa_fwd_kernel
from cake_gqa_det_train.plan import GQADetPlan

# every buffer handed to a kernel comes from here (tests poison it)
_empty = torch.empty


def tma_rows(x: torch.Tensor) -> torch.Tensor:
    """``x [T, H, D]`` as the kernels' TMA descriptors read it, ``[T, H * D]`` rows: heads
    contiguous in a token, the row stride a multiple of 16 bytes, the base 16-byte aligned;
    else a contiguous copy (e.g. head-major input)."""
    T, H, D = x.shape
    ok = (x.stride(2) == 1 and (H == 1 or x.stride(1) == D)
          and (row_stride(x) * x.element_size()) % 16 == 0 and x.data_ptr() % 16 == 0)
    return x if ok else x.clone(memory_format=torch.contiguous_format)


def row_stride(x: torch.Tensor) -> int:
    """The token stride of ``x [T, H, D]`` (that of a dense tensor where T <= 1, where the
    stride addresses nothing)."""
    return x.stride(0) if x.shape[0] > 1 else x.shape[1] * x.shape[2]


def _flags(ints, softcap: float) -> dict:
    seq_q, seq_k, n_docs, max_q, max_k, left, right = ints
    return dict(VARLEN=seq_q < 0, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0,
                SOFTCAP=softcap > 0)


def launch_fwd(q, k, v, cu_q, cu_k, ints, scale: float, softcap: float,
               block_m: int, block_n: int, warps: int, stages: int):
    """q ``[Tq, Hq, D]``, k, v ``[Tk, Hkv, D]`` -> (out ``[Tq, Hq, D]`` q's dtype, lse
    ``[Hq, Tq]`` fp32). ``ints``: the Problem's op ints with max lengths resolved."""
    seq_q, seq_k, n_docs, max_q, max_k, left, right = ints
    Tq, Hq, D = q.shape
    Hkv = k.shape[1]
    out = _empty((Tq, Hq, D), dtype=q.dtype, device=q.device)
    lse = _empty((Hq, Tq), dtype=torch.float32, device=q.device)
    if Tq == 0 or n_docs == 0 or max_q <= 0:
        return out, lse
    cu_q = cu_q if cu_q is not None else lse  # unused without VARLEN
    cu_k = cu_k if cu_k is not None else cu_q  # packed: None is "the same as q's"
    q, k, v = tma_rows(q), tma_rows(k), tma_rows(v)
    ensure_scratch_allocator()
    grid = (cdiv(max_q, block_m), Hq, n_docs)
    gqa_fwd_kernel[grid](
        q, k, v, out, lse, cu_q, cu_k, seq_q, seq_k, Tq, scale, softcap, left, right,
        row_stride(q), row_stride(k), row_stride(v), out.stride(0), out.stride(1), Hq, Hkv,
        GROUP=Hq // Hkv, D=D, BLOCK_M=block_m, BLOCK_N=block_n, **_flags(ints, softcap),
        num_warps=warps, num_stages=stages)
    return out, lse


def launch_delta(out, dout, delta, block_m: int):
    """delta (fp32, ``Hq * Tq`` values, head-major) = rowsum(dO * O)."""
    Tq, Hq, D = out.shape
    if Tq == 0:
        return
    gqa_bwd_delta_kernel[(cdiv(Tq, block_m), Hq)](
        out, dout, delta, Tq, out.stride(0), out.stride(1), dout.stride(0), dout.stride(1),
        D=D, BLOCK_M=block_m, num_warps=4)


def bwd_prologue(out, dout, lse, cu_q, cu_k, ints, softcap: float, plan, delta=None):
    """What every backward launches first and passes on: delta (rowsum(dO * O), fp32, in
    ``delta``'s first ``Hq * Tq`` values or allocated), the offsets to pass (placeholders
    without VARLEN; ``cu_k`` None is ``cu_q``) and the kernels' flags. Returns
    ``(delta, cu_q, cu_k, flags)``."""
    Tq, Hq, _ = out.shape
    delta = _empty((Hq * Tq,), dtype=torch.float32, device=out.device) if delta is None \
        else delta[: Hq * Tq]
    launch_delta(out, dout, delta, plan.delta_block_m)
    cu_q = cu_q if cu_q is not None else lse  # unused without VARLEN
    cu_k = cu_k if cu_k is not None else cu_q
    ensure_scratch_allocator()
    return delta, cu_q, cu_k, _flags(ints, softcap)


def bwd_inputs(q, k, v, dout):
    """q, k, v, dout as the backward kernels' descriptors read them (:func:`tma_rows`)."""
    return tma_rows(q), tma_rows(k), tma_rows(v), tma_rows(dout)


def bwd_common(q, k, v, dout, ints, scale: float, softcap: float) -> tuple:
    """The backward kernels' scalar and stride arguments after their tensors (q, k, v,
    dout from :func:`bwd_inputs`)."""
    seq_q, seq_k, _, _, _, left, right = ints
    return (seq_q, seq_k, q.shape[0], scale, softcap, left, right, row_stride(q),
            row_stride(k), row_stride(v), row_stride(dout), q.shape[1], k.shape[1])


def launch_dq(dq, q, k, v, dout, lse, delta, cu_q, cu_k, ints, common: tuple, flags: dict,
              plan) -> None:
    """dQ by :func:`gqa_bwd_dq_kernel` (over key blocks in order; no atomics)."""
    n_docs, max_q = ints[2], ints[3]
    Hq, Hkv = q.shape[1], k.shape[1]
    gqa_bwd_dq_kernel[(cdiv(max_q, plan.dq_block_m), Hq, n_docs)](
        q, k, v, dout, lse, delta, dq, cu_q, cu_k, *common, dq.stride(0), dq.stride(1),
        GROUP=Hq // Hkv, D=q.shape[2], BLOCK_M=plan.dq_block_m, BLOCK_N=plan.dq_block_n,
        **flags, num_warps=plan.dq_warps, num_stages=plan.dq_stages)


def launch_bwd_det(dout, q, k, v, out, lse, cu_q, cu_k, ints, scale: float, softcap: float,
                   plan: GQADetPlan, delta=None):
    """-> (dq, dk, dv) in the inputs' dtypes, with no atomics. ``delta``: an fp32 buffer of
    at least ``Hq * Tq`` values (a workspace's), or ``None`` (allocated here)."""
    _, _, n_docs, max_q, max_k, _, _ = ints
    Tq, Hq, D = q.shape
    Tk, Hkv, _ = k.shape
    dev = q.device
    dq = _empty((Tq, Hq, D), dtype=q.dtype, device=dev)
    dk = _empty((Tk, Hkv, D), dtype=k.dtype, device=dev)
    dv = _empty((Tk, Hkv, D), dtype=v.dtype, device=dev)
    if n_docs == 0 or (Tq == 0 and Tk == 0):
        return dq, dk, dv
    if Tq == 0 or max_q <= 0:  # keys nobody sees
        dk.zero_()
        dv.zero_()
        return dq, dk, dv
    delta, cu_q, cu_k, flags = bwd_prologue(out, dout, lse, cu_q, cu_k, ints, softcap, plan,
                                            delta)
    q, k, v, dout = bwd_inputs(q, k, v, dout)
    common = bwd_common(q, k, v, dout, ints, scale, softcap)
    if Tk > 0 and max_k > 0:
        gqa_bwd_dkdv_kernel[(cdiv(max_k, plan.dkdv_block_n), Hkv, n_docs)](
            q, k, v, dout, lse, delta, dk, dv, cu_q, cu_k, *common,
            dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            GROUP=Hq // Hkv, D=D, BLOCK_M=plan.dkdv_block_m, BLOCK_N=plan.dkdv_block_n,
            **flags, num_warps=plan.dkdv_warps, num_stages=plan.dkdv_stages)
    launch_dq(dq, q, k, v, dout, lse, delta, cu_q, cu_k, ints, common, flags, plan)
    return dq, dk, dv
