"""Plan variants of KDA or GDN, one process, one benchmark case: every family kernel's CUDA
time (profiler, us per launch, over 3 forward+backward steps), the event-timed fwd / bwd /
fwd+bwd, and whether o, the final state and every gradient keep the bits of the first
plan given.

    python shared/gpu/state_sweep.py FAMILY CASE "" "block_v=32 num_warps_h=4" ...
    (FAMILY: kda or gdn; CASE: a case of the family's benchmark; "" = the rule's plan:
    write it first; an item ``module.NAME=value`` sets a launch constant of the family's
    module for that variant only, e.g. ``chunk.BWD_MAXNREG=255`` (KDA's token-parallel
    kernels took their heads and warps from ``cake_kda_det_train.chunk`` until plan format
    11 made them plan fields: ``tok_heads=2 num_warps_tok=1``);
    an item ``ce=KERNEL[,KERNEL...]`` launches, for that variant, a copy of each named
    kernel of the family whose shape arguments (H, HV, GROUP, KD, VD,
    where it has them) are ``tl.constexpr``, as session 23 did by hand for GDN's state
    kernels (7.6% off the forward one alone, the same bits): e.g. ``ce=kda_bwd_local_kernel``;
    a kernel whose shape is already constexpr, as GDN's K = 128 rule kernels since session
    24, is left as it is)

Written after session 19 (H200) profiled FLA's KDA state recurrence at 152 us per forward
at case a against cake's state kernel of then 281 us, and the backward's state kernel at
197 against cake's 405 (docs/benchmarks/kda.md): the fields that shape those kernels
(KDA: ``block_v``, shared by the state, output and dh kernels; ``num_warps_h``, shared by
the state and dh kernels; ``num_stages_h``; the then ``rec_form``) are timed kernel by kernel, so
that a field of their own is added only for a measured gain. Plans that the family's
``cuda_plan_problem`` refuses are skipped. Bits are compared, not errors: run
``shared/gpu/plan_configs.py`` on a candidate before adopting it. Each line is printed
when measured (tee it into ``$OUT``: a call that runs past its limit returns only files).
"""
import dataclasses
import importlib
import importlib.util
import sys

import cake_core.triton_utils  # noqa: F401  (first: on a CPU it picks Triton's interpreter)
import torch
from cake_core import bench

FAM = sys.argv[1]
PKG = f"cake_{FAM}_det_train"
spec = importlib.util.spec_from_file_location(
    f"{FAM}_bench", f"packages/cake-{FAM}-det-train/benchmarks/bench_cake_{FAM}_det_train.py")
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)
plan_mod = importlib.import_module(f"{PKG}.plan")
variant = dataclasses.replace


#: the shape arguments a ``ce=`` variant makes compile-time
SHAPE_ARGS = ("H", "HV", "GROUP", "KD", "VD")
_CE_DIR = None


def constexpr_variant(kernel):
    """A copy of the Triton kernel ``kernel`` (a JITFunction of the family) whose
    ``SHAPE_ARGS`` parameters are ``tl.constexpr``: its module's source, with that one
    signature rewritten, written to a temporary folder and imported (Triton reads a
    kernel's source from its file)."""
    import inspect
    import re
    import tempfile

    global _CE_DIR
    _CE_DIR = _CE_DIR or tempfile.mkdtemp(prefix="cake_ce_")
    mod = sys.modules[kernel.fn.__module__]
    src = inspect.getsource(mod)
    name = kernel.fn.__name__
    start = src.index(f"def {name}(")
    end = src.index("):", start)
    sig = re.sub(r"\b(" + "|".join(SHAPE_ARGS) + r")\b(?=\s*[,)])", r"\1: tl.constexpr",
                 src[start:end + 1])
    path = f"{_CE_DIR}/{mod.__name__.replace('.', '_')}_{name}.py"
    with open(path, "w") as f:
        f.write(src[:start] + sig + src[end + 1:])
    spec = importlib.util.spec_from_file_location(f"ce_{name}", path)
    new = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(new)
    return getattr(new, name)


def split(text: str) -> tuple[list[str], dict]:
    """Plan items, and ``{(module, NAME): value}`` for the ``module.NAME=value`` and
    ``ce=KERNEL,...`` items (a kernel of the family by name, patched in every module of
    the family that holds it: GDN launches from ``api``, KDA from ``chunk``)."""
    plan_items, consts = [], {}
    for item in text.split():
        name, value = item.split("=")
        if name == "ce":
            importlib.import_module(f"{PKG}.api")  # and the modules it launches from
            for kname in value.split(","):
                orig = next(getattr(m, kname) for n, m in list(sys.modules.items())
                            if n.startswith(PKG) and hasattr(m, kname))
                var = constexpr_variant(orig)
                for mname, m in list(sys.modules.items()):  # every module that launches it
                    if mname.startswith(PKG) and getattr(m, kname, None) is orig:
                        consts[(mname, kname)] = var
        elif "." in name:
            mod, attr = name.rsplit(".", 1)
            consts[(f"{PKG}.{mod}", attr)] = int(value)
        else:
            plan_items.append(item)
    return plan_items, consts


def per_kernel_us(step) -> dict:
    out = {}
    for e in bench.cuda_profile(step).key_averages():
        # the family's kernels and the chunk engine's it launches from cake-core
        if e.key.startswith((f"{FAM}_", "chunk_state_", "chunk_output_")):
            total = getattr(e, "device_time_total", None) or e.cuda_time_total
            out[e.key.removeprefix(f"{FAM}_").removesuffix("_kernel")] = round(total / e.count)
    return out


def main() -> None:
    case, texts = sys.argv[2], sys.argv[3:] or [""]
    cuda = torch.cuda.is_available()
    if cuda:
        c = b.make_case(**b.CASES[case])
    else:  # a smoke run of the script itself under the interpreter
        b.DEV = "cpu"
        tiny = dict(B=1, T=100, H=1, docs=None, K=32, V=32, dev="cpu")
        c = b.make_case(**tiny, **({"HV": 2} if FAM == "gdn" else {}))
    q = c["q"]
    rule = plan_mod.make_plan(q.shape[-1], c["v"].shape[-1], q.dtype, q.device)
    want = None
    print("torch", torch.__version__, "device", torch.cuda.get_device_name() if cuda else "cpu",
          FAM, "case", case, flush=True)
    for text in texts:
        items, consts = split(text)
        try:
            over = bench.parse_overrides(items) if items else {}
            plan = variant(rule, **over)  # the benchmark's cake_fn applies over the same way
        except ValueError as e:
            print(f"[{text}] refused by the plan: {e}", flush=True)
            continue
        why = plan_mod.cuda_plan_problem(plan, q.dtype) if cuda else None
        if why:
            print(f"[{text}] skipped: {why}", flush=True)
            continue
        saved = {}
        for (mod, attr), value in consts.items():
            m = importlib.import_module(mod)
            saved[(m, attr)] = getattr(m, attr)  # AttributeError: no such constant
            setattr(m, attr, value)
        try:
            fn = b.cake_fn(over)
            got = bench.bits_sha256(b.grads_of(fn, c))
            want = want or got
            row = {"same_bits_as_first": got == want}
            if cuda:
                row.update(per_kernel_us(lambda fn=fn: b.grads_of(fn, c)))
                row.update(b.time_impl(fn, c, 10))
        except Exception as e:  # e.g. OutOfResources: report it, go on with the next plan
            row = {"failed": f"{type(e).__name__}: {str(e)[:200]}"}
        finally:
            for (m, attr), value in saved.items():
                setattr(m, attr, value)
        print(f"[{text}] {row}", flush=True)


if __name__ == "__main__":
    main()
