"""Where the event-timed rows go: one implementation's forward (or forward+backward) at one
benchmark case, as a timeline of its CUDA kernels against the host.

    python shared/gpu/timeline.py FAMILY CASE IMPL [fwd|step] [key=val ...]
    (FAMILY: kda or gdn; IMPL: cake or fla; key=val: cake plan overrides)

Three calls after warm-up, each waited for (as ``bench.cuda_ms`` times them), under
torch.profiler with CPU and CUDA activity. Per call: the host's span (entry to return),
the delay from the host's entry to the first kernel's start, the GPU span (first kernel's
start to the last one's end), the sum of kernel times and the idle time between kernels;
then, for the last call, each kernel's start (us after the host's entry), duration and the
idle gap before it. Written in session 21: the event-timed KDA forward at case b (3.17 ms)
exceeded the sum of its kernels' profiled times by far more than FLA's did.
"""
import importlib.util
import json
import os
import sys
import tempfile

import cake_core.triton_utils  # noqa: F401  (first: on a CPU it picks Triton's interpreter)
import torch
from torch.profiler import ProfilerActivity, profile, record_function

FAM, CASE, IMPL = sys.argv[1:4]
WHAT = sys.argv[4] if len(sys.argv) > 4 else "fwd"
OVER = dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in sys.argv[5:])
spec = importlib.util.spec_from_file_location(
    f"{FAM}_bench", f"packages/cake-{FAM}-det-train/benchmarks/bench_cake_{FAM}_det_train.py")
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)


def main():
    c = b.make_case(**b.CASES[CASE])
    if IMPL == "cake":
        fn = b.cake_fn(OVER)
    else:  # GDN's bench lifts FLA's Hopper guard (its --fla-bypass default)
        fn = b.fla_fn(True) if FAM == "gdn" else b.fla_fn()
    x = b.leaves(c)
    # KDA's functions take (case, leaves); GDN's bench calls them through its step()
    fwd = (lambda: b.step(fn, c, x)) if FAM == "gdn" else (lambda: fn(c, x))

    def call():
        if WHAT == "fwd":
            return fwd()
        return torch.autograd.backward(list(fwd()), [c["do"], c["dht"]])

    for _ in range(3):
        b.grads_of(fn, c)
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 with_stack=bool(os.environ.get("TL_STACK"))) as p:
        for i in range(3):
            with record_function(f"call{i}"):
                call()
            torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    p.export_chrome_trace(path)
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    calls = sorted((e for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith(
        "call") and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    kern = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel"),
                  key=lambda e: e["ts"])
    print(f"{FAM} {CASE} {IMPL} {WHAT} {OVER or ''}", flush=True)
    for i, cl in enumerate(calls):
        t0, t1 = cl["ts"], cl["ts"] + cl["dur"]
        nxt = calls[i + 1]["ts"] if i + 1 < len(calls) else float("inf")
        ks = [e for e in kern if t0 <= e["ts"] < nxt]
        if not ks:
            continue
        busy = sum(e["dur"] for e in ks)
        span = ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]
        print(f"call {i}: host {t1 - t0:.0f} us, entry->first kernel {ks[0]['ts'] - t0:.0f}, "
              f"GPU span {span:.0f}, kernels {busy:.0f} ({len(ks)}), idle {span - busy:.0f}, "
              f"entry->last end {ks[-1]['ts'] + ks[-1]['dur'] - t0:.0f}", flush=True)
        if i == len(calls) - 1:
            end = ks[0]["ts"]
            for e in ks:
                print(f"  {e['ts'] - t0:8.0f} {e['dur']:7.0f} gap {e['ts'] - end:5.0f}  "
                      f"{e['name'][:70]}")
                end = e["ts"] + e["dur"]
            # the host's work before the first kernel started: CPU ops and CUDA runtime
            # calls in that window (longest first), then the first launches in order
            host = [e for e in ev if e.get("ph") == "X" and e.get("cat") in (
                "cpu_op", "cuda_runtime", "cuda_driver", "python_function")
                and t0 <= e["ts"] < ks[0]["ts"]]
            print("  host events before the first kernel, longest first:")
            for e in sorted(host, key=lambda e: -e["dur"])[:25]:
                print(f"    at {e['ts'] - t0:7.0f} dur {e['dur']:6.0f}  {e['cat']:12s} "
                      f"{str(e['name'])[:80]}")
            print("  in order (first 40):")
            for e in sorted(host, key=lambda e: e["ts"])[:40]:
                print(f"    at {e['ts'] - t0:7.0f} dur {e['dur']:6.0f}  {e['cat']:12s} "
                      f"{str(e['name'])[:80]}")


if __name__ == "__main__":
    main()
