"""Testing tools every family uses: float64 references, bitwise repeats, ragged batches,
output poisoning (of buffers, or of every ``torch.empty`` in a block), bad-input tables,
compiled-versus-eager bits, CUDA-graph-replay-versus-eager bits, import checks, probes of
the ``cu_seqlens`` offsets cache.
Imported by tests and benchmarks only, never by kernels.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Largest relative Frobenius error accepted against a float64 reference, by the dtype the
#: kernel computed in (inputs and outputs). Elementwise-with-reduction kernels sit well
#: below these; chunked recurrences may pass their own, looser, tolerance.
TOLERANCES: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


def rel_fro_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """``||actual - reference||_F / max(||reference||_F, tiny)``, computed in float64."""
    if actual.shape != reference.shape:
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(reference.shape)}")
    a = actual.detach().to("cpu", torch.float64)
    r = reference.detach().to("cpu", torch.float64)
    if a.numel() == 0:
        return 0.0
    den = max(float(torch.linalg.vector_norm(r)), 1e-30)
    return float(torch.linalg.vector_norm(a - r)) / den


def assert_close_to_reference(actual: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype,
                              name: str = "output", tol: float | None = None) -> float:
    """Assert ``rel_fro_error(actual, reference) <= tol`` (default ``TOLERANCES[dtype]``)
    and that ``actual`` is finite; return the error."""
    tol = TOLERANCES[dtype] if tol is None else tol
    if not bool(torch.isfinite(actual.detach().float()).all()):
        raise AssertionError(f"{name}: non-finite values (poison left behind?)")
    err = rel_fro_error(actual, reference)
    if not err <= tol:
        raise AssertionError(f"{name}: relative Frobenius error {err:.3e} > {tol:.1e} ({dtype})")
    return err


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as an integer tensor (so NaN and -0.0 compare exactly)."""
    int_of = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    t = t.detach().contiguous()
    if t.is_floating_point() or t.is_complex():
        return t.view(int_of[t.element_size()])
    return t


def bitwise_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """True when both are None, or have equal shape, dtype and bits."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def assert_bitwise_repeat(fn: Callable[[], Sequence[torch.Tensor | None] | torch.Tensor],
                          repeats: int = 3, between: Callable[[], Any] | None = None) -> list:
    """Call ``fn`` ``repeats`` times (``between`` runs before each repeat, e.g. to launch
    other kernels) and assert every output is bitwise equal to the first call's.
    Returns the first call's outputs."""
    def as_list(out):
        return [out] if isinstance(out, torch.Tensor) or out is None else list(out)

    first = [None if t is None else t.detach().clone() for t in as_list(fn())]
    for r in range(1, repeats):
        if between is not None:
            between()
        again = as_list(fn())
        for i, (a, b) in enumerate(zip(first, again, strict=True)):
            if not bitwise_equal(a, b):
                raise AssertionError(f"output {i} differs in bits on repeat {r}")
    return first


def ragged_cu_seqlens(n_docs: int, max_len: int, *, generator: torch.Generator | None = None,
                      include_empty: bool = True, include_one: bool = True,
                      dtype: torch.dtype = torch.int32,
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """Random ``cu_seqlens`` for ``n_docs`` documents of length 0..max_len.

    With ``include_empty`` / ``include_one`` the batch holds at least one empty and one
    length-1 document (when ``n_docs`` allows), at random positions.
    """
    if n_docs < 1:
        raise ValueError("n_docs must be >= 1")
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    lens = torch.randint(2, max(3, max_len + 1), (n_docs,), generator=g)
    forced = ([0] if include_empty else []) + ([1] if include_one else [])
    pos = torch.randperm(n_docs, generator=g)[: len(forced)]
    for p, v in zip(pos.tolist(), forced, strict=False):
        lens[p] = v
    cu = torch.zeros(n_docs + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(lens, 0)
    return cu.to(device=device, dtype=dtype)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with NaN (floating) or the dtype's max (integer), in place; return it.

    Use it on output buffers before a launch so an element the kernel forgot shows up."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(torch.iinfo(t.dtype).max)
    return t


@contextlib.contextmanager
def poisoned_empty(*, floating_only: bool = False):
    """For the block, every ``torch.empty`` returns its tensor filled by :func:`poison_`
    (NaN, or the integer dtype's max; with ``floating_only`` integer tensors are left as
    allocated), so a buffer an entry allocates and a kernel reads before writing shows up
    as a NaN or a changed bit. Yields a list that gains each such tensor's shape (a test
    can check the entry's allocations went through it). ``torch.empty`` is restored on
    exit. Raises nothing of its own."""
    real = torch.empty
    shapes: list[tuple[int, ...]] = []

    def empty(*args, **kwargs):
        t = real(*args, **kwargs)
        shapes.append(tuple(t.shape))
        return t if floating_only and not t.is_floating_point() else poison_(t)

    torch.empty = empty
    try:
        yield shapes
    finally:
        torch.empty = real


def randn(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str = "cpu",
          seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """Fresh normal random values (never zeros) from a seeded CPU generator, then moved."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(tuple(shape), generator=g, dtype=torch.float64) * scale).to(device, dtype)


def assert_same_output_across_processes(code: str, processes: int = 2,
                                        timeout: float = 300.0) -> str:
    """Run ``code`` (a Python script that prints, e.g., a hash of output bits) in
    ``processes`` fresh interpreters with this process's ``sys.path``; assert each exits 0
    and all print the same non-empty text. Returns that text."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    outs = []
    for _ in range(processes):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=timeout)
        if r.returncode != 0:
            raise AssertionError(f"process failed: {r.stderr[-2000:]}")
        outs.append(r.stdout.strip())
    if not outs[0] or any(o != outs[0] for o in outs):
        raise AssertionError(f"outputs differ across processes: {outs}")
    return outs[0]


def readme_quick_start(readme) -> str:
    """The first ```python block after ``## Quick start`` in the README at ``readme``."""
    text = open(readme, encoding="utf-8").read()
    return re.search(r"```python\n(.*?)```", text[text.index("## Quick start"):],
                     re.S).group(1)


def run_readme_quick_start(readme, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the README's quick start (:func:`readme_quick_start`) as written, in a new
    process of this Python; assert it exits 0 (stderr's tail in the message) and return the
    finished run (its ``stdout`` for the caller's checks)."""
    done = subprocess.run([sys.executable, "-c", readme_quick_start(readme)],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def run_readme_quick_start_on_ranks(readme, tmp_path, nproc: int = 2,
                                    timeout: float = 600) -> dict[int, str]:
    """Run the README's quick start (:func:`readme_quick_start`) as written under
    ``torchrun --standalone --nproc-per-node nproc`` in ``tmp_path``; assert it exits 0
    (the output's tail in the message) and return each rank's stdout (one log file per rank:
    the ranks' prints would interleave on one stdout)."""
    script = os.path.join(str(tmp_path), "quick_start.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(readme_quick_start(readme))
    logs = os.path.join(str(tmp_path), "logs")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", str(nproc), "--redirects", "3", "--log-dir",
                           logs, script], capture_output=True, text=True, timeout=timeout,
                          cwd=str(tmp_path))
    found = [(root, name) for root, _, names in os.walk(logs) for name in names]
    read = lambda root, name: open(os.path.join(root, name), encoding="utf-8").read()  # noqa: E731
    err = "".join(read(r, n) for r, n in found if n == "stderr.log")
    assert done.returncode == 0, (done.stdout + done.stderr + err)[-3000:]
    return {int(os.path.basename(r)): read(r, n) for r, n in found if n == "stdout.log"}


#: what :func:`assert_gloo_ranks_pass` wraps around a body: a process group per rank, the
#: body, a barrier, then "ok" from the parent once every rank returned
_GLOO_RANKS = """
import sys
import torch.distributed as dist
import torch.multiprocessing as mp

{body}

def _rank(rank, world, init):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        body(rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(_rank, args=({world}, "file://" + sys.argv[1]), nprocs={world}, join=True)
    print("ok")
"""


def assert_gloo_ranks_pass(body: str, tmp_path, *, world: int = 2, path: Sequence = (),
                           timeout: float = 600) -> None:
    """Run ``body`` (Python source defining ``body(rank, world)``, which asserts what it
    checks) on ``world`` gloo ranks, one spawned process each, in a fresh interpreter with
    ``path`` and this process's ``sys.path``; assert every rank finished without error."""
    script = os.path.join(str(tmp_path), "gloo_ranks.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(_GLOO_RANKS.format(body=body, world=world))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [*(str(p) for p in path), *(p for p in sys.path if p)]))
    r = subprocess.run([sys.executable, script, os.path.join(str(tmp_path), "rdzv")],
                       capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-4000:]


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool, warn_only: bool = False):
    """``torch.use_deterministic_algorithms(enabled, warn_only=warn_only)`` inside the block,
    the caller's setting restored after it (a nondet backward raises under ``True``)."""
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])


def assert_imports_without_triton(*modules: str) -> None:
    """Import ``modules`` in a fresh interpreter (this process's ``sys.path``) and assert
    it exits 0 without having imported Triton (a family's package and manifest must not)."""
    code = "import sys; " + "; ".join(f"import {m}" for m in modules) + \
        "; assert 'triton' not in sys.modules, 'triton imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    if r.returncode != 0:
        raise AssertionError(f"importing {', '.join(modules)}: {r.stderr[-2000:]}")


def args_with(make_base: Callable[..., dict[str, Any]], /,
              **changes: Any) -> Callable[[], dict[str, Any]]:
    """A factory of keyword arguments for a table of bad inputs: each call builds
    ``make_base(**changes["base"])`` (no ``base``: ``make_base()``), then sets every other
    named argument to ``change(args)``, in order (so a change can derive from the base's
    tensors, e.g. ``q=lambda a: a["q"][0]``)."""
    base_kw = changes.pop("base", {})

    def make() -> dict[str, Any]:
        args = make_base(**base_kw)
        for name, fn in changes.items():
            args[name] = fn(args)
        return args

    return make


def assert_raises_unmodified(fn: Callable[..., Any], kwargs: dict[str, Any], match: str,
                             exc: type[BaseException] = ValueError) -> BaseException:
    """Assert ``fn(**kwargs)`` raises ``exc`` whose message matches the regular expression
    ``match`` (``re.search``, as ``pytest.raises``) and leaves every tensor argument (but
    those on the meta device) with the bits it had. Returns the exception."""
    tensors = [t for t in kwargs.values()
               if isinstance(t, torch.Tensor) and t.device.type != "meta"]
    before = [t.clone() for t in tensors]
    try:
        fn(**kwargs)
    except exc as e:
        if not re.search(match, str(e)):
            raise AssertionError(f"{type(e).__name__} {str(e)!r} does not match {match!r}") \
                from e
        caught = e
    else:
        raise AssertionError(f"no {exc.__name__} raised (expected {match!r})")
    for i, (a, b) in enumerate(zip(before, tensors, strict=True)):
        if not bitwise_equal(a, b):
            raise AssertionError(f"tensor argument {i} was modified")
    return caught


def leaf_grads(fn: Callable[..., Sequence[torch.Tensor]], leaves: Sequence[torch.Tensor],
               *args: Any) -> list[torch.Tensor | None]:
    """``fn(*fresh leaves, *args)`` returns ``(loss, *outputs)``; after ``loss.backward()``
    returns the detached outputs, then each leaf's gradient (the leaves are detached
    copies of ``leaves`` that require grad)."""
    xs = [t.detach().clone().requires_grad_() for t in leaves]
    loss, *outs = fn(*xs, *args)
    loss.backward()
    return [o.detach() for o in outs] + [x.grad for x in xs]


def assert_bitwise_equal_named(got: Sequence[torch.Tensor | None],
                               want: Sequence[torch.Tensor | None], names: Sequence[str],
                               what: str = "differs") -> None:
    """Pairwise: both present, same dtype and shape, finite, bitwise equal (messages name
    the tensor: ``"dq: <what>"``)."""
    for name, a, b in zip(names, got, want, strict=True):
        assert a is not None and b is not None, name
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert bool(torch.isfinite(a).all()), name
        assert bitwise_equal(a, b), f"{name}: {what}"


def assert_compile_same_bits(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor],
                             backend: str) -> None:
    """``torch.compile(fn, fullgraph=True, backend=backend)`` gives the eager bits: the
    output and every input's gradient for the upstream gradient ``cos(out)``."""
    def run(f):
        xs = [t.detach().clone().requires_grad_() for t in inputs]
        out = f(*xs)
        out.backward(torch.cos(out.detach()))
        return [out.detach()] + [x.grad for x in xs]

    want = run(fn)
    got = run(torch.compile(fn, fullgraph=True, backend=backend))
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert bitwise_equal(a, b), f"output {i}: compiled differs from eager"


def assert_compiles_to_op(step: Callable[..., Sequence[torch.Tensor]],
                          leaves: Sequence[torch.Tensor], args: Sequence[Any],
                          names: Sequence[str], *, backend: str, op: str) -> Callable:
    """``torch.compile(step, fullgraph=True)`` traces one frame whose graph calls the custom
    op ``op`` (e.g. ``"cake_gdn_det_train.fwd"``: not a fallback) and gives the eager bits
    (:func:`leaf_grads` of ``step`` on ``leaves`` and ``args``, compared by ``names``).
    Resets dynamo first; returns the compiled step."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    want = leaf_grads(step, leaves, *args)
    cnt = CompileCounterWithBackend(backend)
    compiled = torch.compile(step, fullgraph=True, backend=cnt)
    got = leaf_grads(compiled, leaves, *args)
    assert_bitwise_equal_named(got, want, names, "compiled differs from eager")
    assert cnt.frame_count == 1, f"{cnt.frame_count} frames (graph breaks?)"
    assert op in cnt.graphs[0].code, f"{op} not in the traced graph"
    return compiled


def graph_replay_matches_eager(make_inputs: Callable[[int], Sequence[torch.Tensor]],
                               step: Callable[..., Sequence[torch.Tensor]], *,
                               warmup: int = 3, seeds: Sequence[int] = (1, 2),
                               names: Sequence[str] | None = None) -> list[list[torch.Tensor]]:
    """Capture one ``step`` (a forward and its backward) in a ``torch.cuda.CUDAGraph``,
    replay it on fresh input values and assert every output has the bits of an eager call
    on the same values. CUDA only.

    The pattern of PyTorch's CUDA-graph rules: static input tensors (``make_inputs(0)``,
    cloned); ``warmup`` eager calls on a side stream (compiles, autotuning, lazily made
    handles and the per-stream caches, e.g. :func:`cake_core.varlen.resolve_chunks`'
    tables, all happen here, not during the capture); the capture on that same stream; then
    per seed: ``make_inputs(seed)`` copied into the static tensors, one replay, and
    ``step`` run eagerly (on the current stream) on clones of those same values. A host
    sync inside ``step`` (``.item()``, ``.tolist()``, a blocking copy) makes the capture
    raise: the check fails rather than passing by accident.

    Args:
        make_inputs: ``seed -> tensors`` on the CUDA device: every seed the same shapes,
            dtypes and structure (what the plan and launch grids read: shapes, a packed
            call's ``cu_seqlens`` values), fresh values. Integer inputs the kernels read on
            the device (labels, MoE offsets) may change with the seed; host-read structure
            (``cu_seqlens``) belongs in ``step``'s closure instead.
        step: ``step(*inputs) -> outputs``: the forward and its backward, e.g. leaves made
            with ``t.detach().requires_grad_()`` and their gradients returned by
            ``torch.autograd.grad`` (no ``.grad`` state to reset before the capture),
            forward outputs ``.detach()``-ed. Plans and workspaces (made once, outside, and
            passed explicitly: static workspaces) belong in its closure. It must not
            modify its inputs.
        warmup: eager calls before the capture (>= 1).
        seeds: the input seeds replayed, in order (two or more: the outputs of the first
            two must differ, so a replay of stale inputs would be seen).
        names: the outputs' names in messages (default ``out0``, ``out1``, ...).

    Returns:
        The eager outputs, one list per seed.

    Raises:
        AssertionError: an output of a replay differs in shape, dtype or bits from eager's,
            or the first two seeds gave the same bits (inputs too alike for the check).
        RuntimeError: no CUDA; a capture refused (a host sync or an operation CUDA does
            not capture, raised by torch).
        ValueError: ``warmup`` < 1, or ``names`` not one per output.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("graph_replay_matches_eager needs CUDA")
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1, got {warmup}")

    def as_list(out):
        return [out] if isinstance(out, torch.Tensor) else list(out)

    from cake_core.bench import capture_cuda_graph

    static = [t.detach().clone() for t in make_inputs(0)]
    graph, outs = capture_cuda_graph(lambda: step(*static), warmup, with_outputs=True)
    outs = as_list(outs)
    labels = list(names) if names is not None else [f"out{i}" for i in range(len(outs))]
    if len(labels) != len(outs):
        raise ValueError(f"names: {len(labels)} names for {len(outs)} outputs")
    wants = []
    for seed in seeds:
        fresh = [t.detach() for t in make_inputs(seed)]
        for s, f in zip(static, fresh, strict=True):
            s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        got = [o.clone() for o in outs]
        want = [t.detach() for t in as_list(step(*[f.clone() for f in fresh]))]
        torch.cuda.synchronize()
        for name, a, b in zip(labels, got, want, strict=True):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise AssertionError(f"{name}: replay gave {a.dtype} {tuple(a.shape)}, eager "
                                     f"{b.dtype} {tuple(b.shape)} (seed {seed})")
            if not bitwise_equal(a, b):
                raise AssertionError(f"{name}: graph replay differs from eager in bits "
                                     f"(inputs of seed {seed})")
        wants.append(want)
    if len(wants) >= 2 and all(bitwise_equal(a, b) for a, b in zip(wants[0], wants[1],
                                                                    strict=True)):
        raise AssertionError("the first two seeds gave the same outputs: the check cannot "
                             "tell a replay of stale inputs from a fresh one")
    return wants


def kcp_smoke_device(world_size: int, device: torch.device) -> tuple[str, dict[str, str]]:
    """``(device name, environment)`` for a KCP benchmark's smoke run on ``world_size``
    ranks in a subprocess, on the tests' ``device``. Without CUDA: the CPU through Triton's
    interpreter (``TRITON_INTERPRET=1`` set for the subprocess). On a CUDA machine: one GPU
    per rank (NCCL refuses two ranks on one GPU), the test skipped with fewer: a CPU run
    there would test that machine's interpreter (Triton 3.6's fails in loops with numpy >=
    2.4, "only 0-dimensional arrays can be converted to Python scalars"), not the compiled
    kernels the machine runs. The environment carries this process's ``sys.path``."""
    import pytest  # lazily: this module ships in cake-core, pytest is a test dependency

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    if device.type == "cuda":
        if torch.cuda.device_count() < world_size:
            pytest.skip(f"the smoke runs {world_size} ranks, one GPU each; this machine has "
                        f"{torch.cuda.device_count()} (the CPU run is for machines without CUDA)")
        env.pop("TRITON_INTERPRET", None)
        return "cuda", env
    env["TRITON_INTERPRET"] = "1"
    return "cpu", env


_GPU_SHARER = """import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    a = (a @ a).clamp_(-1, 1)
"""


@contextlib.contextmanager
def gpu_time_sharers(n: int = 2):
    """Run ``n`` other processes that multiply bf16 8192 x 8192 matrices on the current CUDA
    device for the duration of the block, so that the GPU switches between processes while
    the block's kernels run (a repeat check under time-slicing). Returns once each has
    multiplied; kills them on exit. No processes without CUDA."""
    procs = []
    try:
        if torch.cuda.is_available():
            procs = [subprocess.Popen([sys.executable, "-c", _GPU_SHARER],
                                      stdout=subprocess.PIPE, text=True) for _ in range(n)]
            for p in procs:
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError("a GPU time-sharing process did not start")
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


#: The ``torch.distributed`` calls :func:`refusals_without_collectives` watches.
COLLECTIVES = ("all_gather", "all_gather_into_tensor", "batch_isend_irecv", "all_reduce",
               "broadcast", "barrier")


@contextlib.contextmanager
def refusals_without_collectives(names: Sequence[str] = COLLECTIVES):
    """For a KCP test's bad-input checks on a live process group: yields ``(expect, msgs)``.
    ``expect(label, fn)`` calls ``fn()`` and appends to ``msgs`` ``"<label>: <message>"``
    when it raises ``ValueError``, else ``"NO ERROR: <label>"``, and
    ``"COLLECTIVE in <label>: [...]"`` when it called one of ``torch.distributed``'s
    ``names`` (which stay wrapped, counting, for the block; restored on exit). Other
    exceptions propagate."""
    import torch.distributed as dist

    calls: list[str] = []
    real = {n: getattr(dist, n) for n in names}
    for n, f in real.items():
        setattr(dist, n, (lambda name, fn: lambda *a, **k: (calls.append(name), fn(*a, **k))[1])
                (n, f))
    msgs: list[str] = []

    def expect(label: str, fn: Callable[[], Any]) -> None:
        before = len(calls)
        try:
            fn()
        except ValueError as e:
            msgs.append(f"{label}: {e}")
        else:
            msgs.append(f"NO ERROR: {label}")
        if len(calls) != before:
            msgs.append(f"COLLECTIVE in {label}: {calls[before:]}")

    try:
        yield expect, msgs
    finally:
        for n, f in real.items():
            setattr(dist, n, f)


# ----------------------------------------------------------------------------- offsets cache
# Tests of the cu_seqlens cache (cake_core.varlen.checked_offsets: read back once per tensor
# version) and of the tables a family keeps beside it (cake_core.varlen.offsets_derived,
# cake_core.varlen.resolve_chunks).


@contextlib.contextmanager
def counting_offsets_cache(tables_module: Any, tables_name: str):
    """Count the host read-backs of ``cu_seqlens`` and the tables built from its offsets,
    on a clean offsets cache.

    Clears :func:`cake_core.varlen.clear_offsets_cache` on entry and on exit, and for the
    block wraps ``cake_core.varlen.check_cu_seqlens`` (the value check that
    :func:`cake_core.varlen.checked_offsets` runs on a miss: one read-back of the values
    each) and the table builder ``tables_module.<tables_name>`` (e.g.
    ``cake_core.varlen`` and ``"chunk_tables"``, which :func:`cake_core.varlen.resolve_chunks`
    calls once per resolution: the name the resolving code calls it by), restoring both on
    exit.

    Args:
        tables_module: the module whose attribute builds the tables.
        tables_name: the attribute's name.

    Yields:
        A plain dict ``{"reads": int, "tables": int}``, updated in place: ``reads`` counts
        the ``check_cu_seqlens`` calls that read values (``read_values`` not false),
        ``tables`` every call of the builder. Compare a snapshot (``dict(counts)``) with it
        later to assert that nothing was read back or built.

    Raises:
        AttributeError: ``tables_module`` has no attribute ``tables_name`` (raised before
            anything is patched or cleared).
    """
    import cake_core.varlen as varlen

    real_tables = getattr(tables_module, tables_name)
    real_check = varlen.check_cu_seqlens
    counts = {"reads": 0, "tables": 0}

    def check(*args, **kw):
        counts["reads"] += bool(kw.get("read_values", True))
        return real_check(*args, **kw)

    def tables(*args, **kw):
        counts["tables"] += 1
        return real_tables(*args, **kw)

    varlen.clear_offsets_cache()
    varlen.check_cu_seqlens = check
    setattr(tables_module, tables_name, tables)
    try:
        yield counts
    finally:
        setattr(tables_module, tables_name, real_tables)
        varlen.check_cu_seqlens = real_check
        varlen.clear_offsets_cache()


def assert_fixed_length_tables_kept(fwd: Callable[..., Any], bwd: Callable[..., Any],
                                    inputs: Sequence[torch.Tensor], do: torch.Tensor,
                                    counts: dict) -> None:
    """A chunked family's calls without ``cu_seqlens`` keep their resolved sequences per row
    shape (:func:`cake_core.varlen.resolve_chunks`): a second call builds and uploads
    nothing and launches with the very :class:`~cake_core.varlen.SeqChunks` of the first;
    the same bits as after a cleared cache; other row lengths get their own.

    Args:
        fwd / bwd: the family's low-level pair (``fwd(q, k, v, g, beta) -> (o, ht,
            saved)``, ``bwd(do, dht, saved) -> grads``, ``saved.meta["seqs"]``).
        inputs: q, k, v, g, beta ``[B, T, ...]`` (T > 7).
        do: the upstream gradient of o.
        counts: the dict :func:`counting_offsets_cache` yields (its ``"tables"`` count).
    """
    import cake_core.varlen as varlen

    varlen.clear_offsets_cache()
    try:
        _, _, s1 = fwd(*inputs)
        g1 = bwd(do, None, s1)
        n = counts["tables"]
        assert n >= 1
        o2, _, s2 = fwd(*inputs)
        g2 = bwd(do, None, s2)
        assert counts["tables"] == n
        assert s2.meta["seqs"] is s1.meta["seqs"]
        varlen.clear_offsets_cache()
        o3, _, s3 = fwd(*inputs)
        g3 = bwd(do, None, s3)
        assert counts["tables"] > n
        assert s3.meta["seqs"] is not s1.meta["seqs"]
        assert bitwise_equal(o2, o3)
        for a, b, c in zip(g1[:5], g2[:5], g3[:5], strict=True):
            assert bitwise_equal(a, b) and bitwise_equal(a, c)
        m = counts["tables"]
        fwd(*[t[:, :t.shape[1] - 7].contiguous() for t in inputs])
        assert counts["tables"] > m
    finally:
        varlen.clear_offsets_cache()


@contextlib.contextmanager
def offsets_cache_disabled():
    """For the block, :func:`cake_core.varlen.checked_offsets` caches nothing (every call
    checks and reads ``cu_seqlens`` back, and :func:`cake_core.varlen.offsets_derived` and
    :func:`cake_core.varlen.resolve_chunks` build every call, with or without
    ``cu_seqlens``), as for a tensor it never caches (an inference tensor, under
    torch.compile). Restored on exit; entries cached before stay cached.

    Takes no arguments; yields ``None``; raises nothing of its own.
    """
    import cake_core.varlen as varlen

    real = varlen._cacheable
    varlen._cacheable = lambda t: False
    try:
        yield
    finally:
        varlen._cacheable = real


def strided_cu_seqlens(values: Sequence[int], dtype: torch.dtype,
                       device: torch.device | str = "cpu",
                       junk: int = 10**6) -> tuple[torch.Tensor, torch.Tensor]:
    """A non-contiguous ``cu_seqlens``: ``values`` at every other entry of a tensor twice as
    long whose other entries are ``junk`` (a kernel that reads the caller's memory with
    unit stride would see it).

    Args:
        values: the offsets, e.g. ``(0, 0, 1, 70, 75, 150)``.
        dtype: the integer dtype (int32 / int64).
        device: where both tensors live.
        junk: the value between the offsets (default ``10**6``, past any test's tokens).

    Returns:
        ``(cu, base)``: ``cu = base[::2]`` (stride 2, equal to ``values``) and ``base``
        ``[2 * len(values)]``, to check afterwards that neither the offsets nor the junk
        (``base[1::2]``) were written.

    Raises:
        ValueError: ``values`` is empty.
    """
    if len(values) == 0:
        raise ValueError("values must not be empty")
    base = torch.full((2 * len(values),), junk, dtype=dtype, device=device)
    base[::2] = torch.tensor(values, dtype=dtype)
    return base[::2], base


class _NoLaunch:
    """Stands in for a kernel or launcher: raises when called or indexed (``kernel[grid]``)."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any):
        raise AssertionError(f"a kernel was launched ({self.name})")

    def __getitem__(self, grid: Any):
        raise AssertionError(f"a kernel was launched ({self.name})")


@contextlib.contextmanager
def no_kernel_launches(module: Any, *names: str):
    """For the block, replace each ``module.<name>`` (a Triton kernel, launched as
    ``kernel[grid](...)``, or a Python function that launches) by a stand-in that raises
    ``AssertionError("a kernel was launched (<name>)")`` when called or indexed: a check
    that a refusal comes before any launch. Restored on exit.

    Args:
        module: the module the code under test looks the names up in (e.g. a family's
            ``api``).
        names: the attributes to replace.

    Yields:
        ``None``.

    Raises:
        AttributeError: ``module`` has no attribute of one of ``names`` (raised before
            anything is replaced).
    """
    real = {n: getattr(module, n) for n in names}
    try:
        for n in names:
            setattr(module, n, _NoLaunch(n))
        yield
    finally:
        for n, f in real.items():
            setattr(module, n, f)


class _Recorder:
    def __init__(self, name: str, kernel: Any, launches: dict):
        self.name, self.kernel, self.launches = name, kernel, launches

    def __getitem__(self, grid: Any):
        launch = self.kernel[grid]

        def run(*args: Any, **kwargs: Any):
            self.launches.setdefault(self.name, []).append((tuple(grid), dict(kwargs)))
            return launch(*args, **kwargs)
        return run


@contextlib.contextmanager
def record_launches(module: Any, *names: str):
    """For the block, wrap each ``module.<name>`` (a Triton kernel launched as
    ``kernel[grid](*args, **kwargs)``) so that every launch is recorded and then run as
    it is: a check that a plan field or launch constant reaches the launch (a field the
    launch ignored would pass the value tests). Restored on exit.

    Args:
        module: the module the code under test looks the kernels up in (e.g. a family's
            ``api``).
        names: the kernels' attribute names.

    Yields:
        ``{name: [(grid, kwargs), ...]}``, filled in launch order (``grid`` a tuple,
        ``kwargs`` the launch's keyword arguments: constexprs, ``num_warps``, ...).

    Raises:
        AttributeError: ``module`` has no attribute of one of ``names`` (raised before
            anything is replaced).
    """
    real = {n: getattr(module, n) for n in names}
    launches: dict = {}
    try:
        for n in names:
            setattr(module, n, _Recorder(n, real[n], launches))
        yield launches
    finally:
        for n, f in real.items():
            setattr(module, n, f)


def computed_once(tmp_path_factory: Any, name: str, compute: Callable[[], Any]) -> Any:
    """``compute()``'s result, computed once per pytest run even across pytest-xdist workers
    (a module-scoped fixture runs once in every worker that takes one of its tests): the
    first worker computes it under a file lock in the run's shared temporary folder and
    saves it with ``torch.save``; the others wait on the lock and load it. Where file locks
    are unavailable (no ``fcntl``), every worker computes its own.

    Args:
        tmp_path_factory: pytest's ``tmp_path_factory`` fixture.
        name: a file name for the result, unique within the run.
        compute: makes the result (tensors, and containers of tensors and plain values).
    """
    try:
        import fcntl
    except ImportError:  # no POSIX file locks
        return compute()
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # every worker's base folder lies in the run's one folder
    path = root / f"{name}.pt"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return torch.load(path, weights_only=False)
        result = compute()
        torch.save(result, path)
        return result


def assert_layer_keep_states_same_bits(make_layer: Callable[..., Any], recompute_module: Any,
                                       monkeypatch: Any, *, hidden: int,
                                       device: torch.device | str) -> None:
    """A family layer built with ``keep_states=True`` (``make_layer(seed=6,
    keep_states=True)``) gives the default layer's bits, output and every gradient, on
    packed documents of 1, 70 and 3 tokens (``hidden`` channels), and its backward does not
    recompute the chunk states: ``recompute_module._prep_and_state`` (spied through
    ``monkeypatch``) runs twice for the default layer's step, once for the kept one."""
    cu = torch.tensor([0, 1, 71, 74], dtype=torch.int64, device=device)

    def run(layer):
        x = torch.randn(1, 74, hidden, device=device,
                        generator=torch.Generator(device).manual_seed(5))
        x.requires_grad_(True)
        out, _, _ = layer(x, cu_seqlens=cu)
        out.square().sum().backward()
        return [out.detach(), x.grad] + [p.grad for p in layer.parameters()]

    calls = []
    real = recompute_module._prep_and_state
    monkeypatch.setattr(recompute_module, "_prep_and_state",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    want = run(make_layer(seed=6))
    assert len(calls) == 2  # the forward's, and the backward's recompute
    layer = make_layer(seed=6, keep_states=True)
    assert "keep_states=True" in repr(layer)
    got = run(layer)
    assert len(calls) == 3  # the forward's only
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def assert_layer_keep_states_compiles_as_default(make_layer: Callable[..., Any], *,
                                                 hidden: int,
                                                 device: torch.device | str) -> None:
    """Under ``torch.compile`` (the ``aot_eager`` backend: the traced ATen ops run as
    they are) a family layer built with ``keep_states=True`` traces as one graph, as the
    default layer does, and gives the compiled default layer's bits, output and every
    gradient, on packed documents of 1, 70 and 3 tokens (``hidden`` channels)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    cu = torch.tensor([0, 1, 71, 74], dtype=torch.int64, device=device)

    def run(layer):
        x = torch.randn(1, 74, hidden, device=device,
                        generator=torch.Generator(device).manual_seed(5))
        x.requires_grad_(True)
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend("aot_eager")
        out, _, _ = torch.compile(layer, backend=cnt)(x, cu_seqlens=cu)
        out.square().sum().backward()
        assert cnt.frame_count == 1, f"{cnt.frame_count} frames (graph breaks?)"
        return [out.detach(), x.grad] + [p.grad for p in layer.parameters()]

    want = run(make_layer(seed=6))
    got = run(make_layer(seed=6, keep_states=True))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
