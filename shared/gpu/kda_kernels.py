"""KDA fwd+bwd kernel by kernel on one GPU: cake beside FLA (issue 46).

    python shared/gpu/kda_kernels.py [b,a,c] [--forms gate,pre] [--no-fla] [--rows]
        [--err] [--unfenced] [--sweep "k=v k=v" ...] [--repeat N]

At the KDA benchmark's cases (packages/cake-kda-det-train/benchmarks: a 4 x 4096 H 16,
b 2 x 8192 H 32, c 32768 packed as 8 documents H 32; K = V = 128, bf16, initial and final
states) in two calling forms: ``gate`` (Kimi Linear's: the gate with A_log and dt_bias, the
beta sigmoid and the q/k L2 norm in the kernel) and ``pre`` (a precomputed log-decay), for
``chunk_kda_det`` and FLA's ``chunk_kda``: the fwd+bwd ``triton.testing.do_bench`` median,
then one step under ``torch.profiler``: each kernel's device time (with ``--rows``, in
launch order), the sum, and the device idle time between kernels. FLA comes from the
anchor pack (../shared/anchors); without it only cake runs. ``--sweep``: cake alone, the
rule and each quoted set of plan overrides, each checked against the rule's outputs
(largest difference relative to the largest value) and a hash of their bits (to compare
trees across processes), with ``--repeat N`` against N more
calls of its own (bit for bit) and, with ``--err``, against the float64
recurrence (the benchmark's ``--err`` check: a 1000-token case, fixed length and packed). An
upper-case ``NAME=value`` in a sweep item sets that environment variable while the item runs
(for experiment trees that read one at launch). ``--unfenced``: ``cuda_plan_problem`` is
switched off for the run (to measure a plan that the CUDA limits refuse, e.g. after a fix).
"""
from __future__ import annotations

import importlib.util
import os
import sys

import torch
import triton
from profile_rows import bench_and_profile, bits_hash, max_rel_diff

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
spec = importlib.util.spec_from_file_location(
    "kda_bench", os.path.join(ROOT, "packages/cake-kda-det-train/benchmarks/"
                              "bench_cake_kda_det_train.py"))
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    cases = (sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--")
             else "b").split(",")
    forms = arg("--forms", "gate,pre").split(",")
    sweep = sys.argv[sys.argv.index("--sweep") + 1:] if "--sweep" in sys.argv else None
    if "--unfenced" in sys.argv:
        import cake_kda_det_train.api as kda_api
        kda_api.cuda_plan_problem = lambda plan, dtype: None  # read at each call
    impls = {"cake": b.cake_fn(None)}
    envs = {"cake": {}}
    for text in sweep or ():
        kvs = [kv.split("=") for kv in text.split()]
        impls[text] = b.cake_fn({k: int(v) for k, v in kvs if not k.isupper()})
        envs[text] = {k: v for k, v in kvs if k.isupper()}
    if "--no-fla" not in sys.argv and sweep is None:
        try:
            impls["fla"] = b.fla_fn()
            import fla  # noqa: F401
        except ImportError as e:
            impls.pop("fla")
            print("FLA not importable:", e)
    print("torch", torch.__version__, "triton", triton.__version__,
          torch.cuda.get_device_name(), flush=True)
    for case in cases:
        for form in forms:
            c = b.make_case(**b.CASES[case], in_kernel=form == "gate")
            ref = None
            for name, fn in impls.items():
                for k in {k for e in envs.values() for k in e}:
                    os.environ.pop(k, None)
                os.environ.update(envs.get(name, {}))
                if "--err" in sys.argv and case == cases[0] and form == forms[0]:
                    b.errors({name: fn}, form == "gate")
                if sweep is not None:
                    try:
                        got = b.grads_of(fn, c)
                    except ValueError as e:
                        print(f"== case {case} {form} {name}: refused: {e}", flush=True)
                        continue
                    ref = got if ref is None else ref
                    print(f"   {name}: max difference to the rule's outputs "
                          f"{max_rel_diff(got, ref):.2e}; hash {bits_hash(got)}", flush=True)
                    reps = int(arg("--repeat", "0"))
                    same = sum(all(torch.equal(a, r) for a, r in
                                   zip(b.grads_of(fn, c), got, strict=True) if a is not None)
                               for _ in range(reps))
                    if reps:
                        print(f"   {name}: {same} of {reps} more calls gave the same bits",
                              flush=True)
                x = b.leaves(c)

                def step(fn=fn, x=x):
                    for t in x.values():
                        if t is not None:
                            t.grad = None
                    o, ht = fn(c, x)
                    torch.autograd.backward([o, ht], [c["do"], c["dht"]])
                bench_and_profile(f"case {case} {form} {name}", step,
                                  by_name="--rows" not in sys.argv)


if __name__ == "__main__":
    main()
