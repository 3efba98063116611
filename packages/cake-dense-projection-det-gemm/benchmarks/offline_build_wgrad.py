"""Build the dense projection's wgrad GEMM for sm_90 without a GPU and print what the builds
say: registers, stack (spills), shared memory, and whether the code uses Hopper's warpgroup
MMA (PTX ``wgmma``, SASS ``HGMMA``) and TMA bulk tensor copies (PTX
``cp.async.bulk.tensor``, SASS ``UTMALDG``), plus counts of other SASS instruction groups.

    TRITON_INTERPRET=0 python benchmarks/offline_build_wgrad.py [--dtype bf16]

Compiles ``dW[N, K] = dyᵀ[N, M] · x[M, K]`` as the dense package launches it: the pointer
kernel (``cake_core.gemm.matmul_kernel``, ``wgrad_tma = 0``) with ``a = dy.t()`` (unit row
stride) and the TMA kernel (``matmul_tma_kernel``, ``wgrad_tma = 1``; ``2`` = persistent)
with dy read as ``[block_k, block_m]`` tiles of the row-major dy and transposed in
registers, with the TMA-store epilogue matmul picks for a 16-bit dW and with the pointer
epilogue (used for the fp32 main_grad accumulate and split partial planes), at the CUDA
rule's wgrad tiles: 128x256x64 and 128x128x64 (8 warps, 3 stages). The output is written
cast (``dW``) or, with ``--main-grad``, added into an fp32 ``main_grad``. Uses Triton's own
compiler (GPUTarget("cuda", 90, 32)) and its bundled cuobjdump. Static facts, not timings:
to be confirmed on the GPU.
Needs ``TRITON_INTERPRET=0`` on a machine without CUDA (else cake picks the interpreter).
"""

from __future__ import annotations

import argparse
import os

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("unset TRITON_INTERPRET: this builds real sm_90 code")

from cake_core.bench import offline_sm90_build as build  # noqa: E402


def main():
    from cake_core.gemm import matmul_kernel, matmul_tma_kernel

    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--main-grad", action="store_true",
                   help="accumulate into an fp32 main_grad instead of writing dW")
    a = p.parse_args()
    dt = a.dtype
    c_ty = "*fp32" if a.main_grad else f"*{dt}"
    tiles = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3)]
    rows = []
    for bm, bn, bk, warps, stages in tiles:
        common = dict(PREC="", ACCUMULATE=a.main_grad, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                      GROUP_M=8)
        # pointer kernel: A = dy.t() [N, M] strides (1, N); B = x [M, K] strides (K, 1);
        # C = dW [N, K] strides (K, 1). Strides equal to 1 are specialised to constexprs at
        # launch (as Triton's JIT does).
        t = {"A": f"*{dt}", "B": f"*{dt}", "C": c_ty, "BIAS": c_ty, "SCALE": c_ty,
             **{n: "i32" for n in ("M", "N", "K", "k_per_split", "n_tiles_m", "n_tiles_n",
                                    "stride_ak", "stride_bk", "stride_cs", "stride_cm")}}
        c = dict(common, stride_am=1, stride_bn=1, stride_cn=1, HAS_BIAS=False,
                 HAS_SCALE=False)
        rows.append((f"pointer {bm}x{bn}x{bk}", warps, stages,
                     *build(matmul_kernel, t, c, ("A", "B", "C", "BIAS", "SCALE", "stride_ak",
                                                  "stride_bk", "stride_cm"), warps, stages)))
        # matmul's rule: a TMA store for a 16-bit dW (split 1), pointer stores otherwise
        stores = (False,) if a.main_grad else (True, False)
        for persistent in (False, True):
            for c_tma in stores:
                t = {"A_DESC": f"tensordesc<{dt}[{bk}, {bm}]>",  # tiles of row-major dy
                     "B_DESC": f"tensordesc<{dt}[{bk}, {bn}]>",  # tiles of row-major x
                     "C": c_ty, "C_DESC": f"tensordesc<{dt}[{bm}, {bn}]>", "SCALE": c_ty,
                     **{n: "i32" for n in ("M", "N", "K", "k_per_split", "n_tiles_m",
                                            "n_tiles_n", "n_splits", "stride_cs",
                                            "stride_cm")}}
                c = dict(common, stride_cn=1, A_T=True, B_T=False, PERSISTENT=persistent,
                         C_TMA=c_tma, HAS_SCALE=False)
                if not c_tma:
                    c["C_DESC"] = None
                name = (f"tma{'-persist' if persistent else ''} {bm}x{bn}x{bk} "
                        f"{'tma-store' if c_tma else 'ptr-store'}")
                rows.append((name, warps, stages,
                             *build(matmul_tma_kernel, t, c, ("C", "stride_cm"), warps,
                                    stages)))
    print(f"dtype {dt}, output {'fp32 main_grad (accumulate)' if a.main_grad else dt + ' dW'}")
    for what, warps, stages, regs, spills, smem, ptx, counts in rows:
        print(f"{what:36s} warps={warps} stages={stages} regs={regs} stack={spills} "
              f"smem={smem} | PTX " + " ".join(f"{k}={v}" for k, v in ptx.items())
              + " | SASS " + " ".join(f"{k}={v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
