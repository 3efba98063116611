"""Build the MoE grouped GEMM kernels for sm_90 without a GPU and print what the builds say:
registers, stack (spills), shared memory, and whether the code uses Hopper's warpgroup MMA
(PTX ``wgmma``, SASS ``HGMMA``) and TMA bulk tensor copies (PTX ``cp.async.bulk.tensor``,
SASS ``UTMALDG``), plus counts of other SASS instruction groups.

    TRITON_INTERPRET=0 python benchmarks/offline_build_moe.py [--dtype bf16] [--main-grad]

Compiles, as ``api.py`` launches them, the pointer kernels (``grouped_mm_kernel``,
``grouped_wgrad_kernel``; plan ``tma = 0``) and the TMA kernels (``grouped_mm_tma_kernel``
forward (``B_T``: ``[1, block_n, block_k]`` weight boxes transposed in registers) and dgrad
(``[1, block_k, block_n]`` boxes), ``grouped_wgrad_tma_kernel`` with dy read as
``[wgrad_block_k, wgrad_block_m]`` boxes transposed in registers; plan ``tma = 1``) at the
CUDA rule's tiles (128x128x64, 8 warps, 3 stages) and a 128x256x64 variant. The wgrad writes
a cast dW (split 1), or with ``--main-grad`` adds into an fp32 ``main_grad``. Uses Triton's
own compiler (GPUTarget("cuda", 90, 32)) and its bundled cuobjdump. Static facts, not
timings: to be confirmed on the GPU. Needs ``TRITON_INTERPRET=0`` on a machine without CUDA
(else cake picks the interpreter).
"""

from __future__ import annotations

import argparse
import os

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("unset TRITON_INTERPRET: this builds real sm_90 code")

import triton  # noqa: E402
from cake_core.bench import offline_sm90_build as build  # noqa: E402


def main():
    from cake_moe_grouped_det_gemm.kernels import (
        grouped_mm_kernel,
        grouped_mm_tma_kernel,
        grouped_wgrad_kernel,
        grouped_wgrad_tma_kernel,
    )

    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--main-grad", action="store_true",
                   help="wgrad: accumulate into an fp32 main_grad instead of writing dW")
    p.add_argument("--experts", type=int, default=8, help="E (sets BLOCK_G = pow2(E + 1))")
    p.add_argument("--wgrad-order", type=int, default=0, choices=[0, 1],
                   help="plan wgrad_order (1: expert tiles read their expert from ORDER)")
    a = p.parse_args()
    dt = a.dtype
    o_ty = "*fp32" if a.main_grad else f"*{dt}"
    block_g = max(2, triton.next_power_of_2(a.experts + 1))
    tiles = [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3)]
    rows = []
    for bm, bn, bk, warps, stages in tiles:
        blocks = dict(IEEE=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
        ints = ("G", "n_cols", "R", "stride_cm")
        # pointer fwd: A = x [M, K] (stride_ar 1), B[e] = W[e]ᵀ (stride_br 1 over K);
        # dgrad: A = dy [M, N], B[e] = W[e] (stride_bc 1 over K). Unit strides specialise.
        for name, unit in (("fwd", "stride_br"), ("dgrad", "stride_bc")):
            t = {"A": f"*{dt}", "B": f"*{dt}", "C": f"*{dt}", "SCHED": "*i32",
                 **{n: "i32" for n in (*ints, "stride_am", "stride_be", "stride_br",
                                        "stride_bc")}}
            c = dict(blocks, BLOCK_G=block_g, stride_ar=1, stride_cn=1, **{unit: 1})
            rows.append((f"pointer {name} {bm}x{bn}x{bk}", warps, stages,
                         *build(grouped_mm_kernel, t, c,
                                ("A", "B", "C", "SCHED", "stride_am", "stride_be",
                                 "stride_br" if unit == "stride_bc" else "stride_bc",
                                 "stride_cm"), warps, stages)))
            box = f"[1, {bn}, {bk}]" if name == "fwd" else f"[1, {bk}, {bn}]"
            t = {"A_DESC": f"tensordesc<{dt}[{bm}, {bk}]>", "B_DESC": f"tensordesc<{dt}{box}>",
                 "C": f"*{dt}", "SCHED": "*i32", **{n: "i32" for n in ints}}
            c = dict(blocks, BLOCK_G=block_g, stride_cn=1, B_T=name == "fwd")
            rows.append((f"tma {name} {bm}x{bn}x{bk}", warps, stages,
                         *build(grouped_mm_tma_kernel, t, c, ("C", "SCHED", "stride_cm"),
                                warps, stages)))
        # wgrad: dW [E, N, K] tiles BLOCK_M over N, BLOCK_N over K, BLOCK_K rows per step
        wints = ("N", "K", "n_tiles_n", "n_tiles_k", "stride_os", "stride_oe", "stride_on")
        common = dict(blocks, SPLIT=1, ACCUMULATE=a.main_grad, stride_ok=1,
                      REORDER=a.wgrad_order == 1)
        t = {"DY": f"*{dt}", "X": f"*{dt}", "OUT": o_ty, "ENDS": "*i32", "ORDER": "*i32",
             **{n: "i32" for n in (*wints, "stride_dym", "stride_xm")}}
        c = dict(common, stride_dyn=1, stride_xk=1)
        rows.append((f"pointer wgrad {bm}x{bn}x{bk}", warps, stages,
                     *build(grouped_wgrad_kernel, t, c,
                            ("DY", "X", "OUT", "ENDS", "ORDER", "stride_dym", "stride_xm",
                             "stride_oe", "stride_on"), warps, stages)))
        t = {"DY_DESC": f"tensordesc<{dt}[{bk}, {bm}]>", "X_DESC": f"tensordesc<{dt}[{bk}, {bn}]>",
             "OUT": o_ty, "ENDS": "*i32", "ORDER": "*i32", **{n: "i32" for n in wints}}
        rows.append((f"tma wgrad {bm}x{bn}x{bk}", warps, stages,
                     *build(grouped_wgrad_tma_kernel, t, common,
                            ("OUT", "ENDS", "ORDER", "stride_oe", "stride_on"), warps,
                            stages)))
    print(f"dtype {dt}, wgrad output {'fp32 main_grad (accumulate)' if a.main_grad else dt}, "
          f"BLOCK_G {block_g}")
    for what, warps, stages, regs, spills, smem, ptx, counts in rows:
        print(f"{what:30s} warps={warps} stages={stages} regs={regs} stack={spills} "
              f"smem={smem} | PTX " + " ".join(f"{k}={v}" for k, v in ptx.items())
              + " | SASS " + " ".join(f"{k}={v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
