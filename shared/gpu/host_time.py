"""Host (CPU) time per eager call of cake's GDN and KDA at a benchmark case each (CUDA).

    python shared/gpu/host_time.py [REPO] [--profile]   (REPO's packages/*/src first on sys.path;
                                                        default .; --profile: cProfile of the
                                                        backward's host time)

Per family: the host time per call of 30 forward (then backward) calls not waited for, and
the wall time per call once the GPU has finished them (GDN case d, KDA case a of the
families' benchmarks). Where host ms approach wall ms, the GPU waits for Python.
"""
import glob
import importlib.util
import os
import sys
import time

PROFILE = "--profile" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--profile"]
REPO = os.path.abspath(ARGS[0] if ARGS else ".")
sys.path[:0] = sorted(glob.glob(os.path.join(REPO, "packages", "*", "src")))
import torch  # noqa: E402


def load(fam):
    p = os.path.join(REPO, f"packages/cake-{fam}-det-train/benchmarks/bench_cake_{fam}_det_train.py")
    spec = importlib.util.spec_from_file_location("bench_" + fam, p)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def per_call(f, n=30):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    host = (time.perf_counter() - t) / n * 1e3
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t) / n * 1e3


def main():
    for fam, case in (("gdn", "d"), ("kda", "a")):
        b = load(fam)
        call = b.step if fam == "gdn" else (lambda fn, c, x: fn(c, x))
        c = b.make_case(**b.CASES[case])
        fn = b.cake_fn({})
        x = b.leaves(c)
        for _ in range(3):  # compiled and warm
            torch.autograd.backward(list(call(fn, c, x)), [c["do"], c["dht"]])
        outs = list(call(fn, c, x))
        r = {"fwd": per_call(lambda: call(fn, c, x)),
             "bwd": per_call(lambda: torch.autograd.backward(outs, [c["do"], c["dht"]],
                                                             retain_graph=True))}
        print(f"host {REPO} {fam}/{case} " + "  ".join(
            f"{k} host {h:.3f} ms wall {w:.3f} ms" for k, (h, w) in r.items()), flush=True)
        if PROFILE:  # where a backward call's host time goes: Python, launches, torch ops
            import cProfile
            import pstats
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(10):
                torch.autograd.backward(outs, [c["do"], c["dht"]], retain_graph=True)
            pr.disable()
            torch.cuda.synchronize()
            print(f"{fam} backward, 10 calls:", flush=True)
            pstats.Stats(pr).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
