"""Host microseconds per Triton launch on this machine (CUDA): where a training step's host
time goes when a kernel launch itself is the cost.

    python shared/gpu/launch_overhead.py [--profile]

Launches an empty kernel 2000 times without waiting, for: 2 tensor arguments; 40 integer
arguments (strides, sizes) and 8 constexprs, positional; the same with the constexprs as
keywords and a grid callable (the form cake's wrappers use); 2 host-side TMA
``TensorDescriptor`` arguments; the compiled kernel's own launcher called directly (the
floor of any Python launch path). Prints the median of 5 rounds per form, and
``torch.empty``'s and a small torch op's host cost for scale.
"""
import sys

import torch
import triton
import triton.language as tl
from host_overhead import host_us


@triton.jit
def _two(X, Y):
    pass


@triton.jit
def _many(X, Y, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9,
          c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9,
          K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr, K3: tl.constexpr,
          K4: tl.constexpr, K5: tl.constexpr, K6: tl.constexpr, K7: tl.constexpr):
    pass


@triton.jit
def _desc(A, B):
    pass


def per_launch_us(f):
    return host_us(f, n=2000, rounds=5)  # host_overhead's timer (the same directory)


def main():
    x = torch.empty(1024, device="cuda")
    ints = list(range(7, 47))
    ks = dict(K0=16, K1=32, K2=64, K3=128, K4=1, K5=0, K6=2, K7=4)
    forms = {
        "2 tensors": lambda: _two[(1,)](x, x),
        "40 ints + 8 constexprs": lambda: _many[(1,)](x, x, *ints, *ks.values()),
        "same, constexprs by keyword, grid callable": lambda: _many[lambda m: (1,)](
            x, x, *ints, **ks),
    }
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
        a = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
        forms["2 TensorDescriptors, built per launch"] = lambda: _desc[(1,)](
            TensorDescriptor(a, list(a.shape), list(a.stride()), [64, 64]),
            TensorDescriptor(a, list(a.shape), list(a.stride()), [64, 64]))
    except ImportError:
        pass
    # the floor: the compiled kernel's own launcher, called as JITFunction.run ends
    for name, kern, args in (("2 tensors", _two, (x, x)),
                             ("40 ints + 8 constexprs", _many, (x, x, *ints, *ks.values()))):
        ck = kern[(1,)](*args)
        stream = torch.cuda.current_stream().cuda_stream
        forms[f"{name}, CompiledKernel.run directly"] = (
            lambda ck=ck, args=args, stream=stream: ck.run(
                1, 1, 1, stream, ck.function, ck.packed_metadata, None, None, None, *args))
    forms["torch.empty(1024)"] = lambda: torch.empty(1024, device="cuda")
    forms["torch.add(x, 1)"] = lambda: torch.add(x, 1)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    for name, f in forms.items():
        print(f"host us per call: {per_launch_us(f):7.1f}  {name}", flush=True)
    if "--profile" in sys.argv:  # where a keyword launch's host time goes
        import cProfile
        import pstats
        f = forms["same, constexprs by keyword, grid callable"]
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            f()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
