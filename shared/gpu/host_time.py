"""Host (CPU) time of cake's KDA forward and backward at benchmark cases (CUDA).

    python shared/gpu/host_time.py a,b,c [PROFILE_CASE]

Per case: the host time per call of 20 forward (then backward) calls not waited for, and
the wall time per call once the GPU has finished them; the host time from a forward's entry
to its first kernel launch (median of 20 calls on an idle GPU); with PROFILE_CASE, a cProfile of
20 calls at that case (by own time). The event-timed rows of the benchmark wait for the
host before the first launch of each call: this tells how much of them is host work.
"""
import cProfile
import importlib.util
import io
import pstats
import sys
import time

import torch

PATH = "packages/cake-kda-det-train/benchmarks/bench_cake_kda_det_train.py"
spec = importlib.util.spec_from_file_location("kda_bench", PATH)
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)


def per_call_ms(f, n=20):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    host = (time.perf_counter() - t) / n * 1e3
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t) / n * 1e3


def first_launch_us(f, n=20):
    """Median host time (us) from a forward's entry to its first chunk kernel's launch (the
    cumsum kernel, the first with the default options), each call on an idle GPU: what the
    benchmark's event-timed forward waits before the GPU starts. Unprofiled."""
    import cake_kda_det_train.chunk as chunk

    real = chunk.kda_chunk_cumsum_kernel
    marks = []

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **k):
                marks.append(time.perf_counter())
                return real[grid](*a, **k)
            return launch

    chunk.kda_chunk_cumsum_kernel = Spy()
    try:
        took = []
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            f()
            took.append(marks[-1] - t)
    finally:
        chunk.kda_chunk_cumsum_kernel = real
    return sorted(took)[n // 2] * 1e6


def main(case, profile):
    c = b.make_case(**b.CASES[case])
    fn = b.cake_fn({})
    x = b.leaves(c)
    for _ in range(3):  # compiled and warm
        torch.autograd.backward(list(fn(c, x)), [c["do"], c["dht"]])
    outs = fn(c, x)
    calls = {"fwd": lambda: fn(c, x),
             "bwd": lambda: torch.autograd.backward(outs, [c["do"], c["dht"]],
                                                    retain_graph=True)}
    print(case, " ".join("{} host/wall ms {:.3f} {:.3f}".format(n, *per_call_ms(f))
                         for n, f in calls.items()),
          "fwd entry->first launch host us {:.0f}".format(first_launch_us(calls["fwd"])),
          flush=True)
    for name, f in calls.items() if profile else ():
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            f()
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
        print("=====", name, "\n" + "\n".join(s.getvalue().splitlines()[:60]), flush=True)


if __name__ == "__main__":
    for cs in sys.argv[1].split(","):
        main(cs, len(sys.argv) > 2 and cs == sys.argv[2])
