"""The main job's fp32 GEMMs (issue 45): cake-core's exact fp32 matmul against cuBLAS.

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python shared/gpu/fp32_gemm.py [--tiny]

The tinylm CUDA default (d_model 512, 32 x 512 tokens, fp32) runs its projections through
cake_dense_projection_det_gemm, whose fp32 plan multiplies with ``input_precision="ieee"``
(exact fp32 products), while torch's build calls cuBLAS SGEMM (``allow_tf32`` off, torch's
default). Per projection shape (M, N, K) and per GEMM (fwd ``x @ W^T``, dgrad ``dy @ W``,
wgrad ``dy^T @ x`` with the rule's slices): the rule's tiles, each tile variant in TILES,
the TMA kernel, and ``torch.mm`` with TF32 off (and whether 5 calls repeat bit for bit);
TF32 cuBLAS for scale. Then the same GEMMs through cake-core's
``matmul(..., fp32_precision=...)`` for each of "tf32x3", "bf16x6" (tensor-core products of
split operands) and "ieee" at the tilings in PREC_TILES: speed, distance to float64, repeat. Dev
tooling, ships in no wheel.
"""
from __future__ import annotations

import json
import os
import sys

import torch
from cake_core.gemm import matmul
from cake_core.testing import bits
from cake_dense_projection_det_gemm import make_plan

TINY = "--tiny" in sys.argv
DEV = torch.device("cpu" if TINY else "cuda")
M = 64 if TINY else 32 * 512
SHAPES = [(1536, 512), (512, 512), (2048, 512), (512, 2048)]  # qkv, proj, fc1, fc2
if TINY:
    SHAPES = [(48, 16), (16, 64)]
# (block_m, block_n, block_k, warps, stages)
TILES = [(128, 128, 32, 8, 3), (128, 128, 16, 8, 3), (128, 128, 32, 4, 3), (64, 128, 32, 4, 3),
         (128, 64, 32, 4, 3), (256, 128, 16, 8, 3), (128, 256, 16, 8, 3), (64, 64, 32, 4, 3)]
if TINY:
    TILES = [(16, 16, 16, 4, 1)]


PREC_TILES = [(128, 128, 32, 8, 3), (128, 128, 32, 4, 4), (128, 256, 32, 8, 3),
              (64, 128, 32, 4, 4), (128, 128, 64, 8, 3)]
if TINY:
    PREC_TILES = [(16, 16, 16, 4, 1)]


def bench(fn) -> float:
    if TINY:
        fn()
        return 0.0
    from triton.testing import do_bench
    return do_bench(fn, warmup=5, rep=40)


def repeats(fn, out) -> bool:
    ref = None
    for _ in range(5):
        fn()
        b = bits(out).clone()
        if ref is not None and not torch.equal(b, ref):
            return False
        ref = b
    return True


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(0)
    res = {"env": {"torch": torch.__version__,
                   "gpu": torch.cuda.get_device_name() if not TINY else "cpu"}, "rows": []}
    print(res["env"], flush=True)
    total = {}
    for N, K in SHAPES:
        x = torch.randn(M, K, generator=g).to(DEV)
        w = torch.randn(N, K, generator=g).to(DEV)
        dy = torch.randn(M, N, generator=g).to(DEV)
        plan = make_plan(M, N, K, torch.float32, DEV)
        ref64 = {"fwd": (x.double() @ w.double().t()), "dgrad": dy.double() @ w.double(),
                 "wgrad": dy.double().t() @ x.double()}
        ops = {"fwd": (x, w.t(), (M, N)), "dgrad": (dy, w, (M, K)), "wgrad": (dy.t(), x, (N, K))}
        for op, (a, b, oshape) in ops.items():
            out = torch.empty(oshape, device=DEV)
            split = plan.wgrad_splits if op == "wgrad" else 1
            parts = torch.empty((split, *oshape), device=DEV) if split > 1 else None
            if op == "wgrad":
                rule = (plan.wgrad_block_m, plan.wgrad_block_n, plan.wgrad_block_k,
                        plan.wgrad_num_warps, plan.wgrad_num_stages)
            else:
                rule = (plan.block_m, plan.block_n, plan.block_k, plan.num_warps,
                        plan.num_stages)
            cands = {"rule " + str(rule): (rule, False)}
            for t in TILES:
                cands.setdefault(str(t), (t, False))
            cands["tma " + str(rule)] = (rule, True)
            for name, (t, tma) in cands.items():
                bm, bn, bk, nw, ns = t

                def fn(a=a, b=b, out=out, bm=bm, bn=bn, bk=bk, nw=nw, ns=ns, tma=tma):
                    matmul(a, b, out, split=split, partials=parts, block_m=bm, block_n=bn,
                           block_k=bk, num_warps=nw, num_stages=ns, tma=tma)
                row = {"N": N, "K": K, "op": op, "cand": name}
                try:
                    row["ms"] = bench(fn)
                    fn()
                    r = ref64[op]
                    row["rel"] = float((out.double() - r).norm() / r.norm())
                except Exception as e:  # noqa: BLE001 - out of resources: report, go on
                    row["error"] = repr(e)[:200]
                res["rows"].append(row)
                print(row, flush=True)

            def cub(a=a, b=b, out=out):
                torch.mm(a, b, out=out)
            row = {"N": N, "K": K, "op": op, "cand": "cublas ieee", "ms": bench(cub)}
            cub()
            r = ref64[op]
            row["rel"] = float((out.double() - r).norm() / r.norm())
            row["repeats"] = repeats(cub, out)
            res["rows"].append(row)
            print(row, flush=True)
            torch.backends.cuda.matmul.allow_tf32 = True
            row = {"N": N, "K": K, "op": op, "cand": "cublas tf32", "ms": bench(cub)}
            cub()
            row["rel"] = float((out.double() - r).norm() / r.norm())
            torch.backends.cuda.matmul.allow_tf32 = False
            res["rows"].append(row)
            print(row, flush=True)
            for prec in ("tf32x3", "bf16x6", "ieee"):
                for t in PREC_TILES:
                    def pf(a=a, b=b, out=out, prec=prec, t=t):
                        bm, bn, bk, nw, ns = t
                        matmul(a, b, out, split=split, partials=parts, fp32_precision=prec,
                               block_m=bm, block_n=bn, block_k=bk, num_warps=nw,
                               num_stages=ns)
                    row = {"N": N, "K": K, "op": op, "cand": f"{prec} {t}"}
                    try:
                        row["ms"] = bench(pf)
                        pf()
                        row["rel"] = float((out.double() - r).norm() / r.norm())
                        row["repeats"] = repeats(pf, out)
                    except Exception as e:  # noqa: BLE001 - out of resources: report, go on
                        row["error"] = repr(e)[:200]
                    res["rows"].append(row)
                    print(row, flush=True)
    # per step (6 layers, each shape once per layer): rule vs best tile vs cuBLAS
    for r in res["rows"]:
        if "ms" in r:
            c = r["cand"]
            key = c if c.startswith("cublas") else c.split(" ")[0] if c[0].isalpha() else "tiles"
            k2 = (r["N"], r["K"], r["op"])
            total.setdefault(key, {})
            total[key][k2] = min(total[key].get(k2, 1e9), r["ms"])
    for key, d in total.items():
        print(f"per step, 6 layers, {key}: {6 * sum(d.values()):.2f} ms", flush=True)
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "fp32_gemm.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
