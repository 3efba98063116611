"""Candidate for issue 41 (det GQA at cuDNN's time, head dim 256): the dK / dV kernel with its
two accumulating products transposed ("swap AB", as FlashAttention-3's Hopper backward
does), so that the tensor cores' asynchronous warpgroup MMA (wgmma) can run them. Dev
tooling, ships in no wheel; cake-gqa-det-train keeps its rule until this is timed.

At D = 256 the rule's dK / dV programs own 32 keys (``dkdv_block_n = 32``: the 64 x 256 fp32
dK and dV accumulators spilled). The products that accumulate them, dV += P^T dO and
dK += dS^T Q, then have M = 32 rows, under the 64 a warpgroup MMA needs: compiled for sm_90,
the rule's kernel runs them as 256 legacy ``mma.sync m16n8k16`` instructions per step, half of
the kernel's FLOPs, beside 64 ``wgmma`` for Q K^T and dO V^T (`python shared/gpu/
gqa_swapab.py aot`). Accumulating the transposes instead, dV^T += dO^T P and dK^T += Q^T dS
(``[D, BLOCK_N]``), gives the products M = D = 256: wgmma for all four. The registers are the
same (the same accumulator sizes); P and dS go through shared memory as the B operand, which
FlashAttention-3 does too. The cost is shared memory: Triton keeps transposed copies of the
Q and dO tiles for the A operands, so at the rule's 128 x 32 tiles and 2 stages the kernel
needs 305152 bytes, over the 232448 a block gets; 64 x 32 (4 or 8 warps, 2 stages) or 128 x
32 with 1 stage fit (`aot` prints each tiling's).

Each sum has the same terms in the same order of query blocks and heads; only the tensor
core's order inside a product can differ, so the bits may differ from the rule's (both
deterministic).

    # CPU, interpreter: parity against float64 (fp32 inputs, the CPU plan's tiles)
    TRITON_INTERPRET=1 PYTHONPATH=$(ls -d packages/*/src | paste -sd:) \\
        python shared/gpu/gqa_swapab.py check
    # any machine: registers, spills and MMA instructions for sm_90 of both forms
    TRITON_INTERPRET=0 PYTHONPATH=$(ls -d packages/*/src | paste -sd:) \\
        python shared/gpu/gqa_swapab.py aot
    # CPU: the bench's code on tiny shapes (timings meaningless): ... gqa_swapab.py dry
    # GPU: bf16 parity and repeat, then fwd+bwd ms beside the rule and SDPA cuDNN
    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python shared/gpu/gqa_swapab.py check bench
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import gqa_candidate_kit as kit
import torch
from cake_core.triton_utils import dot, select_backend

select_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from cake_gqa_det_train import launch as _launch  # noqa: E402
from cake_gqa_det_train.kernels.bwd import key_block, lse2_row, query_range  # noqa: E402
from cake_gqa_det_train.kernels.common import (  # noqa: E402
    doc_bounds,
    doc_desc,
    full_q_blocks,
    scores2,
    visible,
)

_RULE_KERNEL = _launch.gqa_bwd_dkdv_kernel


@triton.jit
def dkdv_step_t(dkt, dvt, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start, offs_n, len_q,
                len_k, shift, n_tok_q, scale, softcap, left, right, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, D: tl.constexpr, HAS_LEFT: tl.constexpr,
                HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, MASK: tl.constexpr):
    """The rule's step (cake_gqa_det_train.kernels.bwd.dkdv_step) with the transposed
    accumulators ``dkt``, ``dvt`` ``[D, BLOCK_N]``: dV^T += dO^T P, dK^T += Q^T dS."""
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
    dvt = dot(tl.trans(do), p.to(do.dtype), dvt)
    dp = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    dp = dot(do, tl.trans(v), dp)
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    dkt = dot(tl.trans(q), ds.to(q.dtype), dkt)
    return dkt, dvt


@triton.jit
def gqa_bwd_dkdv_swap_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K,
    seq_q, seq_k, n_tok_q, scale, softcap, left, right,
    sqt, skt, svt, sdot, Hq, Hkv, sdkt, sdkh, sdvt, sdvh,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """The rule's gqa_bwd_dkdv_kernel (same arguments, grid, sums and order of terms) with
    transposed accumulators, stored back transposed."""
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
    dkt = tl.zeros([D, BLOCK_N], tl.float32)
    dvt = tl.zeros([D, BLOCK_N], tl.float32)
    for g in range(GROUP):
        h = hk * GROUP + g
        for m_start in range(lo, a, BLOCK_M):
            dkt, dvt = dkdv_step_t(dkt, dvt, k, v, q_desc, do_desc, LSE, DELTA, h, q0,
                                   m_start, offs_n, len_q, len_k, shift, n_tok_q, scale,
                                   softcap, left, right, BLOCK_M, BLOCK_N, D, HAS_LEFT,
                                   HAS_RIGHT, SOFTCAP, True)
        for m_start in range(a, b, BLOCK_M):
            dkt, dvt = dkdv_step_t(dkt, dvt, k, v, q_desc, do_desc, LSE, DELTA, h, q0,
                                   m_start, offs_n, len_q, len_k, shift, n_tok_q, scale,
                                   softcap, left, right, BLOCK_M, BLOCK_N, D, HAS_LEFT,
                                   HAS_RIGHT, SOFTCAP, False)
        for m_start in range(b, hi, BLOCK_M):
            dkt, dvt = dkdv_step_t(dkt, dvt, k, v, q_desc, do_desc, LSE, DELTA, h, q0,
                                   m_start, offs_n, len_q, len_k, shift, n_tok_q, scale,
                                   softcap, left, right, BLOCK_M, BLOCK_N, D, HAS_LEFT,
                                   HAS_RIGHT, SOFTCAP, True)
    rows_k = (k0 + offs_n)[None, :].to(tl.int64)
    hk64 = hk.to(tl.int64)
    tl.store(DK + rows_k * sdkt + hk64 * sdkh + offs_d[:, None],
             (dkt * scale).to(DK.dtype.element_ty), mask=col_ok[None, :])
    tl.store(DV + rows_k * sdvt + hk64 * sdvh + offs_d[:, None],
             dvt.to(DV.dtype.element_ty), mask=col_ok[None, :])


def install():
    """cake-gqa-det-train's det backward (and cake-gqa-train's, which launches the det
    kernel under its CUDA rule) through the swapped kernel."""
    _launch.gqa_bwd_dkdv_kernel = gqa_bwd_dkdv_swap_kernel
    _nondet_module().gqa_bwd_dkdv_kernel = gqa_bwd_dkdv_swap_kernel


def uninstall():
    _launch.gqa_bwd_dkdv_kernel = _RULE_KERNEL
    _nondet_module().gqa_bwd_dkdv_kernel = _RULE_KERNEL


def _nondet_module():
    import cake_gqa_train.api as api

    return api


def check(dev, dtype):
    """gqa_det with the swapped kernel against float64 (and the rule's dK / dV beside it),
    and its dK / dV repeated bitwise. At D 256 on CUDA both at 64 x 32 tiles, 4 warps (the
    swapped kernel at the rule's 128 x 32 does not fit shared memory)."""
    import dataclasses

    from cake_gqa_det_train import gqa_det, gqa_reference, make_plan

    cases = ([dict(lens=[0, 1, 33, 40], Hq=4, Hkv=2, D=64),
              dict(lens=[20, 7], lens_k=[30, 0], Hq=2, Hkv=1, D=128)]
             if dev.type == "cpu" else
             [dict(lens=[0, 1, 63, 64, 65, 700, 1500], Hq=16, Hkv=2, D=256),
              dict(lens=[100, 500, 33], lens_k=[300, 200, 0], Hq=4, Hkv=2, D=256),
              dict(lens=[0, 1, 63, 64, 65, 700, 1500], Hq=8, Hkv=8, D=128),
              dict(lens=[5, 300, 129, 1000], Hq=4, Hkv=1, D=64)])
    opts = [dict(), dict(window_size=(9, 0)), dict(softcap=20.0), dict(causal=False)]
    tol = 5e-3 if dtype == torch.float32 else 2e-2
    ok_all = True
    for c in cases:
        q, k, v, do, cq, ck = kit.case(**c, dtype=dtype, dev=dev)
        plan = make_plan(c["D"], dtype, dev)
        if dev.type == "cuda" and c["D"] == 256:
            plan = dataclasses.replace(plan, dkdv_block_m=64, dkdv_block_n=32, dkdv_warps=4,
                                       dkdv_stages=2)
        for o in opts:
            ref = kit.grads(lambda *a, **kw: gqa_reference(*a, **kw)[0], q.double(), k.double(),
                         v.double(), do.double(), cq, ck, **o)
            try:
                uninstall()
                rule = kit.grads(gqa_det, q, k, v, do, cq, ck, plan=plan, **o)
                install()
                got = kit.grads(gqa_det, q, k, v, do, cq, ck, plan=plan, **o)
                again = kit.grads(gqa_det, q, k, v, do, cq, ck, plan=plan, **o)
            except Exception as e:  # noqa: BLE001 - e.g. out of resources: say so, go on
                ok_all = False
                print(f"check D={c['D']} {o}: FAIL {type(e).__name__}: {str(e)[:200]}",
                      flush=True)
                continue
            finally:
                uninstall()
            errs = [kit.rel(a, b)
                    for a, b in zip(got, ref, strict=True)]
            rule_errs = [kit.rel(a, b)
                         for a, b in zip(rule[2:], ref[2:], strict=True)]
            repeat = all(torch.equal(a, b) for a, b in zip(got, again, strict=True))
            same = all(torch.equal(a, b) for a, b in zip(got[2:], rule[2:], strict=True))
            ok = all(e < tol for e in errs) and repeat
            ok_all &= ok
            print(f"check D={c['D']} Hq/Hkv={c['Hq']}/{c['Hkv']} {o}: {'ok' if ok else 'FAIL'}"
                  f" rel out/dq/dk/dv {' '.join(f'{e:.1e}' for e in errs)}; rule dk/dv "
                  f"{' '.join(f'{e:.1e}' for e in rule_errs)}; repeats {repeat}; "
                  f"dk,dv bits = rule's {same}", flush=True)
    return ok_all


def aot():
    """Registers, spills and MMA instructions of both forms for sm_90 (no GPU needed)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import aot_regs

    for D, tiles in ((256, [(128, 32, 8, 2), (64, 64, 8, 2), (128, 64, 8, 2), (64, 32, 8, 2),
                            (128, 32, 4, 2), (128, 32, 8, 1), (64, 32, 4, 2), (64, 32, 8, 3),
                            (64, 64, 4, 2)]),
                     (128, [(64, 64, 4, 2), (128, 64, 8, 2)])):
        for bm, bn, warps, stages in tiles:
            for name, kern in (("rule", _RULE_KERNEL), ("swap", gqa_bwd_dkdv_swap_kernel)):
                consts = dict(GROUP=8, D=D, BLOCK_M=bm, BLOCK_N=bn, VARLEN=True,
                              HAS_LEFT=False, HAS_RIGHT=True, SOFTCAP=False)
                try:
                    rep = aot_regs.ptxas_report(kern, consts, warps, stages)
                    ptx = open("/tmp/cake_aot_regs.ptx").read()
                    mma = {m: len(re.findall(m, ptx)) for m in ("wgmma.mma_async",
                                                                 "mma.sync.aligned")}
                    spill = re.search(r"(\d+) bytes spill stores", rep)
                    regs = re.search(r"Used (\d+) registers", rep)
                    smem = re.search(r"shared (\d+) B( \(over the limit\))?", rep)
                    rep = (f"registers {regs.group(1) if regs else '?'}, spill stores "
                           f"{spill.group(1) if spill else '?'} B, wgmma {mma['wgmma.mma_async']}"
                           f", mma.sync {mma['mma.sync.aligned']}, shared "
                           f"{smem.group(0)[7:] if smem else '?'}")
                except (Exception, subprocess.SubprocessError) as e:  # noqa: BLE001
                    rep = f"refused: {type(e).__name__}: {str(e)[:200]}"
                print(f"aot {name} D {D} {bm} x {bn} warps {warps} stages {stages}: {rep}",
                      flush=True)


def bench(dev=None, dtype=torch.bfloat16, shapes=None, timer=None):
    """fwd+bwd ms (do_bench median, bf16, causal) at issue 41's shapes: the rule, the swapped
    kernel (at D 256 in tilings that fit shared memory; at D 128 at the rule's tiles), and
    SDPA cuDNN."""
    import dataclasses

    from cake_gqa_det_train import gqa_det, make_plan

    dev = dev or torch.device("cuda")
    shapes = shapes or kit.SHAPES
    timer = timer or kit.do_bench_ms
    for name, (lens, Hq, Hkv, D) in shapes.items():
        q, k, v, do, cq, ck = kit.case(lens, Hq, Hkv, D, dtype, dev)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        base = make_plan(D, dtype, dev)

        def fb(plan, leaves=leaves, do=do, cq=cq, ck=ck):
            for t in leaves:
                t.grad = None
            gqa_det(*leaves, cq, ck, plan=plan).backward(do)

        def ms(plan):
            try:
                return f"{timer(lambda: fb(plan)):.3f}"
            except Exception as e:  # out of shared memory / registers: report, go on
                return f"{type(e).__name__}: {str(e)[:80]}"

        variants = [("rule", False, base)]
        if D == 256:
            # the swapped kernel at the rule's 128 x 32 x 2 stages needs 305152 bytes of
            # shared memory (transposed copies of the Q and dO tiles), over the 232448 a block
            # gets; these fit (`aot`): (query rows, keys, warps, stages)
            for bm, bn, w, st in ((64, 32, 4, 2), (64, 32, 8, 2), (128, 32, 8, 1),
                                  (64, 64, 8, 2)):
                variants.append((f"swap {bm} x {bn}, {w} warps, {st} st", True,
                                 dataclasses.replace(base, dkdv_block_m=bm, dkdv_block_n=bn,
                                                     dkdv_warps=w, dkdv_stages=st)))
        else:
            variants.append(("swap, rule tiles", True, base))
        for label, swap, plan in variants:
            (install if swap else uninstall)()
            print(f"bench {name} {label:22s} {ms(plan)} ms", flush=True)
        uninstall()
        if dev.type != "cuda":  # a dry run: no cuDNN
            continue
        cudnn = kit.cudnn_fwd_bwd(q, k, v, do, lens, Hq, Hkv, D)
        print(f"bench {name} {'sdpa cudnn':22s} {timer(cudnn):.3f} ms", flush=True)


def main():
    cuda = kit.on_cuda()
    dev = torch.device("cuda" if cuda else "cpu")
    ok = True
    if "check" in sys.argv:
        ok = check(dev, torch.bfloat16 if cuda else torch.float32)
        print(f"check: {'all ok' if ok else 'FAILED'}", flush=True)
    if "aot" in sys.argv:
        aot()
    if "dry" in sys.argv and not cuda:  # the bench's code on a CPU, tiny shapes, fp32
        bench(dev=dev, dtype=torch.float32, shapes=kit.DRY_SHAPES, timer=kit.once_ms)
    if "bench" in sys.argv and cuda:
        bench()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
