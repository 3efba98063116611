"""Per-kernel times of the GQA backward at the benchmark shapes, and candidate tiles for
each kernel alone (dev tooling). Prints ms per launch (do_bench medians).

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python shared/gpu/gqa_kernels.py
"""

from __future__ import annotations

import json
import os

import cake_gqa_det_train.launch as L
import torch
from cake_core.triton_utils import cdiv
from cake_gqa_det_train import gqa_det_fwd, make_plan
from cake_gqa_det_train.kernels.bwd import gqa_bwd_dkdv_kernel, gqa_bwd_dq_kernel
from triton.testing import do_bench

DEV = torch.device("cuda")
SHAPES = [(4, 4096, 16, 2, 256), (4, 4096, 32, 8, 128), (1, 32768, 16, 16, 128)]
CANDS = {
    256: {"dkdv": [(64, 64, 8, 2), (64, 64, 8, 1), (32, 64, 8, 2), (64, 32, 4, 2),
                   (64, 64, 4, 2), (128, 64, 8, 1)],
          "dq": [(128, 32, 8, 2), (128, 32, 8, 1), (64, 32, 4, 2), (64, 64, 8, 1),
                 (128, 16, 8, 2), (64, 32, 8, 2)]},
    128: {"dkdv": [(64, 64, 4, 2), (64, 64, 4, 3), (32, 64, 4, 2), (64, 128, 8, 2),
                   (32, 128, 8, 2), (64, 32, 4, 2), (128, 64, 8, 2), (64, 64, 8, 3)],
          "dq": [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 32, 4, 2),
                 (64, 32, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 2)]},
}


def main():
    res = []
    for B, S, Hq, Hkv, D in SHAPES:
        g = torch.Generator().manual_seed(0)
        q = torch.randn(B * S, Hq, D, generator=g).to(DEV, torch.bfloat16)
        k = torch.randn(B * S, Hkv, D, generator=g).to(DEV, torch.bfloat16)
        v = torch.randn(B * S, Hkv, D, generator=g).to(DEV, torch.bfloat16)
        do = torch.randn(B * S, Hq, D, generator=g).to(DEV, torch.bfloat16)
        cu = torch.arange(B + 1, device=DEV, dtype=torch.int32) * S
        plan = make_plan(D, torch.bfloat16, DEV)
        out, lse, saved = gqa_det_fwd(q, k, v, cu, cu, max_seqlen_q=S, max_seqlen_k=S)
        ints = saved.meta["ints"]
        seq_q, seq_k, n_docs, max_q, max_k, left, right = ints
        scale = saved.meta["scale"]
        delta = torch.empty(Hq * B * S, device=DEV)
        fwd_ms = do_bench(lambda: L.launch_fwd(q, k, v, cu, cu, ints, scale, 0.0,
                                               plan.fwd_block_m, plan.fwd_block_n,
                                               plan.fwd_warps, plan.fwd_stages))
        delta_ms = do_bench(lambda: L.launch_delta(out, do, delta, plan.delta_block_m))
        row = {"shape": (B, S, Hq, Hkv, D), "fwd": fwd_ms, "delta": delta_ms}
        print(row, flush=True)
        dq = torch.empty_like(q)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        common = (seq_q, seq_k, B * S, scale, 0.0, left, right, q.stride(0), q.stride(1),
                  k.stride(0), k.stride(1), v.stride(0), v.stride(1), do.stride(0),
                  do.stride(1))
        flags = dict(VARLEN=True, HAS_LEFT=False, HAS_RIGHT=True, SOFTCAP=False)
        for kind in ("dkdv", "dq"):
            for bm, bn, w, st in CANDS[D][kind]:
                if kind == "dkdv":
                    def f():
                        gqa_bwd_dkdv_kernel[(cdiv(max_k, bn), Hkv, n_docs)](
                            q, k, v, do, lse, delta, dk, dv, cu, cu, *common,
                            dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
                            GROUP=Hq // Hkv, D=D, BLOCK_M=bm, BLOCK_N=bn, **flags,
                            num_warps=w, num_stages=st)
                else:
                    def f():
                        gqa_bwd_dq_kernel[(cdiv(max_q, bm), Hq, n_docs)](
                            q, k, v, do, lse, delta, dq, cu, cu, *common, dq.stride(0),
                            dq.stride(1), GROUP=Hq // Hkv, D=D, BLOCK_M=bm, BLOCK_N=bn,
                            **flags, num_warps=w, num_stages=st)
                try:
                    ms = do_bench(f)
                except Exception as e:  # noqa: BLE001
                    ms = repr(e)[:80]
                row[f"{kind} {bm}x{bn} w{w} s{st}"] = ms
                print(row["shape"], kind, (bm, bn, w, st), ms, flush=True)
        res.append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "gqa_kernels.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
