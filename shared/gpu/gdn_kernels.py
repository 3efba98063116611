"""GDN fwd+bwd kernel by kernel on one GPU: cake beside FlashQLA (issue 46).

    python shared/gpu/gdn_kernels.py [a,b] [--no-qla] [--sweep "k=v k=v" ...]

At the GDN benchmark's cases (a: 1 x 32768, H 16, HV 32; b: 8 x 4096 packed, H = HV = 16;
K = V = 128, bf16, initial and final states, ``use_qk_l2norm_in_kernel=True`` as
Qwen3-Next calls it), for ``chunk_gated_delta_rule_det`` and FlashQLA's
``chunk_gated_delta_rule`` (g in fp32, as it requires): the fwd+bwd
``triton.testing.do_bench`` median, then one step under ``torch.profiler`` (after warm-up):
each kernel's device time in launch order, the sum, and the device idle time between them.
FlashQLA comes from the anchor pack (../shared/anchors); without it only cake runs.
``--sweep``: cake alone, the rule's plan and each quoted set of plan overrides
(``dataclasses.replace`` on ``make_plan(..., state_programs=N * HV)``, as the entry picks
it), each checked against the rule's outputs (largest difference relative to the largest
value) and profiled.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import torch
import triton
from profile_rows import bench_and_profile, max_rel_diff

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
spec = importlib.util.spec_from_file_location(
    "gdn_bench", os.path.join(ROOT, "packages/cake-gdn-det-train/benchmarks/"
                              "bench_cake_gdn_det_train.py"))
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)


def cake(over=None):
    return b.cake_fn(over, l2norm=True)


def qla():
    from flash_qla import chunk_gated_delta_rule

    def run(q, k, v, g, beta, h0, cu):
        return chunk_gated_delta_rule(q, k, v, g.float(), beta, initial_state=h0,
                                      output_final_state=True, use_qk_l2norm_in_kernel=True,
                                      cu_seqlens=cu.long() if cu is not None else None)
    return run


def main():
    cases = (sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--")
             else "a,b").split(",")
    sweep = sys.argv[sys.argv.index("--sweep") + 1:] if "--sweep" in sys.argv else None
    impls = {"cake": cake()}
    for text in sweep or ():
        impls[text] = cake(dict((kv.split("=")[0], int(kv.split("=")[1]))
                                for kv in text.split()))
    if "--no-qla" not in sys.argv and sweep is None:
        try:
            impls["flashqla"] = qla()
        except ImportError as e:
            print("FlashQLA not importable:", e)
    print("torch", torch.__version__, "triton", triton.__version__,
          torch.cuda.get_device_name(), flush=True)
    for case in cases:
        c = b.make_case(**b.CASES[case])
        ref = None
        for name, fn in impls.items():
            x = b.leaves(c)
            if sweep is not None:
                try:
                    got = b.grads_of(fn, c)
                except ValueError as e:
                    print(f"== case {case} {name}: refused: {e}", flush=True)
                    continue
                ref = got if ref is None else ref
                print(f"   {name}: max difference to the rule's outputs "
                      f"{max_rel_diff(got, ref):.2e}", flush=True)

            def step(fn=fn, x=x):
                for t in x.values():
                    t.grad = None
                o, ht = b.step(fn, c, x)
                torch.autograd.backward([o, ht], [c["do"], c["dht"]])
            bench_and_profile(f"case {case} {name}", step,
                              keep=None if sweep is None else ("gdn_bwd", "chunk_state",
                                                               "l2norm"))


if __name__ == "__main__":
    main()
