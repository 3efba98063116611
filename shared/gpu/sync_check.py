"""Diagnosis (CUDA): every host-device synchronisation in one fwd+bwd of cake's GDN or KDA at
one of the family benchmark's cases, with the Python frames (cake's and the benchmark's)
that made it, and the host time of a fwd+bwd against its total time.

    python shared/gpu/sync_check.py FAMILY CASE ["plan overrides"]
    e.g. python shared/gpu/sync_check.py gdn a
         python shared/gpu/sync_check.py kda b "block_v=32"

Uses ``torch.cuda.set_sync_debug_mode(1)`` (torch warns at each synchronising call) after
three warm-up calls, and a ``warnings.showwarning`` hook that records the stack. A
synchronising call drains the GPU's queue, so the host's Python time after it becomes idle
GPU time; session 15 (2026-12-01) found four per fixed-length call this way (the chunk
tables' uploads, since kept: docs/benchmarks/gdn.md). Expect "0 synchronising calls" for
fixed-length cases and for packed cases whose ``cu_seqlens`` tensor is reused unchanged.
"""
import collections
import importlib.util
import sys
import time
import traceback
import warnings

import torch


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("gdn", "kda"):
        raise SystemExit(__doc__)
    if not torch.cuda.is_available():
        raise SystemExit("sync_check: needs CUDA")
    fam, case = sys.argv[1], sys.argv[2]
    over = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in " ".join(sys.argv[3:]).split()}
    path = f"packages/cake-{fam}-det-train/benchmarks/bench_cake_{fam}_det_train.py"
    spec = importlib.util.spec_from_file_location(f"{fam}_bench", path)
    b = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(b)
    kw = dict(b.CASES[case])
    if fam == "gdn":
        kw["dev"] = "cuda"
    c = b.make_case(**kw)
    fn = b.cake_fn(over)
    for _ in range(3):
        b.grads_of(fn, c)
    torch.cuda.synchronize()
    seen: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" not in str(message):
            return
        frames = [f"{f.filename.split('/src/')[-1].split('/benchmarks/')[-1]}:{f.lineno}:"
                  f"{f.name}" for f in traceback.extract_stack()[:-1]
                  if "cake" in f.filename or "bench" in f.filename]
        seen[" <- ".join(frames[-5:][::-1])] += 1

    old = warnings.showwarning
    warnings.showwarning = record
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode(1)
            try:
                b.grads_of(fn, c)
            finally:
                torch.cuda.set_sync_debug_mode(0)
    finally:
        warnings.showwarning = old
    print(f"{fam} case {case} plan over {over}: {sum(seen.values())} synchronising calls in "
          "one fwd+bwd (the benchmark's leaf copies included)")
    for frames, n in seen.most_common():
        print(f"  {n}x {frames}")
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b.grads_of(fn, c)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        times.append((1e3 * (t1 - t0), 1e3 * (time.perf_counter() - t0)))
    host, total = sorted(times)[2]
    print(f"  fwd+bwd: the host returns after {host:.2f} ms, the GPU is done after "
          f"{total:.2f} ms (median of 5)")


if __name__ == "__main__":
    main()
