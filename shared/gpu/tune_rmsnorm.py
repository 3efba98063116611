"""Sweep RMSNorm plan fields on the GPU (kernel-only times) and time the entry's overhead.

Informs the rules in cake_rmsnorm_det_train.plan.make_plan; never used at run time.
"""

import dataclasses
import itertools
import json
import sys

import torch
import triton
from cake_core.testing import randn
from cake_rmsnorm_det_train import api, make_plan, rmsnorm_det

out = {}
dev = torch.device("cuda")
shapes = [(32768, 4096), (16384, 8192), (65536, 2048), (8192, 1024), (4096, 16384)]
for T, H in shapes:
    x = randn((T, H), torch.bfloat16, dev, seed=1)
    w = randn((H,), torch.bfloat16, dev, seed=2)
    dy = randn((T, H), torch.bfloat16, dev, seed=3)
    base = make_plan(H, torch.bfloat16, dev)
    res = {"fwd": {}, "bwd": {}}
    for bm, nw in itertools.product([1, 2, 4, 8], [2, 4, 8, 16, 32]):
        if bm * base.block_h > 32768:
            continue
        p = dataclasses.replace(base, block_m_fwd=bm, num_warps_fwd=nw)
        try:
            t = triton.testing.do_bench(lambda: api._launch_fwd(x, w, None, 1e-6, p), warmup=10, rep=40)
            res["fwd"][f"bm{bm}_w{nw}"] = t
        except Exception as e:
            res["fwd"][f"bm{bm}_w{nw}"] = repr(e)[:80]
    _, _, rstd = api._launch_fwd(x, w, None, 1e-6, base)
    for bm, nw, pm in itertools.product([1, 2, 4], [4, 8, 16], [1, 2, 4]):
        if bm * base.block_h > 16384:
            continue
        P = 132 * pm
        p = dataclasses.replace(base, block_m_bwd=bm, num_warps_bwd=nw, bwd_programs=P,
                                reduce_block_p=32)
        try:
            t = triton.testing.do_bench(
                lambda: api._launch_bwd(dy, None, x, w, rstd, p, None, None), warmup=10, rep=40)
            res["bwd"][f"bm{bm}_w{nw}_P{P}"] = t
        except Exception as e:
            res["bwd"][f"bm{bm}_w{nw}_P{P}"] = repr(e)[:80]
    xg = x.clone().requires_grad_()
    wg = w.clone().requires_grad_()
    res["api_fwd_nograd"] = triton.testing.do_bench(lambda: rmsnorm_det(x, w), warmup=10, rep=40)
    res["api_fwd_grad"] = triton.testing.do_bench(lambda: rmsnorm_det(xg, wg), warmup=10, rep=40)
    res["kernel_fwd_default"] = triton.testing.do_bench(
        lambda: api._launch_fwd(x, w, None, 1e-6, base), warmup=10, rep=40)
    res["make_plan_us"] = triton.testing.do_bench(
        lambda: make_plan(H, torch.bfloat16, dev), warmup=10, rep=40) * 1000
    best_f = min((v, k) for k, v in res["fwd"].items() if isinstance(v, float))
    best_b = min((v, k) for k, v in res["bwd"].items() if isinstance(v, float))
    print(f"{T}x{H}: default plan {base}\n  fwd best {best_f} all {res['fwd']}\n"
          f"  bwd best {best_b} all {res['bwd']}\n  api_fwd nograd {res['api_fwd_nograd']:.4f} "
          f"grad {res['api_fwd_grad']:.4f} kernel {res['kernel_fwd_default']:.4f} "
          f"make_plan {res['make_plan_us']:.1f}us", flush=True)
    out[f"{T}x{H}"] = res
    del x, w, dy, xg, wg
    torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tune.json", "w"), indent=1)
