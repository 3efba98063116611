"""Time GDN's forward state kernel (cake_core.chunk_state in GDN's ``rec_form = 1``) alone,
beside FLA's ``chunk_gated_delta_rule_fwd_h`` on the same inputs (fla-core importable), on
one GPU.

    python3 shared/gpu/fwd_h_alone.py [--shape T H HV K V] [--configs BV,warps,stages ...]

Inputs: one sequence of T tokens, random bf16 k / w / u and a within-chunk cumulative decay
(the kernel's time does not depend on the values). Prints us per launch
(``triton.testing.do_bench``) and, per config, whether h and v_new are bitwise equal to the
first config's (the V block and warps should not change the bits). Session 23 (an H200):
block_v_h 32, 4 warps, 3 stages 616 us at case a's shape against FLA's 618
(docs/benchmarks/gdn.md).
"""

import argparse
import time

import torch
import triton
import triton.language as tl
from cake_core.chunk_state import chunk_state_fwd_kernel, state_grid


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", nargs=5, type=int, default=[32768, 16, 32, 128, 128])
    p.add_argument("--configs", nargs="*", default=["32,8,3", "32,4,3", "64,8,3", "64,4,3"])
    p.add_argument("--no-fla", action="store_true")
    a = p.parse_args()
    T, H, HV, K, V = a.shape
    BT, dev, bf = 64, "cuda", torch.bfloat16
    NC = triton.cdiv(T, BT)
    g = torch.Generator().manual_seed(0)
    k = (torch.randn(T, H, K, generator=g) * 0.1).to(dev, bf)
    w = (torch.randn(T, HV, K, generator=g) * 0.1).to(dev, bf)
    u = torch.randn(T, HV, V, generator=g).to(dev, bf)
    gc = (-0.02 * (torch.arange(T) % BT + 1)).float()[:, None].expand(T, HV).contiguous().to(dev)
    cu = torch.tensor([0, T], dtype=torch.int32, device=dev)
    co = torch.zeros(1, dtype=torch.int32, device=dev)
    first = None
    for cfg in a.configs:
        BV, nw, ns = (int(x) for x in cfg.split(","))
        h = torch.empty(NC, HV, K, V, dtype=bf, device=dev)
        vn = torch.empty(T, HV, V, dtype=bf, device=dev)

        def f():
            chunk_state_fwd_kernel[state_grid(1, HV, V, BV, True)](
                k, w, u, gc, cu, co, gc, h, vn, h, H, HV, HV // H, K, V,
                DT=tl.bfloat16, PREC="tf32", BT=BT, BK=triton.next_power_of_2(K), BV=BV,
                GK=False, V_DECAY=True, FLAT=True, HAS_H0=False, STORE_FINAL=False,
                num_warps=nw, num_stages=ns)
        f()
        torch.cuda.synchronize()
        us = triton.testing.do_bench(f, warmup=10, rep=100) * 1e3
        same = "" if first is None else \
            f" same bits as {a.configs[0]}: {torch.equal(h, first[0]) and torch.equal(vn, first[1])}"
        first = first or (h, vn)
        print(f"cake BV={BV} warps={nw} stages={ns}: {us:.1f} us{same}", flush=True)
    if not a.no_fla:
        from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
        args = (k[None], w[None], u[None], gc[None])
        t0 = time.time()
        chunk_gated_delta_rule_fwd_h(*args)
        torch.cuda.synchronize()
        print(f"fla first call {time.time() - t0:.1f} s", flush=True)
        us = triton.testing.do_bench(lambda: chunk_gated_delta_rule_fwd_h(*args), warmup=10,
                                     rep=100) * 1e3
        print(f"fla chunk_gated_delta_rule_fwd_h: {us:.1f} us", flush=True)


if __name__ == "__main__":
    main()
