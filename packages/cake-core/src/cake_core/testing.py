"""Testing tools every family uses: float64 references, bitwise repeats, ragged batches,
output poisoning (of buffers, or of every ``torch.empty`` in a block), bad-input tables,
compiled-versus-eager bits, CUDA-graph-replay-versus-eager bits, import checks, probes of
the ``cu_seqlens`` offsets cache, the GDN / KDA entries' keep_states and disable_recompute
checks.
Imported by tests and benchmarks only, never by kernels.
"""

from __future__ import annotations

import contextlib
import dataclasses
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


# ------------------------------------------------ keep_states / disable_recompute (GDN, KDA)

#: The leaves of a GDN / KDA entry step, in order (:func:`recurrence_step_grads`).
RECURRENCE_LEAVES = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")
#: The names of a full step's results: o, the final state, then each leaf's gradient.
RECURRENCE_NAMES = ("o", "final_state") + tuple(f"d{n}" for n in RECURRENCE_LEAVES)
_BWD_NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
_RECOMPUTE = "_prep_and_state"


@contextlib.contextmanager
def counting_calls(module: Any, name: str):
    """For the block, count the calls of ``module.<name>`` (each still runs as it is):
    yields a list that gets one entry per call. Restored on exit."""
    real = getattr(module, name)
    calls: list[int] = []

    def spy(*args: Any, **kwargs: Any):
        calls.append(1)
        return real(*args, **kwargs)

    setattr(module, name, spy)
    try:
        yield calls
    finally:
        setattr(module, name, real)


def recurrence_step_grads(entry: Callable[..., Any], leaves: Sequence[torch.Tensor | None], *,
                          cu: torch.Tensor | None = None, l2: bool = False, gate: bool = False,
                          use_h0: bool = True, use_dht: bool = True,
                          **kw: Any) -> tuple[list[str], list[torch.Tensor | None]]:
    """One step of a GDN / KDA entry, ``entry(q, k, v, g, beta, None, h0, use_dht,
    use_qk_l2norm_in_kernel=l2, cu_seqlens=cu, **kw)`` (with ``gate``: also the in-kernel
    gate with A_log and dt_bias, and beta's sigmoid) on fresh copies of ``leaves`` (q, k,
    v, g, beta[, h0[, A_log, dt_bias]], None where absent; without ``use_h0`` the initial
    state is not passed), with the loss ``sum(o * cos(o))`` (plus ``0.1 * sum(ht *
    sin(ht))`` with ``use_dht``). Returns ``(names, values)``: o, the final state (with
    ``use_dht``), then each present leaf's gradient (:data:`RECURRENCE_NAMES`' names)."""
    idx = [i for i, t in enumerate(leaves) if t is not None]

    def step(*xs: torch.Tensor):
        given = dict(zip(idx, xs, strict=True))
        q, k, v, g, beta, h0, A_log, dt_bias = (given.get(i) for i in range(8))
        extra = dict(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                     use_beta_sigmoid_in_kernel=True) if gate else {}
        o, ht = entry(q, k, v, g, beta, None, h0 if use_h0 else None, use_dht,
                      use_qk_l2norm_in_kernel=l2, cu_seqlens=cu, **extra, **kw)
        loss = (o.float() * o.detach().float().cos()).sum()
        if not use_dht:
            return loss, o
        return loss + 0.1 * (ht * ht.detach().sin()).sum(), o, ht

    names = ["o"] + ["final_state"] * use_dht + [f"d{RECURRENCE_LEAVES[i]}" for i in idx]
    return names, leaf_grads(step, [leaves[i] for i in idx])


def assert_keep_states_same_bits(entry: Callable[..., Any], recompute_module: Any,
                                 leaves: Sequence[torch.Tensor | None], plans: Sequence[Any],
                                 *, cu: torch.Tensor | None = None, opts: bool = False,
                                 use_h0: bool = True, use_dht: bool = True) -> None:
    """``plans = (recompute, keep)``, plans that differ in ``keep_states`` only: a step
    (:func:`recurrence_step_grads`, ``opts`` turning on both the L2 norm and the in-kernel
    gate) with the keep plan gives the recompute plan's o, final state and gradients
    bitwise (finite, same dtype and shape; the initial state's gradient None for both
    without ``use_h0``), and ``recompute_module._prep_and_state`` (chunk prep and forward
    state pass) runs twice for the recompute plan's step (forward and backward), once for
    the keep plan's."""
    runs = []
    for plan in plans:
        with counting_calls(recompute_module, _RECOMPUTE) as calls:
            names, got = recurrence_step_grads(entry, leaves, cu=cu, l2=opts, gate=opts,
                                               use_h0=use_h0, use_dht=use_dht, plan=plan)
        runs.append((got, len(calls)))
    (want, n_redo), (got, n_keep) = runs
    assert (n_redo, n_keep) == (2, 1), f"{_RECOMPUTE} runs: {n_redo}, {n_keep}"
    for name, a, b in zip(names, got, want, strict=True):
        if name == "dinitial_state" and not use_h0:  # given but not passed
            assert a is None and b is None, name
        else:
            assert_bitwise_equal_named([a], [b], [name], "keep_states=1 differs from 0")


def assert_kept_plan_resolved(resolve: Callable[..., Any]) -> Any:
    """``resolve(**kw)`` gives an entry call's plan (e.g. a family's ``api._resolve_plan``
    for the call's shapes): the rule's plan (no keywords) has ``keep_states = 0``, and with
    ``disable_recompute=True`` it is that plan with ``keep_states = 1``, the same object on
    every call (made once). Returns the kept plan."""
    rule = resolve()
    kept = resolve(disable_recompute=True)
    assert rule.keep_states == 0 and kept == dataclasses.replace(rule, keep_states=1)
    assert resolve(disable_recompute=True) is kept, "the kept plan is made again"
    return kept


def assert_disable_recompute_calls(entry: Callable[..., Any], recompute_module: Any,
                                   leaves: Sequence[torch.Tensor | None], *,
                                   cu: torch.Tensor | None, l2: bool, gate: bool,
                                   on: Sequence[dict[str, Any]] = (), off: bool = False,
                                   saved_bytes: Callable[..., int] | None = None) -> None:
    """A step (:func:`recurrence_step_grads`, initial state and final-state gradient) of
    the default call runs ``recompute_module._prep_and_state`` twice (the forward's state
    pass and the backward's recompute). With each keyword set of ``on`` (e.g.
    ``disable_recompute=True``, or a kept plan) it runs once (the backward reads the kept
    states), and with ``off`` for ``disable_recompute`` False, None, 0 and ``np.False_``
    twice; each gives the default call's o, final state and gradients bitwise. With
    ``saved_bytes`` (the family's) too: ``saved_bytes(q, k, v, g, beta, cu_seqlens=cu,
    disable_recompute=flag)`` for those off values is the default's."""
    import numpy as np

    def run(**kw: Any):
        with counting_calls(recompute_module, _RECOMPUTE) as calls:
            names, got = recurrence_step_grads(entry, leaves, cu=cu, l2=l2, gate=gate, **kw)
        return names, got, len(calls)

    names, want, n = run()
    assert n == 2, f"the default call ran {_RECOMPUTE} {n} times"
    for kw in on:
        _, got, n = run(**kw)
        assert n == 1, kw  # the forward's only: the backward read the kept states
        assert_bitwise_equal_named(got, want, names, f"{kw} differs from the default")
    for flag in (False, None, 0, np.False_) if off else ():
        _, got, n = run(disable_recompute=flag)
        assert n == 2, flag
        assert_bitwise_equal_named(got, want, names, f"disable_recompute={flag!r} differs")
        if saved_bytes is not None:
            q, k, v, g, beta = leaves[:5]
            assert saved_bytes(q, k, v, g, beta, cu_seqlens=cu, disable_recompute=flag) == \
                saved_bytes(q, k, v, g, beta, cu_seqlens=cu), flag


def assert_recomputing_plan_refused(entry: Callable[..., Any], is_supported: Callable[..., Any],
                                    saved_bytes: Callable[..., int], launch_module: Any,
                                    base: dict[str, Any], plan: Any) -> None:
    """``disable_recompute`` on (True, 1, ``np.True_``) with ``plan`` (``keep_states =
    0``) on the call ``base`` (q, k, v, g, beta): ``entry`` raises ValueError saying to
    pass a plan with ``keep_states=1`` or drop the keyword, before any launch
    (``launch_module``'s ``_launch_fwd``, ``_launch_bwd``, ``_l2norm``) and with nothing
    the caller owns modified; ``is_supported`` gives that reason, ``saved_bytes`` raises
    it. With the plan's ``keep_states = 1`` variant, or the keyword off, ``is_supported``
    accepts; a value without a truth value is refused (ValueError). ``saved_bytes`` with
    ``disable_recompute=True`` is that of the kept plan and more than without (or 0)."""
    import numpy as np

    msg = (r"disable_recompute=True: the plan given has keep_states=0 .*pass a plan with "
           r"keep_states=1 \(dataclasses.replace\(plan, keep_states=1\)\) or drop "
           r"disable_recompute")
    kept = dataclasses.replace(plan, keep_states=1)
    with no_kernel_launches(launch_module, "_launch_fwd", "_launch_bwd", "_l2norm"):
        for flag in (True, 1, np.True_):
            kw = dict(base, plan=plan, disable_recompute=flag)
            err = assert_raises_unmodified(entry, kw, msg)
            s = is_supported(**kw)
            assert not s and s.reason == str(err), flag
            assert_raises_unmodified(saved_bytes, kw, msg)
        assert is_supported(**base, plan=kept, disable_recompute=True)
        assert is_supported(**base, plan=plan, disable_recompute=False)
        for bad in (np.array([True, False]), torch.ones(2)):
            assert_raises_unmodified(entry, dict(base, disable_recompute=bad),
                                     r"disable_recompute=.*expected a flag \(FLA tests it by "
                                     r"truthiness\)")
        more = saved_bytes(**base, disable_recompute=True)
        assert more == saved_bytes(**base, plan=kept)
        assert more > saved_bytes(**base) == saved_bytes(**base, disable_recompute=0)


def disable_recompute_saved_states(entry: Callable[..., Any], saved_bytes: Callable[..., int],
                                   kwargs: dict[str, Any], kept_plan: Any,
                                   first: int = 13) -> tuple[torch.Tensor, ...]:
    """A ``disable_recompute=True`` call ``entry(**kwargs)`` (q, k, v, g and beta set to
    require grad) keeps what ``saved_bytes(**kwargs, disable_recompute=True)`` counts (the
    bytes of what its autograd graph saves, less the inputs): as much as with
    ``kept_plan``, more than without the keyword; any truthy value (1, ``np.True_``,
    ``"yes"``) counts as on. Returns the kept states: the graph's saved tensors from
    position ``first`` on."""
    import numpy as np

    from cake_core.support import owned_nbytes

    for n in ("q", "k", "v", "g", "beta"):
        kwargs[n].requires_grad_(True)
    packed: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        o, _ = entry(**kwargs, disable_recompute=True)
    inputs = [t for t in kwargs.values() if isinstance(t, torch.Tensor)]
    more = saved_bytes(**kwargs, disable_recompute=True)
    assert more == owned_nbytes(packed, exclude=inputs) == saved_bytes(**kwargs, plan=kept_plan)
    assert more > saved_bytes(**kwargs)
    for flag in (1, np.True_, "yes"):  # FLA tests the flag by truthiness
        assert saved_bytes(**kwargs, disable_recompute=flag) == more, flag
    return o.grad_fn.saved_tensors[first:]


def assert_backward_reads_kept_states(fwd: Callable[..., Any], bwd: Callable[..., Any],
                                      entry: Callable[..., Any], recompute_module: Any,
                                      inputs: Sequence[torch.Tensor], plans: Sequence[Any], *,
                                      cu: torch.Tensor | None, kept: dict[str, tuple],
                                      dtype: torch.dtype, kept_states: Callable[[Any], Any],
                                      other_plan: Any, spoil: tuple[str, torch.dtype],
                                      same_plan: Any = None, seed: int = 0):
    """The low-level ``fwd`` / ``bwd`` pair with ``plans = (recompute, keep)`` on
    ``inputs`` (q, k, v, g, beta, h0; ``cu``), upstream gradients drawn from ``seed``,
    ``seed + 1``. The recompute plan's saved set holds none of the states ``kept`` names;
    the keep plan's holds each with its shape (``kept``: ``{name: shape}``) and, as its
    ``A``, ``dtype``. ``bwd`` of the kept set (also with ``same_plan``, a plan of the same
    launches, when given) and the autograd ``entry``'s backward with the keep plan run no
    ``recompute_module._prep_and_state`` and give the recompute set's gradients (dq, dk,
    dv, dg, dbeta, dh0) bitwise. ``bwd`` with ``other_plan`` (other launches), or of the
    kept set with one state of another dtype (``spoil = (name, dtype)``), recomputes once
    and gives the recompute set's bits with that plan; ``kept_states(saved)`` (the
    family's check of the kept set) is None while the set names ``other_plan``. Returns
    the kept saved set (``spoil`` applied) and the shapes of the tensors the entry's
    autograd graph saves from position 13 on."""
    redo, keep = plans
    q, k, v, g, beta, h0 = inputs
    do = randn(v.shape, v.dtype, v.device, seed=seed)
    dht = randn(h0.shape, torch.float32, v.device, seed=seed + 1)

    def forward(plan):
        return fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                   cu_seqlens=cu, plan=plan)[2]

    def recomputed(saved, plan=None):
        with counting_calls(recompute_module, _RECOMPUTE) as calls:
            grads = bwd(do, dht, saved, plan=plan)[:6]
        assert len(calls) == 1, f"{_RECOMPUTE} runs: {len(calls)}"
        return grads

    s0 = forward(redo)
    assert all(getattr(s0, n) is None for n in kept), "the recompute plan kept states"
    want = bwd(do, dht, s0)[:6]
    s1 = forward(keep)
    for n, shape in kept.items():
        assert tuple(getattr(s1, n).shape) == shape and getattr(s1, n).dtype == dtype, n
    assert s1.A.dtype == dtype
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    o, ht = entry(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu,
                  plan=keep)
    saved_shapes = [tuple(t.shape) for t in o.grad_fn.saved_tensors[13:]]
    with no_kernel_launches(recompute_module, _RECOMPUTE):
        runs = [bwd(do, dht, s1)[:6]]
        if same_plan is not None:
            runs.append(bwd(do, dht, s1, plan=same_plan)[:6])
        torch.autograd.backward([o, ht], [do, dht])
    runs.append([x.grad for x in leaves])
    for got in runs:
        for name, a, b in zip(_BWD_NAMES, got, want, strict=True):
            assert bitwise_equal(a, b), f"{name}: the kept states' backward differs"
    other = recomputed(s1, other_plan)
    other_want = want if other_plan == redo else recomputed(s0, other_plan)
    s1.meta["plan"] = other_plan
    assert kept_states(s1) is None, "kept states taken for another plan"
    s1.meta["plan"] = keep
    s1._tensors[spoil[0]] = getattr(s1, spoil[0]).to(spoil[1])
    again = recomputed(s1)
    for name, a, b, c, d in zip(_BWD_NAMES, again, want, other, other_want, strict=True):
        assert bitwise_equal(a, b) and bitwise_equal(c, d), name
    return s1, saved_shapes


def assert_two_forwards_keep_their_states(fwd: Callable[..., Any], bwd: Callable[..., Any],
                                          entry: Callable[..., Any], workspace: Any,
                                          inputs: Sequence[Sequence[torch.Tensor]],
                                          dos: Sequence[torch.Tensor], plans: Sequence[Any], *,
                                          kept: Sequence[str], buffers: Sequence[str]) -> None:
    """Two forwards (``inputs``: two (q, k, v, g, beta, h0); ``dos``: their output
    gradients) with the keep plan of ``plans = (recompute, keep)`` through one
    ``workspace``: no state a saved set keeps (its attributes ``kept``) overlaps a
    workspace buffer (``workspace[name]`` for ``buffers``), and the backwards, the second
    forward's first, give the recompute plan's gradients bitwise, also through the
    autograd ``entry``."""
    redo, keep = plans
    want = []
    for (q, k, v, g, beta, h0), do in zip(inputs, dos, strict=True):
        _, _, s = fwd(q, k, v, g, beta, initial_state=h0, plan=redo)
        want.append(bwd(do, None, s)[:6])
    saved = [fwd(q, k, v, g, beta, initial_state=h0, plan=keep, workspace=workspace)[2]
             for q, k, v, g, beta, h0 in inputs]

    def span(t):
        return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()

    for s in saved:
        for n in kept:
            lo, hi = span(getattr(s, n))
            for b in buffers:
                blo, bhi = span(workspace[b])
                assert hi <= blo or lo >= bhi, f"kept {n} aliases the workspace's {b}"
    for i in (1, 0):
        got = bwd(dos[i], None, saved[i], workspace=workspace)[:6]
        for a, b in zip(got, want[i], strict=True):
            assert bitwise_equal(a, b), i
    leaves = [[t.detach().clone().requires_grad_() for t in x] for x in inputs]
    outs = [entry(*x[:5], initial_state=x[5], plan=keep)[0] for x in leaves]
    for i in (1, 0):
        outs[i].backward(dos[i])
        for x, b in zip(leaves[i], want[i], strict=True):
            assert bitwise_equal(x.grad, b), i


def gated_step(entry: Callable[..., Any], **kw: Any) -> Callable[..., Any]:
    """``step(q, k, v, g, beta, h0, A_log, dt_bias, cu)`` of a GDN / KDA entry for compile
    tests: scale 0.3, the initial and final states, the L2 norm, the in-kernel gate and
    beta's sigmoid, ``kw`` (e.g. ``plan``); returns ``(loss, o, final state)``."""
    def step(q, k, v, g, beta, h0, A_log, dt_bias, cu):
        o, ht = entry(q, k, v, g, beta, 0.3, h0, True, use_qk_l2norm_in_kernel=True,
                      cu_seqlens=cu, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                      use_beta_sigmoid_in_kernel=True, **kw)
        return (o * o).sum() + 0.1 * (ht * ht.detach().sin()).sum(), o, ht
    return step


def assert_keep_states_plan_compiles(entry: Callable[..., Any], plans: Sequence[Any],
                                     leaves: Sequence[torch.Tensor], cu: torch.Tensor, *,
                                     backend: str, op: str) -> None:
    """The keep plan of ``plans = (recompute, keep)`` survives the custom op's fields
    (``plan_to_op_fields`` and back); a :func:`gated_step` with it traces to the custom op
    ``op`` with the eager bits (:func:`assert_compiles_to_op`), which are the recompute
    plan's."""
    from cake_core.compile import plan_from_op_fields, plan_to_op_fields

    redo, keep = plans
    assert plan_from_op_fields(type(keep), plan_to_op_fields(keep)) == keep
    assert_compiles_to_op(gated_step(entry, plan=keep), leaves, (cu,), RECURRENCE_NAMES,
                          backend=backend, op=op)
    assert_bitwise_equal_named(leaf_grads(gated_step(entry, plan=keep), leaves, cu),
                               leaf_grads(gated_step(entry, plan=redo), leaves, cu),
                               RECURRENCE_NAMES, "keep_states=1 differs from 0")


def assert_checkpoint_keep_states(entry: Callable[..., Any], plans: Sequence[Any],
                                  leaves: Sequence[torch.Tensor], cu: torch.Tensor) -> None:
    """A :func:`gated_step` with the keep plan of ``plans = (recompute, keep)`` under
    ``torch.utils.checkpoint`` (non-reentrant) gives the recompute plan's bits."""
    import torch.utils.checkpoint

    redo, keep = plans
    step = gated_step(entry, plan=keep)

    def ckpt(*args):
        return torch.utils.checkpoint.checkpoint(step, *args, use_reentrant=False)

    assert_bitwise_equal_named(leaf_grads(ckpt, leaves, cu),
                               leaf_grads(gated_step(entry, plan=redo), leaves, cu),
                               RECURRENCE_NAMES, "checkpointed keep_states=1 differs")


def assert_disable_recompute_compiles(entry: Callable[..., Any], recompute_module: Any,
                                      leaves: Sequence[torch.Tensor], cu: torch.Tensor, *,
                                      backend: str, op: str) -> None:
    """A :func:`gated_step` with ``disable_recompute=True`` traces to the custom op ``op``
    with the eager bits (:func:`assert_compiles_to_op`), running
    ``recompute_module._prep_and_state`` once eagerly and once compiled (the backwards
    recompute nothing), and gives the default call's bits."""
    with counting_calls(recompute_module, _RECOMPUTE) as calls:
        compiled = assert_compiles_to_op(gated_step(entry, disable_recompute=True), leaves,
                                         (cu,), RECURRENCE_NAMES, backend=backend, op=op)
        assert len(calls) == 2, f"{_RECOMPUTE} runs: {len(calls)}"
        assert_bitwise_equal_named(leaf_grads(compiled, leaves, cu),
                                   leaf_grads(gated_step(entry, plan=None), leaves, cu),
                                   RECURRENCE_NAMES,
                                   "compiled disable_recompute differs from the default")


def assert_keep_states_field_serialised(make_plan: Callable[..., Any],
                                        plans: Sequence[Any]) -> None:
    """The rule's plans (``make_plan(K, V, dtype, device)``, on cpu and cuda, 16 fp32 and
    128 bf16) keep no states; the keep plan of ``plans = (recompute, keep)`` serialises
    (``to_dict`` with ``keep_states`` 1 and ``version`` 1, ``from_dict``, JSON), has its
    own key and hash, equals any plan with its fields; ``keep_states`` 2 or -1 is
    refused (ValueError)."""
    import json

    redo, keep = plans
    for dev in ("cpu", "cuda"):
        for K, V, dt in ((16, 16, torch.float32), (128, 128, torch.bfloat16)):
            assert make_plan(K, V, dt, dev).keep_states == 0
    d = keep.to_dict()
    assert d["keep_states"] == 1 and d["version"] == 1
    assert type(keep).from_dict(d) == keep and keep.key != redo.key
    assert type(keep).from_dict(json.loads(keep.to_json())) == keep
    assert hash(keep) != hash(redo) and {keep: 1}[dataclasses.replace(redo, keep_states=1)]
    for bad in (2, -1):
        assert_raises_unmodified(lambda **kw: dataclasses.replace(redo, **kw),
                                 dict(keep_states=bad), "keep_states")


def keep_states_plans(plan: Any) -> tuple[Any, Any]:
    """``(plan, plan with keep_states = 1)`` for a ``plan`` that keeps no states (checked)."""
    assert plan.keep_states == 0, plan
    return plan, dataclasses.replace(plan, keep_states=1)
