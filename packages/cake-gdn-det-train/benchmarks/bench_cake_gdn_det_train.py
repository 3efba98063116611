"""Time the det chunked GDN forward on CUDA (first numbers only; no anchors yet).

    python benchmarks/bench_cake_gdn_det_train.py [--shapes B,T,H,HV,K,V ...]

Prints one line per shape: the median forward time in ms over 20 runs after 3 warm-ups.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from cake_gdn_det_train import chunk_gdn_det_fwd

DEFAULT = ["1,8192,16,16,128,128", "4,4096,8,16,128,128", "1,32768,16,32,128,128"]


def _time(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="*", default=DEFAULT)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    dev = "cuda"
    for s in args.shapes:
        B, T, H, HV, K, V = (int(x) for x in s.split(","))
        q = torch.randn(B, T, H, K, device=dev, dtype=dtype)
        k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dtype)
        v = torch.randn(B, T, HV, V, device=dev, dtype=dtype)
        g = F.logsigmoid(torch.randn(B, T, HV, device=dev))
        beta = torch.rand(B, T, HV, device=dev).sigmoid()
        args_ = (q, k, v, g, beta)
        ms = _time(lambda a=args_: chunk_gdn_det_fwd(*a, output_final_state=True))
        print(f"B={B} T={T} H={H} HV={HV} K={K} V={V} {args.dtype}: fwd {ms:.3f} ms")


if __name__ == "__main__":
    main()
