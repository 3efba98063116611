"""Candidate for issue 41 (cake-gqa-train faster than its det sibling): a one-pass backward,
dQ added into an fp32 buffer by atomic adds from the dK / dV programs (FlashAttention-2's
scheme; FlashAttention-3 adds a tile at a time through the TMA unit). Dev tooling, ships in
no wheel; ``cake_gqa_train`` keeps its rule until this is timed.

The two-pass rule (cake-gqa-det-train's kernels) computes Q K^T and dO V^T twice, once in
the dK / dV kernel and once in the dQ kernel: 7 of the backward's GEMMs where one pass needs
5. One pass trades the two for atomic traffic: a query tile of dQ (fp32) per key block
(per-element atomics were slower than two passes: docs/benchmarks/gqa.md). Here the add
can also go through the TMA unit
(``tensor_descriptor.atomic_add``: one bulk reduce of the tile, what FlashAttention-3 uses),
on CUDA only (Triton's interpreter has no descriptor reduce).

dK and dV stay as in the det kernel (one program per key block and KV head sums its query
heads and blocks in order); only dQ's sum order varies.

    # CPU, interpreter: parity of the pointer-atomic form against float64
    TRITON_INTERPRET=1 PYTHONPATH=$(ls -d packages/*/src | paste -sd:) \\
        python shared/gpu/gqa_onepass.py check
    # CPU: the bench's code on tiny shapes (timings meaningless): ... gqa_onepass.py dry
    # GPU: parity (both forms), then fwd+bwd ms beside the det rule and SDPA cuDNN at
    # issue 41's shapes, over a few tilings
    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python shared/gpu/gqa_onepass.py check bench
    # any machine: registers and spills for sm_90 (Triton compiles, its ptxas reports)
    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python shared/gpu/gqa_onepass.py aot
"""
from __future__ import annotations

import json
import os
import sys

import gqa_candidate_kit as kit
import torch
from cake_core.triton_utils import cdiv, dot, select_backend

select_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from cake_gqa_det_train.kernels.bwd import key_block, lse2_row, query_range  # noqa: E402
from cake_gqa_det_train.kernels.common import (  # noqa: E402
    doc_bounds,
    doc_desc,
    full_q_blocks,
    scores2,
    visible,
)
from cake_gqa_det_train.launch import bwd_common, bwd_inputs, bwd_prologue  # noqa: E402
from cake_gqa_train import api as _api  # noqa: E402

_RULE = _api.launch_bwd


@triton.jit
def onepass_step(dk, dv, k, v, q_desc, do_desc, dq_desc, DQ, LSE, DELTA, h, q0, m_start,
                 offs_n, len_q, len_k, shift, n_tok_q, sdqt, sdqh, scale, softcap, left, right,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                 HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
                 MASK: tl.constexpr, TMA_REDUCE: tl.constexpr):
    """The det dK / dV step plus this (query block, key block)'s share of dQ, added into
    the fp32 ``DQ`` (scaled)."""
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
    dsc = ds.to(q.dtype)
    dk = dot(tl.trans(dsc), q, dk)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    dq = dot(dsc, k, dq) * scale
    if TMA_REDUCE:  # one bulk reduce; rows past the document's end are clipped by the TMA
        dq_desc.atomic_add([m_start, h * D], dq)
    else:
        offs_d = tl.arange(0, D)
        tl.atomic_add(DQ + rows[:, None] * sdqt + h64 * sdqh + offs_d[None, :], dq,
                      mask=row_ok[:, None], sem="relaxed")
    return dk, dv


@triton.jit
def gqa_bwd_onepass_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ, CU_Q, CU_K,
    seq_q, seq_k, n_tok_q, scale, softcap, left, right,
    sqt, skt, svt, sdot, Hq, Hkv, sdkt, sdkh, sdvt, sdvh, sdqt, sdqh,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, TMA_REDUCE: tl.constexpr,
):
    """dK, dV of one key block of one KV head (as the det kernel: query heads in order,
    then query blocks in order) and every visible (query block, head)'s dQ share, added."""
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
    dq_desc = doc_desc(DQ, q0, len_q, sdqt, Hq * D, BLOCK_M, D)
    lo, hi = query_range(n_start, len_q, shift, left, right, BLOCK_M, BLOCK_N, HAS_LEFT,
                         HAS_RIGHT)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    a, b = full_q_blocks(n_start, lo, hi, len_k, shift, left, right, BLOCK_M, BLOCK_N,
                         HAS_LEFT, HAS_RIGHT)
    for g in range(GROUP):
        h = hk * GROUP + g
        for m_start in range(lo, a, BLOCK_M):
            dk, dv = onepass_step(dk, dv, k, v, q_desc, do_desc, dq_desc, DQ, LSE, DELTA, h,
                                  q0, m_start, offs_n, len_q, len_k, shift, n_tok_q, sdqt,
                                  sdqh, scale, softcap, left, right, BLOCK_M, BLOCK_N, D,
                                  HAS_LEFT, HAS_RIGHT, SOFTCAP, True, TMA_REDUCE)
        for m_start in range(a, b, BLOCK_M):
            dk, dv = onepass_step(dk, dv, k, v, q_desc, do_desc, dq_desc, DQ, LSE, DELTA, h,
                                  q0, m_start, offs_n, len_q, len_k, shift, n_tok_q, sdqt,
                                  sdqh, scale, softcap, left, right, BLOCK_M, BLOCK_N, D,
                                  HAS_LEFT, HAS_RIGHT, SOFTCAP, False, TMA_REDUCE)
        for m_start in range(b, hi, BLOCK_M):
            dk, dv = onepass_step(dk, dv, k, v, q_desc, do_desc, dq_desc, DQ, LSE, DELTA, h,
                                  q0, m_start, offs_n, len_q, len_k, shift, n_tok_q, sdqt,
                                  sdqh, scale, softcap, left, right, BLOCK_M, BLOCK_N, D,
                                  HAS_LEFT, HAS_RIGHT, SOFTCAP, True, TMA_REDUCE)
    rows_k = (k0 + offs_n)[:, None].to(tl.int64)
    hk64 = hk.to(tl.int64)
    tl.store(DK + rows_k * sdkt + hk64 * sdkh + offs_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + rows_k * sdvt + hk64 * sdvh + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


def launch_bwd_onepass(dout, q, k, v, out, lse, cu_q, cu_k, ints, scale: float,
                       softcap: float, plan, delta=None, dkv_accum=None, tiles=None,
                       tma_reduce=None):
    """cake_gqa_train.api.launch_bwd's signature: -> (dq, dk, dv) in the inputs' dtypes."""
    _, _, n_docs, max_q, max_k, _, _ = ints
    Tq, Hq, D = q.shape
    Tk, Hkv, _ = k.shape
    dev = q.device
    if Tq == 0 or n_docs == 0 or max_q <= 0:
        return torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    # tiles (query rows per step, keys per program, warps, stages): by default the plan's
    # dK / dV tiling (the det kernel's), whose dK / dV sums are the det kernel's
    block_m, block_n, warps, stages = tiles or (plan.bwd_block_m, plan.bwd_block_n,
                                                plan.bwd_warps, plan.bwd_stages)
    if tma_reduce is None:
        tma_reduce = dev.type == "cuda"
    dq32 = torch.zeros((Tq, Hq, D), dtype=torch.float32, device=dev)
    dk = torch.empty((Tk, Hkv, D), dtype=k.dtype, device=dev)
    dv = torch.empty((Tk, Hkv, D), dtype=v.dtype, device=dev)
    delta, cu_q, cu_k, flags = bwd_prologue(out, dout, lse, cu_q, cu_k, ints, softcap, plan,
                                            delta)
    q, k, v, dout = bwd_inputs(q, k, v, dout)
    common = bwd_common(q, k, v, dout, ints, scale, softcap)
    if Tk > 0 and max_k > 0:
        gqa_bwd_onepass_kernel[(cdiv(max_k, block_n), Hkv, n_docs)](
            q, k, v, dout, lse, delta, dk, dv, dq32, cu_q, cu_k, *common,
            dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), dq32.stride(0),
            dq32.stride(1), GROUP=Hq // Hkv, D=D, BLOCK_M=block_m, BLOCK_N=block_n, **flags,
            TMA_REDUCE=bool(tma_reduce), num_warps=warps, num_stages=stages)
    else:
        dk.zero_()
        dv.zero_()
    return dq32.to(q.dtype), dk, dv


def install(**kw):
    """cake_gqa_train's backward through the one-pass kernel (``kw``: tiles, tma_reduce)."""
    _api.launch_bwd = lambda *a, **k: launch_bwd_onepass(*a, **{**k, **kw})


def uninstall():
    """cake_gqa_train's backward back to its rule."""
    _api.launch_bwd = _RULE


def check(dev, dtype, variants):
    """Parity of cake_gqa_train with the one-pass backward against float64, and dK / dV
    against the det package's bits at the same dK / dV tiles (the same sums in the same
    order): the plans' tiles, at D 256 on CUDA 64 x 32 with 8 warps (the one-pass kernel at
    the rule's 128 x 32 does not fit shared memory)."""
    import dataclasses

    from cake_gqa_det_train import gqa_det, gqa_reference
    from cake_gqa_det_train import make_plan as det_plan
    from cake_gqa_train import gqa
    from cake_gqa_train import make_plan as nondet_plan

    small = dev.type == "cpu"
    cases = ([dict(lens=[0, 1, 33, 40], Hq=4, Hkv=2, D=64),
              dict(lens=[20, 7], lens_k=[30, 0], Hq=2, Hkv=1, D=64)] if small else
             [dict(lens=[0, 1, 63, 64, 65, 700, 1500], Hq=16, Hkv=2, D=256),
              dict(lens=[0, 1, 63, 64, 65, 700, 1500], Hq=8, Hkv=8, D=128),
              dict(lens=[5, 300, 129, 1000], Hq=4, Hkv=1, D=64),
              dict(lens=[100, 500, 33], lens_k=[300, 200, 0], Hq=4, Hkv=2, D=128)])
    opts = [dict(), dict(window_size=(9, 0)), dict(softcap=20.0), dict(causal=False)]
    ok_all = True
    for c in cases:
        q, k, v, do, cq, ck = kit.case(**c, dtype=dtype, dev=dev)
        pd, pn = det_plan(c["D"], dtype, dev), nondet_plan(c["D"], dtype, dev)
        if dev.type == "cuda" and c["D"] == 256:
            t = dict(block_m=64, block_n=32, warps=8, stages=2)
            pd = dataclasses.replace(pd, **{f"dkdv_{n}": x for n, x in t.items()})
            pn = dataclasses.replace(pn, **{f"bwd_{n}": x for n, x in t.items()})
        for o in opts:
            ref = kit.grads(lambda *a, **kw: gqa_reference(*a, **kw)[0], q.double(), k.double(),
                         v.double(), do.double(), cq, ck, **o)
            det = kit.grads(gqa_det, q, k, v, do, cq, ck, plan=pd, **o)
            for name, kw in variants:
                install(**kw)
                try:
                    got = kit.grads(gqa, q, k, v, do, cq, ck, plan=pn, **o)
                except Exception as e:  # noqa: BLE001 - e.g. out of resources: say so, go on
                    ok_all = False
                    print(f"check {name} D={c['D']} {o}: FAIL {type(e).__name__}: "
                          f"{str(e)[:200]}", flush=True)
                    continue
                finally:
                    uninstall()
                errs = [kit.rel(a, b)
                        for a, b in zip(got, ref, strict=True)]
                same_dkdv = all(torch.equal(a, b) for a, b in zip(got[2:], det[2:],
                                                                  strict=True))
                tol = 2e-2 if dtype != torch.float32 else 5e-3
                ok = all(e < tol for e in errs) and same_dkdv
                ok_all &= ok
                print(f"check {name} D={c['D']} Hq/Hkv={c['Hq']}/{c['Hkv']} {o}: "
                      f"{'ok' if ok else 'FAIL'} rel out/dq/dk/dv "
                      f"{' '.join(f'{e:.1e}' for e in errs)} dk,dv == det: {same_dkdv}",
                      flush=True)
    return ok_all


def bench(out_path=None, dev=None, dtype=torch.bfloat16, shapes=None, timer=None):
    """fwd+bwd ms (do_bench median, bf16, causal) at issue 41's shapes: the det rule, the
    nondet rule, the one-pass kernel (pointer and TMA adds) over a few tilings, SDPA cuDNN."""
    from cake_gqa_det_train import gqa_det
    from cake_gqa_train import gqa

    dev = dev or torch.device("cuda")
    shapes = shapes or kit.SHAPES
    timer = timer or kit.do_bench_ms
    # None: the plan's (the det kernel's) tiling; the others from the offline report
    # (`aot`): the fewest spills of the TMA form at each D among the tilings that fit shared
    # memory (at D 256 the plan's 128 x 32 x 2 stages does not)
    tilings = {256: [(64, 32, 8, 2), (64, 32, 8, 1), (128, 32, 8, 1)],
               128: [None, (64, 64, 8, 2), (128, 64, 8, 1)]}
    pointer = {256: (64, 32, 8, 2), 128: None}
    rows = []
    for name, (lens, Hq, Hkv, D) in shapes.items():
        q, k, v, do, cq, ck = kit.case(lens, Hq, Hkv, D, dtype, dev)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

        def fb(fn, leaves=leaves, do=do, cq=cq, ck=ck):
            for t in leaves:
                t.grad = None
            fn(*leaves, cq, ck).backward(do)

        def ms(fn):
            try:
                return timer(lambda: fb(fn))
            except Exception as e:  # out of shared memory / registers: report, go on
                return f"{type(e).__name__}: {str(e)[:80]}"

        res = {}

        def record(impl, t, res=res, name=name):  # printed as it comes (a call may time out)
            res[impl] = t
            det = res.get("det")
            ratio = f"{t / det:.3f}" if isinstance(t, float) and isinstance(det, float) else "-"
            tt = f"{t:.3f}" if isinstance(t, float) else t
            print(f"bench {name} {impl:34s} {tt} ms  / det {ratio}", flush=True)
            rows.append(dict(shape=name, impl=impl, ms=t))

        uninstall()
        record("det", ms(gqa_det))
        record("nondet rule", ms(gqa))
        for tma, t in [(True, t) for t in tilings[D]] + [(False, pointer[D])]:
            install(tiles=t, tma_reduce=tma)
            record(f"onepass {'tma' if tma else 'ptr'} {t or 'plan tiles'}", ms(gqa))
        uninstall()
        if dev.type != "cuda":  # a dry run: no cuDNN
            continue
        record("sdpa cudnn", timer(kit.cudnn_fwd_bwd(q, k, v, do, lens, Hq, Hkv, D)))
    if out_path:
        with open(out_path, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           triton=triton.__version__, rows=rows), f, indent=1)


def aot():
    """Registers and spill bytes of the one-pass kernel for sm_90, compiled on this machine
    (shared/gpu/aot_regs.py's ptxas report; no GPU): both add forms, the bench's tilings."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from aot_regs import SIGNATURE, ptxas_report

    sig = dict(SIGNATURE)
    extra = dict(DQ="*fp32", sdqt="i32", sdqh="i32")
    names = list(sig)
    i = names.index("CU_Q")
    sig = {n: sig[n] for n in names[:i]} | {"DQ": extra["DQ"]} | \
        {n: sig[n] for n in names[i:names.index("GROUP")]} | \
        {"sdqt": "i32", "sdqh": "i32"} | {n: sig[n] for n in names[names.index("GROUP"):]} | \
        {"TMA_REDUCE": "constexpr"}
    for D, tiles in ((256, [(64, 64, 8, 2), (64, 32, 4, 2), (64, 32, 8, 2), (128, 32, 8, 2),
                            (128, 32, 8, 1), (64, 32, 8, 1)]),
                     (128, [(64, 64, 4, 2), (64, 64, 8, 2), (128, 64, 8, 2), (64, 32, 4, 2),
                            (128, 64, 8, 1)])):
        for bm, bn, warps, stages in tiles:
            for tma in (True, False):
                consts = dict(GROUP=8, D=D, BLOCK_M=bm, BLOCK_N=bn, VARLEN=True,
                              HAS_LEFT=False, HAS_RIGHT=True, SOFTCAP=False, TMA_REDUCE=tma)
                try:
                    rep = ptxas_report(gqa_bwd_onepass_kernel, consts, warps, stages, sig)
                except Exception as e:  # noqa: BLE001 - a configuration Triton refuses
                    rep = f"refused: {type(e).__name__}: {str(e)[:300]}"
                print(f"aot onepass {'tma' if tma else 'ptr'} D {D} {bm} x {bn} warps {warps} "
                      f"stages {stages}: {rep}", flush=True)


def main():
    cuda = kit.on_cuda()
    dev = torch.device("cuda" if cuda else "cpu")
    ok = True
    if "check" in sys.argv:
        variants = [("ptr", dict(tma_reduce=False))]
        if cuda:
            variants.append(("tma", dict(tma_reduce=True)))
        ok = check(dev, torch.bfloat16 if cuda else torch.float32, variants)
        print(f"check: {'all ok' if ok else 'FAILED'}", flush=True)
    if "aot" in sys.argv:
        aot()
    if "dry" in sys.argv and not cuda:  # the bench's code on a CPU, tiny shapes, fp32
        bench(dev=dev, dtype=torch.float32, shapes=kit.DRY_SHAPES, timer=kit.once_ms)
    if "bench" in sys.argv and cuda:
        out = os.environ.get("OUT")
        bench(os.path.join(out, "gqa_onepass.json") if out else None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
