"""GDN's bitwise repeatability, cake beside FlashQLA, within and across processes (issue 46).

    python shared/gpu/gdn_repeat.py [b] [--calls N] [--impls cake,flashqla]

At a GDN benchmark case (default b: 8 x 4096 packed, H = HV = 16, K = V = 128, bf16,
initial and final states, the q/k L2 norm in the kernel as Qwen3-Next calls it; FlashQLA
with fp32 g, as gdn_kernels.py calls it), each implementation runs fwd+bwd N times
(default 5) on the same inputs and prints one line per call: a sha256 of the bits of o, the
final state and the six gradients. Run it twice (two processes) and compare the lines:
equal hashes in a process are its in-process repeats, equal across the two runs its
cross-process repeats. FlashQLA comes from the anchor pack (shared/gpu/family_tables.sh
shows the environment it needs).
"""
from __future__ import annotations

import sys

import torch
from gdn_kernels import b as bench
from gdn_kernels import cake, qla
from profile_rows import bits_hash


def main():
    case = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "b"
    calls = int(sys.argv[sys.argv.index("--calls") + 1]) if "--calls" in sys.argv else 5
    names = (sys.argv[sys.argv.index("--impls") + 1].split(",") if "--impls" in sys.argv
             else ["cake", "flashqla"])
    c = bench.make_case(**bench.CASES[case])
    for name in names:
        try:
            fn = cake() if name == "cake" else qla()
        except ImportError as e:
            print(f"{name}: not importable: {e}", flush=True)
            continue
        for i in range(calls):
            got = bench.grads_of(fn, c)
            torch.cuda.synchronize()
            print(f"case {case} {name} call {i}: {bits_hash(got)}", flush=True)


if __name__ == "__main__":
    main()
