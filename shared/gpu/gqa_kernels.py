"""Per-kernel times of the GQA forward and backward at the benchmark shapes, for candidate
tiles of each kernel alone (dev tooling; the search space of the plan rules). Prints ms per
launch (do_bench medians), registers and spills.

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python shared/gpu/gqa_kernels.py [a b c]
"""

from __future__ import annotations

import json
import os
import sys

import cake_gqa_det_train.launch as L
import torch
from cake_core.triton_utils import cdiv, ensure_scratch_allocator
from cake_gqa_det_train import gqa_det_fwd, make_plan
from cake_gqa_det_train.kernels.bwd import gqa_bwd_dkdv_kernel, gqa_bwd_dq_kernel
from cake_gqa_det_train.kernels.fwd import gqa_fwd_kernel
from triton.testing import do_bench

DEV = torch.device("cuda")
SHAPES = {"a": (4, 4096, 16, 2, 256), "b": (4, 4096, 32, 8, 128),
          "c": (1, 32768, 16, 16, 128)}
# fwd: (block_m, block_n, warps, stages); dkdv: (block_m rows per step, block_n keys per
# program, ...); dq: (block_m rows per program, block_n keys per step, ...)
CANDS = {
    256: {"fwd": [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 8, 3)],
          "dkdv": [(64, 64, 8, 2), (64, 64, 8, 1), (32, 64, 8, 3), (64, 32, 4, 2)],
          "dq": [(128, 32, 8, 3), (128, 32, 8, 2), (64, 64, 4, 2), (64, 64, 8, 2)]},
    128: {"fwd": [(128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 3)],
          "dkdv": [(64, 64, 4, 2), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 3)],
          "dq": [(128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3)]},
}


def _regs(ck):
    try:
        return int(ck.n_regs), int(ck.n_spills)
    except Exception:  # noqa: BLE001
        return None, None


def main(names):
    ensure_scratch_allocator()
    res = []
    for name in names:
        B, S, Hq, Hkv, D = SHAPES[name]
        g = torch.Generator().manual_seed(0)
        q, k, v, do = (torch.randn(B * S, h, D, generator=g).to(DEV, torch.bfloat16)
                       for h in (Hq, Hkv, Hkv, Hq))
        cu = torch.arange(B + 1, device=DEV, dtype=torch.int32) * S
        plan = make_plan(D, torch.bfloat16, DEV)
        out, lse, saved = gqa_det_fwd(q, k, v, cu, cu, max_seqlen_q=S, max_seqlen_k=S)
        ints = saved.meta["ints"]
        _, _, n_docs, max_q, max_k, _, _ = ints
        scale = saved.meta["scale"]
        delta = torch.empty(Hq * B * S, device=DEV)
        row = {"shape": SHAPES[name],
               "delta": do_bench(lambda: L.launch_delta(out, do, delta, plan.delta_block_m))}
        L.launch_delta(out, do, delta, plan.delta_block_m)
        common = L.bwd_common(q, k, v, do, ints, scale, 0.0)
        flags = dict(VARLEN=True, HAS_LEFT=False, HAS_RIGHT=True, SOFTCAP=False)
        o, dq = torch.empty_like(q), torch.empty_like(q)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        for kind in ("fwd", "dkdv", "dq"):
            for bm, bn, w, st in CANDS[D][kind]:
                if kind == "fwd":
                    def f():
                        return gqa_fwd_kernel[(cdiv(max_q, bm), Hq, n_docs)](
                            q, k, v, o, lse, cu, cu, *common[:7], *common[7:10],
                            o.stride(0), o.stride(1), Hq, Hkv, GROUP=Hq // Hkv, D=D,
                            BLOCK_M=bm, BLOCK_N=bn, **flags, num_warps=w, num_stages=st)
                elif kind == "dkdv":
                    def f():
                        return gqa_bwd_dkdv_kernel[(cdiv(max_k, bn), Hkv, n_docs)](
                            q, k, v, do, lse, delta, dk, dv, cu, cu, *common,
                            dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
                            GROUP=Hq // Hkv, D=D, BLOCK_M=bm, BLOCK_N=bn, **flags,
                            num_warps=w, num_stages=st)
                else:
                    def f():
                        return gqa_bwd_dq_kernel[(cdiv(max_q, bm), Hq, n_docs)](
                            q, k, v, do, lse, delta, dq, cu, cu, *common, dq.stride(0),
                            dq.stride(1), GROUP=Hq // Hkv, D=D, BLOCK_M=bm, BLOCK_N=bn,
                            **flags, num_warps=w, num_stages=st)
                key = f"{kind} {bm}x{bn} w{w} s{st}"
                try:
                    ck = f()
                    row[key] = {"ms": do_bench(f), "regs": _regs(ck)}
                except Exception as e:  # noqa: BLE001
                    row[key] = repr(e)[:120]
                print(name, key, row[key], flush=True)
        res.append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "gqa_kernels.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1:] or ["a", "b", "c"])
