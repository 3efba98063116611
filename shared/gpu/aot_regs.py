"""Registers and spills of cake-gqa-det-train's dK/dV kernel for sm_90, compiled ahead of time
on any machine (no GPU needed): Triton compiles for the named target (with the divisibility
its runtime gives aligned pointers and strides) and its bundled ptxas reports what each tile
configuration uses.

    python shared/gpu/aot_regs.py [D,BLOCK_M,BLOCK_N,WARPS,STAGES ...]

Default configurations: the CUDA rule's at D = 256 and 128 (causal, packed, GROUP 8). Each
line: the configuration, ptxas's registers per thread and spill bytes. A lead for a tile
sweep on the GPU, not a timing: spills cost time only where they sit in the hot loop.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret (cake's rule honours it)
sys.path[:0] = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..",
                                             "packages", "*", "src")))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

SMEM_LIMIT = 232448  # bytes of shared memory per block on sm_90 (227 KiB)
P = "*bf16"
SIGNATURE = dict(
    Q=P, K=P, V=P, DO=P, LSE="*fp32", DELTA="*fp32", DK=P, DV=P, CU_Q="*i32", CU_K="*i32",
    seq_q="i32", seq_k="i32", n_tok_q="i32", scale="fp32", softcap="fp32", left="i32",
    right="i32", sqt="i32", skt="i32", svt="i32", sdot="i32", Hq="i32", Hkv="i32",
    sdkt="i32", sdkh="i32", sdvt="i32", sdvh="i32", GROUP="constexpr", D="constexpr",
    BLOCK_M="constexpr", BLOCK_N="constexpr", VARLEN="constexpr", HAS_LEFT="constexpr",
    HAS_RIGHT="constexpr", SOFTCAP="constexpr")


def runtime_attrs(signature: dict) -> dict:
    """The divisibility Triton's runtime gives these arguments at issue 41's shapes: every
    pointer 16-byte aligned, every stride (``s...`` ints: multiples of D) divisible by 16."""
    from triton.backends.compiler import BaseBackend

    return {(i,): BaseBackend.parse_attr("D") for i, (n, t) in enumerate(signature.items())
            if t.startswith("*") or (t == "i32" and n.startswith("s") and n != "seq_q"
                                     and n != "seq_k" and n != "scale" and n != "softcap")}


def ptxas_report(kernel, consts: dict, num_warps: int, num_stages: int,
                 signature: dict | None = None) -> str:
    signature = signature or SIGNATURE
    src = ASTSource(fn=kernel, signature=signature, constexprs=consts,
                    attrs=runtime_attrs(signature))
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=num_warps, num_stages=num_stages))
    ptx = "/tmp/cake_aot_regs.ptx"
    with open(ptx, "w") as f:
        f.write(k.asm["ptx"])
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o", "/tmp/cake_aot_regs.cubin"],
                       capture_output=True, text=True, check=False)
    keep = [line.split(":", 1)[-1].strip() for line in r.stderr.splitlines()
            if "registers" in line or "spill" in line]
    # Triton's own shared memory (TMA buffers, pipeline stages, layout conversions): an
    # H100 / H200 block gets at most SMEM_LIMIT bytes; more is refused at the first launch
    keep.append(f"shared {k.metadata.shared} B" + (" (over the limit)" if k.metadata.shared >
                                                    SMEM_LIMIT else ""))
    return "; ".join(keep) or r.stderr[-300:]


def main() -> None:
    from cake_gqa_det_train.kernels import bwd

    configs = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]] or [
        (256, 64, 64, 8, 2), (128, 64, 64, 4, 2)]
    for D, bm, bn, warps, stages in configs:
        consts = dict(GROUP=8, D=D, BLOCK_M=bm, BLOCK_N=bn, VARLEN=True, HAS_LEFT=False,
                      HAS_RIGHT=True, SOFTCAP=False)
        try:
            rep = ptxas_report(bwd.gqa_bwd_dkdv_kernel, consts, warps, stages)
        except Exception as e:  # noqa: BLE001 - a configuration Triton refuses: say so
            rep = f"refused: {type(e).__name__}: {str(e)[:200]}"
        print(f"dkdv D {D} block_m {bm} block_n {bn} warps {warps} stages {stages}: {rep}",
              flush=True)


if __name__ == "__main__":
    main()
