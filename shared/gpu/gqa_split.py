"""Candidate GQA kernels with the key / query loop split where the mask is all-true
(FlashAttention's masked and unmasked steps): each kernel's loop runs as three loops, masked
blocks before, full blocks without any mask code, masked blocks after, in the same block
order as the package's kernels (so the same bits). Dev tooling: times each candidate
against the package's kernel at the benchmark shapes and checks the outputs are equal.

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python shared/gpu/gqa_split.py [a b c]
"""

from __future__ import annotations

import json
import os
import sys

import cake_gqa_det_train.launch as L
import torch
import triton
import triton.language as tl
from cake_core.triton_utils import cdiv, dot, ensure_scratch_allocator
from cake_gqa_det_train import gqa_det_fwd, make_plan
from cake_gqa_det_train.kernels.bwd import (
    gqa_bwd_dkdv_kernel,
    key_block,
    lse2_row,
    query_range,
)
from cake_gqa_det_train.kernels.common import (
    LOG2E,
    doc_bounds,
    doc_desc,
    scores2,
    visible,
)
from triton.testing import do_bench


@triton.jit
def full_q_blocks(n_start, lo, hi, len_k, shift, left, right, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[a, b) within [lo, hi) (lo on the BLOCK_M grid): the query blocks whose mask against
    the key block at n_start is all-true (block_full's conditions solved for m_start)."""
    a = lo
    b = hi
    if HAS_RIGHT:  # n_start + BN - 1 <= m_start + shift + right
        x = tl.maximum(n_start + BLOCK_N - 1 - shift - right, lo)
        a = tl.minimum((x + BLOCK_M - 1) // BLOCK_M * BLOCK_M, hi)
    if HAS_LEFT:  # n_start >= m_start + BM - 1 + shift - left
        y = n_start - BLOCK_M + 1 - shift + left
        b = tl.where(y < lo, lo, tl.minimum(y // BLOCK_M * BLOCK_M + BLOCK_M, hi))
    partial = n_start + BLOCK_N > len_k
    a = tl.where(partial, hi, a)
    b = tl.where(partial, hi, tl.maximum(b, a))
    return a, b


@triton.jit
def full_k_blocks(m_start, lo, hi, len_k, shift, left, right, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[a, b) within [lo, hi) (lo on the BLOCK_N grid): the key blocks whose mask against
    the query block at m_start is all-true."""
    a = lo
    if HAS_LEFT:  # n_start >= m_start + BM - 1 + shift - left
        x = tl.maximum(m_start + BLOCK_M - 1 + shift - left, lo)
        a = tl.minimum((x + BLOCK_N - 1) // BLOCK_N * BLOCK_N, hi)
    z = len_k - BLOCK_N  # n_start + BN <= len_k
    if HAS_RIGHT:  # n_start + BN - 1 <= m_start + shift + right
        z = tl.minimum(z, m_start + shift + right - BLOCK_N + 1)
    b = tl.where(z < lo, lo, tl.minimum(z // BLOCK_N * BLOCK_N + BLOCK_N, hi))
    b = tl.maximum(b, a)
    return a, b


@triton.jit
def fwd_step(acc, m_i, l_i, q, k_desc, v_desc, hk, n_start, offs_m, offs_n0, len_q, len_k,
             shift, scale, softcap, left, right, D: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
             SOFTCAP: tl.constexpr, MASK: tl.constexpr):
    k = k_desc.load([n_start, hk * D])
    qk = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    qk = dot(q, tl.trans(k), qk)
    s, _ = scores2(qk, scale, softcap, SOFTCAP)
    if MASK:
        ok = visible(offs_m, n_start + offs_n0, len_q, len_k, shift, left, right, HAS_LEFT,
                     HAS_RIGHT)
        s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = v_desc.load([n_start, hk * D])
    acc = acc * alpha[:, None]
    acc = dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def fwd_split_kernel(
    Q, K, V, O, LSE, CU_Q, CU_K,
    seq_q, seq_k, n_tok_q, scale, softcap, left, right,
    sqt, skt, svt, sot, soh, Hq, Hkv,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    h = tl.program_id(1)
    doc = tl.program_id(2)
    q0, len_q = doc_bounds(CU_Q, doc, seq_q, VARLEN)
    k0, len_k = doc_bounds(CU_K, doc, seq_k, VARLEN)
    m_start = pid_m * BLOCK_M
    if m_start >= len_q:
        return
    hk = h // GROUP
    shift = len_k - len_q
    k_desc = doc_desc(K, k0, len_k, skt, Hkv * D, BLOCK_N, D)
    v_desc = doc_desc(V, k0, len_k, svt, Hkv * D, BLOCK_N, D)
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_n0 = tl.arange(0, BLOCK_N)
    row_ok = offs_m < len_q
    q = doc_desc(Q, q0, len_q, sqt, Hq * D, BLOCK_M, D).load([m_start, h * D])
    hi = len_k
    if HAS_RIGHT:
        hi = tl.minimum(hi, m_start + BLOCK_M + shift + right)
    lo = 0
    if HAS_LEFT:
        lo = tl.maximum(0, m_start + shift - left)
        lo = (lo // BLOCK_N) * BLOCK_N
    a, b = full_k_blocks(m_start, lo, hi, len_k, shift, left, right, BLOCK_M, BLOCK_N,
                         HAS_LEFT, HAS_RIGHT)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n_start in range(lo, a, BLOCK_N):
        acc, m_i, l_i = fwd_step(acc, m_i, l_i, q, k_desc, v_desc, hk, n_start, offs_m,
                                 offs_n0, len_q, len_k, shift, scale, softcap, left, right,
                                 D, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, SOFTCAP, True)
    for n_start in range(a, b, BLOCK_N):
        acc, m_i, l_i = fwd_step(acc, m_i, l_i, q, k_desc, v_desc, hk, n_start, offs_m,
                                 offs_n0, len_q, len_k, shift, scale, softcap, left, right,
                                 D, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, SOFTCAP, False)
    for n_start in range(b, hi, BLOCK_N):
        acc, m_i, l_i = fwd_step(acc, m_i, l_i, q, k_desc, v_desc, hk, n_start, offs_m,
                                 offs_n0, len_q, len_k, shift, scale, softcap, left, right,
                                 D, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, SOFTCAP, True)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) / LOG2E)
    h64 = h.to(tl.int64)
    tl.store(O + (q0 + offs_m)[:, None].to(tl.int64) * sot + h64 * soh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + h64 * n_tok_q + q0 + offs_m, lse, mask=row_ok)


@triton.jit
def dkdv_step(dk, dv, k, v, k_desc, v_desc, hk, q_desc, do_desc, LSE, DELTA, h, q0, m_start,
              offs_n, len_q, len_k, shift, n_tok_q, scale, softcap, left, right,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
              MASK: tl.constexpr, RELOAD: tl.constexpr):
    offs_m = m_start + tl.arange(0, BLOCK_M)
    row_ok = offs_m < len_q
    h64 = h.to(tl.int64)
    rows = (q0 + offs_m).to(tl.int64)
    if RELOAD:
        n_start = tl.min(offs_n, 0)
        k = k_desc.load([n_start, hk * D])
        v = v_desc.load([n_start, hk * D])
    q = q_desc.load([m_start, h * D])
    do = do_desc.load([m_start, h * D])
    lse2 = lse2_row(LSE, h64 * n_tok_q + rows, row_ok)
    delta = tl.load(DELTA + h64 * n_tok_q + rows, mask=row_ok, other=0.0)
    qkt = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    qkt = dot(k, tl.trans(q), qkt)
    st, tt = scores2(qkt, scale, softcap, SOFTCAP)
    pt = tl.exp2(st - lse2[None, :])
    if MASK:
        ok = tl.trans(visible(offs_m, offs_n, len_q, len_k, shift, left, right, HAS_LEFT,
                              HAS_RIGHT))
        pt = tl.where(ok, pt, 0.0)
    dv = dot(pt.to(do.dtype), do, dv)
    dpt = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    dpt = dot(v, tl.trans(do), dpt)
    dst = pt * (dpt - delta[None, :])
    if SOFTCAP:
        dst = dst * (1.0 - tt * tt)
    dk = dot(dst.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def dkdv_split_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K,
    seq_q, seq_k, n_tok_q, scale, softcap, left, right,
    sqt, skt, svt, sdot, Hq, Hkv, sdkt, sdkh, sdvt, sdvh,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, RELOAD: tl.constexpr,
):
    pid_n = tl.program_id(0)
    hk = tl.program_id(1)
    doc = tl.program_id(2)
    q0, len_q = doc_bounds(CU_Q, doc, seq_q, VARLEN)
    k0, len_k = doc_bounds(CU_K, doc, seq_k, VARLEN)
    n_start = pid_n * BLOCK_N
    if n_start >= len_k:
        return
    shift = len_k - len_q
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    col_ok = offs_n < len_k
    k_desc = doc_desc(K, k0, len_k, skt, Hkv * D, BLOCK_N, D)
    v_desc = doc_desc(V, k0, len_k, svt, Hkv * D, BLOCK_N, D)
    if RELOAD:
        k = tl.zeros([BLOCK_N, D], K.dtype.element_ty)
        v = tl.zeros([BLOCK_N, D], V.dtype.element_ty)
    else:
        k, v = key_block(K, V, k0, len_k, skt, svt, n_start, hk, Hkv, BLOCK_N, D)
    q_desc = doc_desc(Q, q0, len_q, sqt, Hq * D, BLOCK_M, D)
    do_desc = doc_desc(DO, q0, len_q, sdot, Hq * D, BLOCK_M, D)
    lo, hi = query_range(n_start, len_q, shift, left, right, BLOCK_M, BLOCK_N, HAS_LEFT,
                         HAS_RIGHT)
    a, b = full_q_blocks(n_start, lo, hi, len_k, shift, left, right, BLOCK_M, BLOCK_N,
                         HAS_LEFT, HAS_RIGHT)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    for g in range(GROUP):
        h = hk * GROUP + g
        for m_start in range(lo, a, BLOCK_M):
            dk, dv = dkdv_step(dk, dv, k, v, k_desc, v_desc, hk, q_desc, do_desc, LSE, DELTA,
                               h, q0, m_start, offs_n, len_q, len_k, shift, n_tok_q, scale,
                               softcap, left, right, BLOCK_M, BLOCK_N, D, HAS_LEFT,
                               HAS_RIGHT, SOFTCAP, True, RELOAD)
        for m_start in range(a, b, BLOCK_M):
            dk, dv = dkdv_step(dk, dv, k, v, k_desc, v_desc, hk, q_desc, do_desc, LSE, DELTA,
                               h, q0, m_start, offs_n, len_q, len_k, shift, n_tok_q, scale,
                               softcap, left, right, BLOCK_M, BLOCK_N, D, HAS_LEFT,
                               HAS_RIGHT, SOFTCAP, False, RELOAD)
        for m_start in range(b, hi, BLOCK_M):
            dk, dv = dkdv_step(dk, dv, k, v, k_desc, v_desc, hk, q_desc, do_desc, LSE, DELTA,
                               h, q0, m_start, offs_n, len_q, len_k, shift, n_tok_q, scale,
                               softcap, left, right, BLOCK_M, BLOCK_N, D, HAS_LEFT,
                               HAS_RIGHT, SOFTCAP, True, RELOAD)
    rows_k = (k0 + offs_n)[:, None].to(tl.int64)
    hk64 = hk.to(tl.int64)
    tl.store(DK + rows_k * sdkt + hk64 * sdkh + offs_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + rows_k * sdvt + hk64 * sdvh + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def dkdv_step_nt(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start, offs_n, len_q,
                 len_k, shift, n_tok_q, scale, softcap, left, right, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, D: tl.constexpr, HAS_LEFT: tl.constexpr,
                 HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, MASK: tl.constexpr):
    """The scores as Q K^T (k and v as the B operands, from shared memory), P and dS
    transposed for the dV / dK products."""
    offs_m = m_start + tl.arange(0, BLOCK_M)
    row_ok = offs_m < len_q
    h64 = h.to(tl.int64)
    rows = (q0 + offs_m).to(tl.int64)
    q = q_desc.load([m_start, h * D])
    do = do_desc.load([m_start, h * D])
    lse2 = lse2_row(LSE, h64 * n_tok_q + rows, row_ok)
    delta = tl.load(DELTA + h64 * n_tok_q + rows, mask=row_ok, other=0.0)
    qk = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    qk = dot(q, tl.trans(k), qk)
    s, t = scores2(qk, scale, softcap, SOFTCAP)
    p = tl.exp2(s - lse2[:, None])
    if MASK:
        ok = visible(offs_m, offs_n, len_q, len_k, shift, left, right, HAS_LEFT, HAS_RIGHT)
        p = tl.where(ok, p, 0.0)
    dv = dot(tl.trans(p.to(do.dtype)), do, dv)
    dp = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    dp = dot(do, tl.trans(v), dp)
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    dk = dot(tl.trans(ds.to(q.dtype)), q, dk)
    return dk, dv


@triton.jit
def dkdv_nt_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K,
    seq_q, seq_k, n_tok_q, scale, softcap, left, right,
    sqt, skt, svt, sdot, Hq, Hkv, sdkt, sdkh, sdvt, sdvh,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    pid_n = tl.program_id(0)
    hk = tl.program_id(1)
    doc = tl.program_id(2)
    q0, len_q = doc_bounds(CU_Q, doc, seq_q, VARLEN)
    k0, len_k = doc_bounds(CU_K, doc, seq_k, VARLEN)
    n_start = pid_n * BLOCK_N
    if n_start >= len_k:
        return
    shift = len_k - len_q
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    col_ok = offs_n < len_k
    k, v = key_block(K, V, k0, len_k, skt, svt, n_start, hk, Hkv, BLOCK_N, D)
    q_desc = doc_desc(Q, q0, len_q, sqt, Hq * D, BLOCK_M, D)
    do_desc = doc_desc(DO, q0, len_q, sdot, Hq * D, BLOCK_M, D)
    lo, hi = query_range(n_start, len_q, shift, left, right, BLOCK_M, BLOCK_N, HAS_LEFT,
                         HAS_RIGHT)
    a, b = full_q_blocks(n_start, lo, hi, len_k, shift, left, right, BLOCK_M, BLOCK_N,
                         HAS_LEFT, HAS_RIGHT)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    for g in range(GROUP):
        h = hk * GROUP + g
        for m_start in range(lo, a, BLOCK_M):
            dk, dv = dkdv_step_nt(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start,
                                  offs_n, len_q, len_k, shift, n_tok_q, scale, softcap, left,
                                  right, BLOCK_M, BLOCK_N, D, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                                  True)
        for m_start in range(a, b, BLOCK_M):
            dk, dv = dkdv_step_nt(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start,
                                  offs_n, len_q, len_k, shift, n_tok_q, scale, softcap, left,
                                  right, BLOCK_M, BLOCK_N, D, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                                  False)
        for m_start in range(b, hi, BLOCK_M):
            dk, dv = dkdv_step_nt(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start,
                                  offs_n, len_q, len_k, shift, n_tok_q, scale, softcap, left,
                                  right, BLOCK_M, BLOCK_N, D, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                                  True)
    rows_k = (k0 + offs_n)[:, None].to(tl.int64)
    hk64 = hk.to(tl.int64)
    tl.store(DK + rows_k * sdkt + hk64 * sdkh + offs_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + rows_k * sdvt + hk64 * sdvh + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def dq_step(dq, q, do, lse2, delta, k_desc, v_desc, hk, n_start, offs_m, offs_n0, len_q,
            len_k, shift, scale, softcap, left, right, D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr,
            HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, MASK: tl.constexpr):
    k = k_desc.load([n_start, hk * D])
    v = v_desc.load([n_start, hk * D])
    qk = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    qk = dot(q, tl.trans(k), qk)
    s, t = scores2(qk, scale, softcap, SOFTCAP)
    p = tl.exp2(s - lse2[:, None])
    if MASK:
        ok = visible(offs_m, n_start + offs_n0, len_q, len_k, shift, left, right, HAS_LEFT,
                     HAS_RIGHT)
        p = tl.where(ok, p, 0.0)
    dp = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    dp = dot(do, tl.trans(v), dp)
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    dq = dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def dq_split_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K,
    seq_q, seq_k, n_tok_q, scale, softcap, left, right,
    sqt, skt, svt, sdot, Hq, Hkv, sdqt, sdqh,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    h = tl.program_id(1)
    doc = tl.program_id(2)
    q0, len_q = doc_bounds(CU_Q, doc, seq_q, VARLEN)
    k0, len_k = doc_bounds(CU_K, doc, seq_k, VARLEN)
    m_start = pid_m * BLOCK_M
    if m_start >= len_q:
        return
    hk = h // GROUP
    shift = len_k - len_q
    k_desc = doc_desc(K, k0, len_k, skt, Hkv * D, BLOCK_N, D)
    v_desc = doc_desc(V, k0, len_k, svt, Hkv * D, BLOCK_N, D)
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_n0 = tl.arange(0, BLOCK_N)
    row_ok = offs_m < len_q
    rows = (q0 + offs_m).to(tl.int64)
    h64 = h.to(tl.int64)
    q = doc_desc(Q, q0, len_q, sqt, Hq * D, BLOCK_M, D).load([m_start, h * D])
    do = doc_desc(DO, q0, len_q, sdot, Hq * D, BLOCK_M, D).load([m_start, h * D])
    lse2 = lse2_row(LSE, h64 * n_tok_q + rows, row_ok)
    delta = tl.load(DELTA + h64 * n_tok_q + rows, mask=row_ok, other=0.0)
    hi = len_k
    if HAS_RIGHT:
        hi = tl.minimum(hi, m_start + BLOCK_M + shift + right)
    lo = 0
    if HAS_LEFT:
        lo = tl.maximum(0, m_start + shift - left)
        lo = (lo // BLOCK_N) * BLOCK_N
    a, b = full_k_blocks(m_start, lo, hi, len_k, shift, left, right, BLOCK_M, BLOCK_N,
                         HAS_LEFT, HAS_RIGHT)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    for n_start in range(lo, a, BLOCK_N):
        dq = dq_step(dq, q, do, lse2, delta, k_desc, v_desc, hk, n_start, offs_m, offs_n0,
                     len_q, len_k, shift, scale, softcap, left, right, D, BLOCK_M, BLOCK_N,
                     HAS_LEFT, HAS_RIGHT, SOFTCAP, True)
    for n_start in range(a, b, BLOCK_N):
        dq = dq_step(dq, q, do, lse2, delta, k_desc, v_desc, hk, n_start, offs_m, offs_n0,
                     len_q, len_k, shift, scale, softcap, left, right, D, BLOCK_M, BLOCK_N,
                     HAS_LEFT, HAS_RIGHT, SOFTCAP, False)
    for n_start in range(b, hi, BLOCK_N):
        dq = dq_step(dq, q, do, lse2, delta, k_desc, v_desc, hk, n_start, offs_m, offs_n0,
                     len_q, len_k, shift, scale, softcap, left, right, D, BLOCK_M, BLOCK_N,
                     HAS_LEFT, HAS_RIGHT, SOFTCAP, True)
    tl.store(DQ + rows[:, None] * sdqt + h64 * sdqh + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


DEV = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
SHAPES = {"a": (4, 4096, 16, 2, 256), "b": (4, 4096, 32, 8, 128),
          "c": (1, 32768, 16, 16, 128)}


def _regs(ck):
    try:
        return int(ck.n_regs), int(ck.n_spills)
    except Exception:  # noqa: BLE001
        return None, None


def _case(q, k, v, do, cu_q, cu_k, max_q, max_k, window=(-1, 0), softcap=0.0):
    """Every kernel (package and candidates) on one problem; returns the outputs."""
    out, lse, saved = gqa_det_fwd(q, k, v, cu_q, cu_k, max_seqlen_q=max_q,
                                  max_seqlen_k=max_k, causal=window == (-1, 0),
                                  window_size=window, softcap=softcap)
    return out, lse, saved


def run(names, timing=True, variants=None):
    ensure_scratch_allocator()
    res = []
    for name in names:
        if name == "tiny":
            D, Hq, Hkv = 64, 4, 2
            lens_q = [0, 1, 63, 65, 130, 40]
            lens_k = [5, 1, 63, 90, 129, 40]
        elif name == "ragged":
            D, Hq, Hkv = 128, 8, 2
            lens_q = [0, 1, 63, 64, 65, 700, 1500, 130]
            lens_k = [5, 1, 63, 64, 90, 700, 1500, 129]
        elif name == "ragged256":
            D, Hq, Hkv = 256, 4, 2
            lens_q = [1, 65, 300, 0, 257]
            lens_k = [1, 65, 300, 7, 200]
        else:
            B, S, Hq, Hkv, D = SHAPES[name]
            lens_q = lens_k = [S] * B
        cu_q = torch.tensor([0] + lens_q, device=DEV).cumsum(0).to(torch.int32)
        cu_k = torch.tensor([0] + lens_k, device=DEV).cumsum(0).to(torch.int32)
        Tq, Tk = int(cu_q[-1]), int(cu_k[-1])
        g = torch.Generator().manual_seed(0)
        dt = torch.bfloat16 if DEV.type == "cuda" else torch.float32
        q = torch.randn(Tq, Hq, D, generator=g).to(DEV, dt)
        k = torch.randn(Tk, Hkv, D, generator=g).to(DEV, dt)
        v = torch.randn(Tk, Hkv, D, generator=g).to(DEV, dt)
        do = torch.randn(Tq, Hq, D, generator=g).to(DEV, dt)
        plan = make_plan(D, dt, DEV)
        for window, softcap in (((-1, 0), 0.0), ((100, 0), 0.0), ((-1, 0), 20.0),
                                ((-1, -1), 0.0), ((37, 5), 0.0)):
            if name in SHAPES and (window, softcap) != ((-1, 0), 0.0):
                continue
            out, lse, saved = _case(q, k, v, do, cu_q, cu_k, max(lens_q), max(lens_k),
                                    window, softcap)
            ints = saved.meta["ints"]
            _, _, n_docs, max_q, max_k, _, _ = ints
            scale = saved.meta["scale"]
            delta = torch.empty(Hq * Tq + 1, device=DEV)
            L.launch_delta(out, do, delta, plan.delta_block_m)
            common = L.bwd_common(q, k, v, do, ints, scale, softcap)
            flags = L._flags(ints, softcap)
            row = {"case": name, "window": window, "softcap": softcap}
            outs = {}
            o2, lse2 = torch.empty_like(out), torch.empty_like(lse)
            G = Hq // Hkv

            def fwd(kern, o2=o2, lse2=lse2, **kw):
                bm, bn = kw.pop("bm", plan.fwd_block_m), kw.pop("bn", plan.fwd_block_n)
                w, st = kw.pop("w", plan.fwd_warps), kw.pop("st", plan.fwd_stages)
                return kern[(cdiv(max_q, bm), Hq, n_docs)](
                    q, k, v, o2, lse2, cu_q, cu_k, *common[:7], *common[7:10],
                    o2.stride(0), o2.stride(1), Hq, Hkv, GROUP=G, D=D, BLOCK_M=bm,
                    BLOCK_N=bn, **flags, num_warps=w, num_stages=st, **kw)

            dk2, dv2, dq2 = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)

            def dkdv(kern, **kw):
                bm, bn = kw.pop("bm", plan.dkdv_block_m), kw.pop("bn", plan.dkdv_block_n)
                w, st = kw.pop("w", plan.dkdv_warps), kw.pop("st", plan.dkdv_stages)
                return kern[(cdiv(max_k, bn), Hkv, n_docs)](
                    q, k, v, do, lse, delta, dk2, dv2, cu_q, cu_k, *common,
                    dk2.stride(0), dk2.stride(1), dv2.stride(0), dv2.stride(1),
                    GROUP=G, D=D, BLOCK_M=bm, BLOCK_N=bn, **flags, num_warps=w,
                    num_stages=st, **kw)

            def dq(kern, **kw):
                bm, bn = kw.pop("bm", plan.dq_block_m), kw.pop("bn", plan.dq_block_n)
                w, st = kw.pop("w", plan.dq_warps), kw.pop("st", plan.dq_stages)
                return kern[(cdiv(max_q, bm), Hq, n_docs)](
                    q, k, v, do, lse, delta, dq2, cu_q, cu_k, *common, dq2.stride(0),
                    dq2.stride(1), GROUP=G, D=D, BLOCK_M=bm, BLOCK_N=bn, **flags,
                    num_warps=w, num_stages=st, **kw)

            cands = {
                "dkdv pkg": (lambda: dkdv(gqa_bwd_dkdv_kernel),
                             lambda: (dk2.clone(), dv2.clone())),
                "dkdv split": (lambda: dkdv(dkdv_split_kernel, RELOAD=False),
                               lambda: (dk2.clone(), dv2.clone())),
                "dkdv nt": (lambda: dkdv(dkdv_nt_kernel), lambda: (dk2.clone(), dv2.clone())),
                "dkdv nt s3": (lambda: dkdv(dkdv_nt_kernel, st=3),
                               lambda: (dk2.clone(), dv2.clone())),
                "dkdv nt s1": (lambda: dkdv(dkdv_nt_kernel, st=1),
                               lambda: (dk2.clone(), dv2.clone())),
            }
            if D == 128:
                cands.update({
                    "dkdv nt n128 w8": (lambda: dkdv(dkdv_nt_kernel, bn=128, w=8),
                                        lambda: (dk2.clone(), dv2.clone())),
                    "dkdv nt m32 s3": (lambda: dkdv(dkdv_nt_kernel, bm=32, st=3),
                                       lambda: (dk2.clone(), dv2.clone())),
                })
            for extra in (variants or []):
                cands.update(extra(fwd, dkdv, dq, D, o2, lse2, dk2, dv2, dq2))
            for key, (f, get) in cands.items():
                try:
                    ck = f()
                    outs[key] = get()
                    row[key] = {"regs": _regs(ck)}
                    try:
                        row[key]["ir"] = ttgir_summary(ck)
                        if name == "a" and key in ("dkdv pkg", "dkdv nt"):
                            with open(os.path.join(os.environ.get("OUT", "."),
                                                   f"{key.replace(' ', '_')}.ttgir"), "w") as fh:
                                fh.write(ck.asm["ttgir"])
                    except Exception:  # noqa: BLE001
                        pass
                    if timing:
                        row[key]["ms"] = do_bench(f)
                except Exception as e:  # noqa: BLE001
                    row[key] = repr(e)[:300]
            for key in cands:
                kind = key.split()[0]
                ref = outs.get(f"{kind} pkg")
                got = outs.get(key)
                if ref is None or got is None or not isinstance(row[key], dict):
                    continue
                ref = ref if isinstance(ref, tuple) else (ref,)
                got = got if isinstance(got, tuple) else (got,)
                row[key]["equal"] = all(torch.equal(x, y) for x, y in zip(ref, got, strict=True))
                row[key]["rel"] = max(float((x.float() - y.float()).abs().max()
                                            / y.float().abs().max().clamp_min(1e-30))
                                      for x, y in zip(got, ref, strict=True))
            print(json.dumps(row), flush=True)
            res.append(row)
    return res


if __name__ == "__main__":
    names = sys.argv[1:] or ["ragged", "ragged256", "a", "b", "c"]
    res = run(names, timing=DEV.type == "cuda")
    with open(os.path.join(os.environ.get("OUT", "."), "gqa_split.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=str)
