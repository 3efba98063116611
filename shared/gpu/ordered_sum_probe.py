"""cake_core.gemm.ordered_sum's launch fields on one GPU: the default launch against the
fixed 1024-output blocks of 8 parts a step it replaced, at the partial sums KDA's and GDN's
in-kernel gate (dA_log: HV outputs; dt_bias: HV * K) and a large MoE-like sum produce.

    python shared/gpu/ordered_sum_probe.py

Per shape ``[parts, outputs]``: ``triton.testing.do_bench`` medians (us) of each launch,
and whether its output has the bits of the old launch (the order of adds is the same for
every block, so any difference is a defect).
"""
from __future__ import annotations

import torch
import triton
from cake_core.gemm import ordered_sum, ordered_sum_kernel

SHAPES = [(256, 32), (256, 4096), (512, 16), (512, 32), (512, 4096), (64, 1 << 20)]


def old_launch(p, out):
    n = out.numel()
    ordered_sum_kernel[(triton.cdiv(n, 1024),)](p, out, p.shape[0], n, p.stride(0),
                                                ACCUMULATE=False, BLOCK=1024, UNROLL=8,
                                                num_warps=4)
    return out


def main():
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
    for parts, n in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(parts * 7 + n)
        p = torch.randn(parts, n, device="cuda", generator=g) * 1e3
        ref = old_launch(p, torch.empty(n, device="cuda"))
        items = {"old (1024, 8 a step)": lambda o: old_launch(p, o),
                 "rule": lambda o: ordered_sum(p, out=o),
                 "block 64, 2 warps": lambda o: ordered_sum(p, out=o, block=64, num_warps=2),
                 "block 256": lambda o: ordered_sum(p, out=o, block=256)}
        row = []
        for name, f in items.items():
            o = torch.full((n,), float("nan"), device="cuda")
            f(o)
            same = torch.equal(o, ref)
            o2 = torch.empty(n, device="cuda")
            us = triton.testing.do_bench(lambda f=f, o2=o2: f(o2), warmup=20, rep=200) * 1e3
            row.append(f"{name}: {us:.1f} us{'' if same else ' OTHER BITS'}")
        print(f"[{parts}, {n}]  " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
