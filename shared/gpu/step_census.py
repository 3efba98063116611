"""Census of one Qwen3-Next training step's host work: Triton launches and non-view aten ops,
forward and backward apart, each attributed to the Python function that issued it.

    TRITON_INTERPRET=1 python shared/gpu/step_census.py --stub [--size 100m] [--seq 256]
    python shared/gpu/step_census.py              # CUDA: the real launches and the CUDA rules

With ``--stub`` (a CPU) every Triton launch is counted and skipped (no kernel runs), so the
numbers are the CPU route's; without it the kernels run. The model is the benchmark's
(``bench_cake_transformers.make_config``), patched with ``apply_cake_kernels_to_qwen3_next``
unless ``--unpatched``. Prints totals, then the top issuers: ``file:function`` of the first
frame under ``packages/`` or ``transformers/`` (``<autograd>`` where the autograd engine
issues the op with no Python frame of ours on the stack). Allocations (``empty`` and kin)
are counted apart in the totals: they launch no kernel.

``--keys N``: N steps on different batches, each launch's Triton specialization key computed
as Triton's own binder computes it (constexprs, dtypes, 16-byte alignment of pointers, ints
equal to 1 or divisible by 16, launch options); prints, per kernel, how many keys it took
and any key first seen after the first two steps: on a GPU each is a compile (or a cache
load) inside a timed step.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import traceback

STUB = "--stub" in sys.argv
if STUB:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "packages", "cake-transformers", "benchmarks"))

_VIEWS = {"view", "_unsafe_view", "as_strided", "t", "transpose", "permute", "unsqueeze",
          "squeeze", "expand", "slice", "select", "alias", "detach", "reshape", "unbind",
          "split", "split_with_sizes", "chunk", "narrow", "view_as", "_reshape_alias",
          "unflatten", "flatten", "diagonal", "movedim", "lift_fresh"}
_ALLOCS = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"}
PHASE = ["fwd"]
LAUNCH: dict = collections.defaultdict(collections.Counter)
OPS: dict = collections.defaultdict(collections.Counter)


def issuer() -> str:
    for fr in reversed(traceback.extract_stack()[:-2]):
        f = fr.filename
        if os.path.abspath(f).startswith(HERE):
            continue
        for mark in ("/packages/", "/transformers/"):
            if mark in f:
                return f"{f.split(mark)[-1]}:{fr.name}"
    return "<autograd>"


class Count(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name.rstrip("_") not in _VIEWS:
            OPS[PHASE[0]][f"{issuer()} {name}"] += 1
        return func(*args, **(kwargs or {}))


KEYS: dict = collections.defaultdict(dict)  # kernel name -> {key: first step}
STEP = [0]
_BINDERS: dict = {}


def spec_key(fn, dns, dnsa, args, kw) -> str:
    """The specialization key Triton's binder computes for a launch of the Python kernel
    ``fn`` (do_not_specialize ``dns``, do_not_specialize_on_alignment ``dnsa``): constexpr
    values, then Triton's own per-argument rule (``native_specialize_impl``: dtypes,
    16-byte alignment of pointers, ints equal to 1 or divisible by 16), then the launch
    options."""
    import inspect

    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    params = _BINDERS.get(fn)
    if params is None:
        params = _BINDERS[fn] = [
            (n, "constexpr" in str(p.annotation), p.default)
            for n, p in inspect.signature(fn).parameters.items()]
    kw = {k: v for k, v in kw.items() if k not in ("grid", "warmup")}
    spec = []
    for i, (n, const, default) in enumerate(params):
        v = args[i] if i < len(args) else kw.pop(n, default)
        if const:
            spec.append(("constexpr", v))
        else:
            nums = [i, n]
            spec.append(native_specialize_impl(BaseBackend, v, False,
                                               not any(d in nums for d in dns),
                                               not any(d in nums for d in dnsa)))
    return f"{spec} {sorted(kw.items())}"


def stub_launches(keys: bool = False):
    from triton.runtime import interpreter

    def run(self, *a, **k):
        LAUNCH[PHASE[0]][f"{issuer()} {self.fn.__name__}"] += 1
        if keys:
            KEYS[self.fn.__name__].setdefault(spec_key(
                self.fn, self.kwargs.get("do_not_specialize") or (),
                self.kwargs.get("do_not_specialize_on_alignment") or (), a, k), STEP[0])

    interpreter.InterpretedFunction.run = run


def count_launches(keys: bool = False):
    from triton.runtime.jit import JITFunction

    orig = JITFunction.run

    def run(self, *a, **k):
        LAUNCH[PHASE[0]][f"{issuer()} {self.fn.__name__}"] += 1
        if keys:
            KEYS[self.fn.__name__].setdefault(spec_key(
                self.fn, self.do_not_specialize, self.do_not_specialize_on_alignment, a, k),
                STEP[0])
        return orig(self, *a, **k)

    JITFunction.run = run


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stub", action="store_true")
    p.add_argument("--size", default="100m")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--unpatched", action="store_true")
    p.add_argument("--keys", type=int, default=0, metavar="N",
                   help="N steps: Triton specialization keys per kernel")
    a = p.parse_args()
    from bench_cake_transformers import batches, make_config
    from transformers import Qwen3NextForCausalLM

    dev = "cuda" if torch.cuda.is_available() and not a.stub else "cpu"
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(make_config(a.size, a.seq)).to(dev, torch.bfloat16).train()
    if not a.unpatched:
        from cake_transformers import apply_cake_kernels_to_qwen3_next

        apply_cake_kernels_to_qwen3_next(model)
    if a.stub:
        stub_launches(keys=a.keys > 0)
    else:
        count_launches(keys=a.keys > 0)
    if a.keys:
        return report_keys(model, a, dev)
    x = next(batches(1, a.batch, a.seq)).to(dev)
    for _ in range(2):  # the first step fills caches; the second is counted
        LAUNCH.clear()
        OPS.clear()
        PHASE[0] = "fwd"
        with Count():
            loss = model(input_ids=x, labels=x).loss
            PHASE[0] = "bwd"
            loss.backward()
        model.zero_grad(set_to_none=True)
    for ph in ("fwd", "bwd"):
        allocs = sum(n for k, n in OPS[ph].items() if k.split(" ")[1] in _ALLOCS)
        print(f"{ph}: {sum(LAUNCH[ph].values())} Triton launches, "
              f"{sum(OPS[ph].values())} non-view aten ops ({allocs} of them allocations "
              f"without a kernel)")
    for title, d in (("launches", LAUNCH), ("aten ops", OPS)):
        for ph in ("fwd", "bwd"):
            by_fn = collections.Counter()
            for k, n in d[ph].items():
                by_fn[k.split(" ")[0]] += n
            print(f"\n{title}, {ph}, by issuer:")
            for k, n in by_fn.most_common(a.top):
                detail = ", ".join(f"{kk.split(' ')[1]} {nn}" for kk, nn in
                                   d[ph].most_common() if kk.split(" ")[0] == k)[:150]
                print(f"  {n:5d}  {k}   [{detail}]")


def report_keys(model, a, dev):
    from bench_cake_transformers import batches

    for i, x in enumerate(batches(a.keys, a.batch, a.seq)):
        STEP[0] = i
        x = x.to(dev)
        model(input_ids=x, labels=x).loss.backward()
        model.zero_grad(set_to_none=True)
    late = 0
    for name, ks in sorted(KEYS.items()):
        new = sorted(st for st in ks.values() if st >= 2)
        late += len(new)
        print(f"{name:40s} {len(ks):3d} keys" + (f", new at steps {new}" if new else ""))
    print(f"{late} keys first seen after step 1 (of {a.keys})")


if __name__ == "__main__":
    main()
