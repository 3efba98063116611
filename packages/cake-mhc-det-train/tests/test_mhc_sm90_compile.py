"""Every kernel, with the tiles the CUDA plan rule picks, compiles for sm_90 (H100/H200)
offline through Triton's NVIDIA backend (no GPU needed: TTIR -> TTGIR -> LLVM -> PTX ->
cubin with the bundled ptxas) and fits the 227 KiB of shared memory a block may use.
Runs in a subprocess with TRITON_INTERPRET=0; skipped when the backend is missing."""

import os
import subprocess
import sys

import pytest

SCRIPT = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "0"
import torch
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from cake_mhc_det_train import plan as plan_mod
from cake_mhc_det_train.kernels import bwd, finish, fwd

plan_mod.sm_count = lambda d: 132
TARGET = GPUTarget("cuda", 90, 32)
SMEM = 227 * 1024
cases = [(sys.argv[1], int(n)) for n in sys.argv[2].split(",")]


def comp(kernel, consts, num_warps, **types):
    sig = {a: ("constexpr" if a in consts else types[a]) for a in kernel.arg_names}
    k = triton.compile(ASTSource(kernel, sig, constexprs=consts), target=TARGET,
                       options={"num_warps": num_warps})
    assert k.metadata.shared <= SMEM, (kernel.fn.__name__, k.metadata.shared)
    print(kernel.fn.__name__, xdt, n, k.metadata.shared)


for xdt, n in cases:
    p = plan_mod._rule(n, 4096, torch.device("cuda"))
    M, BM, X = p.n_coeffs, p.block_m, "*" + xdt
    f, i64, i32 = "*fp32", "i64", "i32"
    comp(fwd.mhc_mix_kernel, dict(N=n, M=M, BLOCK_M=BM, BLOCK_T=p.mix_block_t,
                                  BLOCK_C=p.mix_block_c, PREC=p.dot_precision), p.mix_warps,
         X=X, PHI=f, MIX=f, RSTD=f, n_tok=i32, C=i32, stride_xt=i64, stride_xi=i32,
         eps="fp32")
    comp(fwd.mhc_coef_kernel, dict(N=n, M=M, ITERS=20, BLOCK_T=p.coef_block_t,
                                   BLOCK_C=p.coef_block_c), p.coef_warps,
         X=X, MIX=f, ALPHA=f, BIAS=f, COEF=f, U=X, n_tok=i32, C=i32, stride_xt=i64,
         stride_xi=i32, stride_ut=i32)
    comp(finish.mhc_finish_fwd_kernel, dict(N=n, M=M, BLOCK_T=p.fin_block_t,
                                            BLOCK_C=p.fin_block_c), p.fin_warps,
         X=X, B=X, COEF=f, Y=X, n_tok=i32, C=i32, stride_xt=i64, stride_xi=i32,
         stride_bt=i32, stride_yt=i64, stride_yi=i32)
    comp(finish.mhc_finish_bwd_kernel, dict(N=n, M=M, BLOCK_T=p.fin_block_t,
                                            BLOCK_C=p.fin_block_c), p.fin_warps,
         DY=X, X=X, B=X, COEF=f, DX=X, DB=X, DCOEF=f, n_tok=i32, C=i32, stride_dyt=i64,
         stride_dyi=i32, stride_xt=i64, stride_xi=i32, stride_bt=i32, stride_dxt=i64,
         stride_dxi=i32, stride_dbt=i32)
    comp(bwd.mhc_bwd_coef_kernel, dict(N=n, M=M, ITERS=20, IP=32, BLOCK_T=p.coef_block_t,
                                       BLOCK_C=p.coef_block_c, HAS_DCOEF=True), p.coef_warps,
         X=X, DU=X, MIX=f, RSTD=f, ALPHA=f, BIAS=f, DCOEF=f, DZ=f, CX=f, PB=f, n_tok=i32,
         C=i32, stride_xt=i64, stride_xi=i32, stride_dut=i32)
    comp(bwd.mhc_bwd_dx_kernel, dict(N=n, M=M, BLOCK_M=BM, BLOCK_T=p.dx_block_t,
                                     BLOCK_C=p.dx_block_c, PREC=p.dot_precision,
                                     HAS_DX_IN=False), p.dx_warps,
         X=X, DU=X, DX_IN=X, COEF=f, DZ=f, CX=f, PHI=f, DX=X, PART=f, n_tok=i32, C=i32,
         n_slices=i32, stride_xt=i64, stride_xi=i32, stride_dut=i32, stride_dit=i64,
         stride_dii=i32, stride_dxt=i64, stride_dxi=i32)
comp(bwd.rows_sum_kernel, dict(BLOCK_R=16, BLOCK_W=256), 4, P="*fp32", OUT="*fp32",
     n_rows="i32", n_cols="i32")
print("ok")
'''


def _backend_available() -> bool:
    try:
        import triton.backends.nvidia as nv
    except ImportError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(nv.__file__), "bin", "ptxas"))


@pytest.mark.skipif(not _backend_available(), reason="Triton's NVIDIA backend is not installed")
def test_kernels_compile_for_sm90_within_shared_memory():
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # every n in both dtypes: the plans are dtype-agnostic (make_plan ignores the dtype),
    # so each rule plan must compile, within shared memory, for fp32 and for bf16 inputs
    for xdt in ("bf16", "fp32"):
        out = subprocess.run([sys.executable, "-c", SCRIPT, xdt, "2,4,8"], env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
