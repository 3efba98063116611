"""The main job: train the tiny LM three times and compare.

1. Build the model once from ``seed`` (on CPU, fp32) and clone its initial state.
2. Train cake run A and cake run B from that state on the same batches (offsets drawn
   up front from a ``torch.Generator`` seeded by ``seed``); their per-step losses must
   agree bit for bit and their final parameters must be ``torch.equal``.
3. Train the torch reference (``torch.nn.RMSNorm``, ``torch.nn.Linear``, ``nn.Linear`` head +
   ``F.cross_entropy``; same parameter names) from the same state on the same batches;
   report the largest absolute gap between its loss curve and cake run A's.

``model="qwen3-next"`` (``--model qwen3-next``) runs the same job on a small random-init
``transformers`` Qwen3-Next (:mod:`cake_tinylm.hf`): the cake runs patched by
``cake_transformers.apply_cake_kernels_to_qwen3_next``, the torch run transformers' own code.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from .data import DEFAULT_BYTES, ByteCorpus, batch_starts, get_batch, load_corpus, split_train_val
from .data import val_windows as make_val_windows
from .hf import HF_MODELS, MODELS, build_hf_model, hf_config, require_hf
from .model import ModelConfig, build_model

__all__ = [
    "CUDA_DEFAULTS",
    "JobResult",
    "MODELS",
    "RunResult",
    "TrainConfig",
    "default_config",
    "deterministic_mode",
    "evaluate",
    "resolve_device",
    "run_job",
    "train_once",
    "use_cuda_graph",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

#: Validation scores at least this many windows per forward (fewer interpreted launches on
#: the CPU than the small training batch would take).
EVAL_BATCH = 16

#: Overrides of the :class:`TrainConfig` defaults (which are sized for the CPU interpreter)
#: used when the job runs on CUDA (``--model tinylm``; a ``transformers`` model's own
#: defaults are its :class:`~cake_tinylm.hf.ModelSpec`'s).
CUDA_DEFAULTS: dict[str, object] = dict(
    steps=300, batch_size=32, seq_len=512, d_model=512, n_layers=6, n_heads=8, lr=1e-3
)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines one job. Field defaults are the CPU defaults: the whole job
    (three trainings) takes about four minutes on a 2-core CPU through the Triton
    interpreter, where a cake step costs its ~50 interpreted kernel launches more than its
    tokens (4 x 32 tokens keep every GEMM at one or two programs, with no split-K);
    :data:`CUDA_DEFAULTS` replaces some of them on a GPU.

    Attributes:
        steps: optimizer steps per run.
        batch_size: windows per step ``B``.
        seq_len: tokens per window ``T``.
        d_model, n_layers, n_heads: model size (see :class:`~cake_tinylm.model.ModelConfig`).
        lr: AdamW learning rate (constant after a linear warm-up of ``warmup`` steps).
        seed: seed of the initial weights and of the batch order.
        dtype: ``"float32"`` or ``"bfloat16"`` (parameter and activation dtype).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"`` (``auto`` = cuda if available).
        text: corpus path (file or directory) or ``None`` for the stdlib sources.
        bytes: corpus byte budget.
        out: output directory for ``report.json`` and ``loss.png``.
        weight_decay: AdamW weight decay.
        warmup: linear warm-up steps.
        grad_clip: max global gradient norm (``0`` disables clipping).
        val_windows: at most this many validation windows of ``seq_len`` are scored.
        activation: MLP activation, ``"gelu"`` or ``"silu"``.
        mixer: token mixer, ``"attention"``, ``"gdn"`` (Gated DeltaNet; see
            :class:`~cake_tinylm.model.GatedDeltaNet`) or ``"kda"`` (Kimi Delta Attention;
            see :class:`~cake_tinylm.model.KimiDeltaAttention`).
        moe_experts, moe_top_k: 0, 0 (default): dense MLPs. E, k: every block's MLP is a
            mixture of E SwiGLU experts with top-k routing (``--moe E,k``; see
            :class:`~cake_tinylm.model.ModelConfig`); the training loss then includes the
            blocks' load-balancing losses.
        mhc: residual streams of hyper-connections around every sub-layer (2, 4 or 8;
            ``cake_mhc_det_train`` in the cake runs), or 0 (default) for the plain residual.
        cuda_graph: ``"auto"`` (default: on for CUDA), ``"on"`` or ``"off"``: on CUDA, each
            run's training step (forward, backward, clipping, AdamW) is captured once in a
            CUDA graph and replayed per batch, so the host issues one replay per step
            instead of every launch (see :func:`train_once`); ``"on"`` needs CUDA.
        model: ``"tinylm"`` (default: :class:`~cake_tinylm.model.TinyLM`) or a
            ``transformers`` model of :data:`~cake_tinylm.hf.HF_MODELS` (``"qwen3-next"``:
            built from ``d_model``, ``n_layers``, ``n_heads``, ``seq_len`` and the experts
            ``moe_experts`` / ``moe_top_k`` by :func:`~cake_tinylm.hf.qwen3_next_config`;
            ``mixer``, ``activation`` and ``mhc`` are tinylm's and must stay at their
            defaults).
    """

    steps: int = 64
    batch_size: int = 4
    seq_len: int = 32
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    lr: float = 2e-3
    seed: int = 0
    dtype: str = "float32"
    device: str = "auto"
    text: str | None = None
    bytes: int = DEFAULT_BYTES
    out: str = "runs/tinylm"
    weight_decay: float = 0.1
    warmup: int = 10
    grad_clip: float = 1.0
    val_windows: int = 64
    activation: str = "gelu"
    mixer: str = "attention"
    moe_experts: int = 0
    moe_top_k: int = 0
    mhc: int = 0
    model: str = "tinylm"
    cuda_graph: str = "auto"

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "bytes", "val_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive finite number, got {self.lr}")
        if self.warmup < 0 or self.grad_clip < 0 or self.weight_decay < 0:
            raise ValueError("warmup, grad_clip and weight_decay must be >= 0")
        if self.cuda_graph not in ("auto", "on", "off"):
            raise ValueError(f"cuda_graph must be auto, on or off, got {self.cuda_graph!r}")
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.model != "tinylm" and (self.mixer != "attention" or self.mhc
                                       or self.activation != "gelu"):
            raise ValueError(f"--mixer, --mhc and the activation are tinylm's options; "
                             f"--model {self.model} has its own layers")

    def model_config(self):
        """The :class:`ModelConfig` this job trains, or for a ``transformers`` model its
        config (:func:`~cake_tinylm.hf.hf_config`). Raises ``ValueError`` if inconsistent,
        ``ImportError`` if a ``transformers`` model's packages are missing."""
        if self.model != "tinylm":
            return hf_config(self)
        return ModelConfig(
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            max_seq_len=self.seq_len,
            activation=self.activation,
            mixer=self.mixer,
            moe_experts=self.moe_experts,
            moe_top_k=self.moe_top_k,
            mhc=self.mhc,
        )


def default_config(device: str = "auto", **overrides: object) -> TrainConfig:
    """A :class:`TrainConfig` with the defaults for ``device`` (CPU or CUDA) and for
    ``overrides["model"]`` (default ``"tinylm"``), then overrides.

    Raises:
        ValueError: on an invalid device or override value.
        TypeError: on an unknown override name.
    """
    cuda = resolve_device(device).type == "cuda"
    base = dict(CUDA_DEFAULTS) if cuda else {}
    spec = HF_MODELS.get(str(overrides.get("model", "tinylm")))
    if spec is not None:
        base.update(spec.cuda_defaults if cuda else spec.cpu_defaults)
    return TrainConfig(**{**base, "device": device, **overrides})


@dataclass
class RunResult:
    """One training run.

    Attributes:
        name: ``"cake-a"``, ``"cake-b"`` or ``"torch"``.
        impl: ``"cake"`` or ``"torch"`` modules.
        losses: ``float32`` CPU tensor ``[steps]`` of per-step training losses.
        val_loss: mean cross entropy over the validation windows after training (nats/byte).
        seconds: wall time of the training loop (validation excluded; a graphed run's
            includes its warm-up and capture, a run whose capture failed counts its eager
            steps only).
        tokens_per_s: ``steps * batch_size * seq_len / seconds``.
        cuda_graph: the steps ran as replays of one captured CUDA graph.
        cuda_graph_note: why a capture the config asked for failed (the steps then ran
            eagerly from the run's initial weights), else ``None``.
        model: the trained model (a :class:`~cake_tinylm.model.TinyLM`, or a
            :class:`~cake_tinylm.hf.HFCausalLM` around a ``transformers`` model).
    """

    name: str
    impl: str
    losses: torch.Tensor
    val_loss: float
    seconds: float
    tokens_per_s: float
    model: nn.Module = field(repr=False)
    cuda_graph: bool = False
    cuda_graph_note: str | None = None

    @property
    def final_train_loss(self) -> float:
        """Training loss of the last step."""
        return float(self.losses[-1])


@dataclass
class JobResult:
    """Outcome of :func:`run_job`.

    Attributes:
        config: the job's :class:`TrainConfig`.
        model_config: the :class:`ModelConfig` trained, or the ``transformers`` config.
        device: resolved device string; ``device_name`` its human name.
        corpus: ``{"source", "n_bytes", "n_files", "n_train", "n_val"}``.
        runs: ``[cake-a, cake-b, torch]``.
        losses_identical: per-step losses of the cake runs equal bit for bit.
        weights_identical: every final parameter of the cake runs ``torch.equal``.
        max_gap_torch: ``max |loss_cake_a - loss_torch|`` over steps.
        seconds: wall time of the whole job.
        n_params: parameters of the model.
    """

    config: TrainConfig
    model_config: ModelConfig | Any
    device: str
    device_name: str
    corpus: dict[str, object]
    runs: list[RunResult]
    losses_identical: bool
    weights_identical: bool
    max_gap_torch: float
    seconds: float
    n_params: int = 0

    @property
    def identical(self) -> bool:
        """Both cake runs identical in losses and in final weights."""
        return self.losses_identical and self.weights_identical

    def run(self, name: str) -> RunResult:
        """The run called ``name`` (raises ``KeyError`` if absent)."""
        for r in self.runs:
            if r.name == name:
                return r
        raise KeyError(name)

    def config_dict(self) -> dict[str, object]:
        """JSON-serialisable config: train config plus model config (a ``transformers``
        config's ``to_dict()``)."""
        return {"train": asdict(self.config), "model": self.model_config.to_dict()}


def resolve_device(device: str) -> torch.device:
    """Map ``"auto" | "cpu" | "cuda"`` to a ``torch.device``.

    Raises:
        ValueError: on another name, or ``"cuda"`` without an available GPU.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda requested but torch.cuda.is_available() is False")
        return torch.device("cuda")
    raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")


@contextlib.contextmanager
def deterministic_mode(warn_only: bool = False) -> Iterator[None]:
    """Run the body with ``torch.use_deterministic_algorithms(True, warn_only=warn_only)``;
    restore the previous setting on exit. Also sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
    unless already set (cuBLAS reads it when its first handle is created, so it must precede
    the first CUDA matmul; it is left set)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)


class _Bar:
    """Minimal text progress bar on stderr (redraws in place on a TTY, else ~10 lines)."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.tty = enabled and sys.stderr.isatty()
        self.every = max(1, total // (50 if self.tty else 10))
        self.t0 = time.perf_counter()

    def wants(self, step: int) -> bool:
        return self.enabled and (step % self.every == 0 or step == self.total)

    def update(self, step: int, loss: float, tokens: int) -> None:
        width = 30
        filled = width * step // self.total
        rate = tokens / max(time.perf_counter() - self.t0, 1e-9)
        line = (
            f"{self.label:>7} |{'#' * filled}{'-' * (width - filled)}| "
            f"{step}/{self.total} loss {loss:.4f} {rate:,.0f} tok/s"
        )
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if step == self.total else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def evaluate(
    model: nn.Module, data: torch.Tensor, starts: torch.Tensor, seq_len: int, batch_size: int
) -> float:
    """Mean cross entropy (nats/byte) of ``model`` over windows at ``starts`` of ``data``.

    Args:
        model: the LM (its device is used).
        data: ``uint8`` CPU tensor ``[N]``.
        starts: ``int64`` ``[W]`` offsets with ``start + seq_len < N``.
        seq_len, batch_size: window length and windows per forward.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    for i in range(0, starts.numel(), batch_size):
        chunk = starts[i : i + batch_size]
        x, y = get_batch(data, chunk, seq_len, device)
        _, loss = model(x, y)
        total += loss.double() * chunk.numel()
        count += chunk.numel()
    model.train(was_training)
    return float(total / count)


def train_once(
    name: str,
    model: nn.Module,
    train_data: torch.Tensor,
    starts: torch.Tensor,
    cfg: TrainConfig,
    *,
    val_data: torch.Tensor,
    val_starts: torch.Tensor,
    progress: bool = True,
) -> RunResult:
    """Train ``model`` in place on the batches given by ``starts`` and score validation.

    With :func:`use_cuda_graph` true the step (forward, backward, clipping, AdamW) is
    captured once by :func:`_capture_step` and replayed per batch; a step that cannot be
    captured warns and the run's steps run eagerly from its initial weights
    (``RunResult.cuda_graph_note``).

    Args:
        name: label of the run (progress bar, report).
        model: freshly initialised model on its target device and dtype.
        train_data: ``uint8`` CPU tensor ``[N]``.
        starts: ``int64`` ``[steps, B]`` window offsets (from :func:`batch_starts`).
        cfg: the job config (``lr``, ``weight_decay``, ``warmup``, ``grad_clip``,
            ``seq_len``).
        val_data, val_starts: validation split and its window offsets (scored after
            training, ``max(B, EVAL_BATCH)`` windows per forward).
        progress: draw a progress bar on stderr.

    Returns:
        A :class:`RunResult` (losses as an fp32 CPU tensor ``[steps]``).
    """
    device = next(model.parameters()).device
    graph = use_cuda_graph(cfg, device)
    opt = _make_optimizer(model, cfg)
    steps, bsz = starts.shape
    tokens_per_step = bsz * cfg.seq_len
    bar = _Bar(name, steps, progress)
    losses: list[torch.Tensor] = []
    model.train()

    def step_body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        _, loss = model(x, y)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        return loss

    _sync(device)
    t0 = time.perf_counter()
    graph_note = None
    if graph:
        try:
            replay = _capture_step(model, opt, step_body, *get_batch(
                train_data, starts[0], cfg.seq_len, device))
        except RuntimeError as exc:  # a host sync or an upload inside the step
            graph, graph_note = False, _capture_failure_note(exc)
            warnings.warn(f"{name}: the step could not be captured in a CUDA graph; its "
                          f"steps run eagerly ({graph_note})", stacklevel=2)
            _sync(device)
            t0 = time.perf_counter()  # the eager run's time: not the failed warm-up's
    for step in range(steps):
        _set_lr(opt, cfg, step)
        x, y = get_batch(train_data, starts[step], cfg.seq_len, device)
        if graph:
            loss = replay(x, y)
        else:
            opt.zero_grad(set_to_none=True)
            loss = step_body(x, y)
        # a replay's loss is a buffer the next replay overwrites: keep a copy of it only
        losses.append(loss.detach().clone() if graph else loss.detach())
        if bar.wants(step + 1):
            bar.update(step + 1, float(loss.detach()), (step + 1) * tokens_per_step)
    _sync(device)
    seconds = time.perf_counter() - t0
    loss_curve = torch.stack(losses).float().cpu()
    val_loss = evaluate(model, val_data, val_starts, cfg.seq_len, max(bsz, EVAL_BATCH))
    return RunResult(
        name=name,
        impl=model.impl,
        losses=loss_curve,
        val_loss=val_loss,
        seconds=seconds,
        tokens_per_s=steps * tokens_per_step / max(seconds, 1e-9),
        model=model,
        cuda_graph=graph,
        cuda_graph_note=graph_note,
    )


def _make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """The job's AdamW over ``model``'s parameters (betas 0.9, 0.95, ``cfg.weight_decay``).

    On a CPU the learning rate is the float ``cfg.lr``. On CUDA it is an fp32 device
    tensor and the optimizer ``capturable=True`` in every run, graphed or not: a graphed
    run then does its eager run's arithmetic, and :func:`_set_lr` changes the value that a
    captured step reads. The context-parallel ranks (:mod:`cake_tinylm.cp`) use this too,
    so their steps do the single-process run's optimizer arithmetic.
    """
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    lr = torch.tensor(cfg.lr, dtype=torch.float32, device=device) if cuda else cfg.lr
    opt = torch.optim.AdamW(
        model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
        capturable=cuda,
    )
    # capturable on purpose in eager CUDA runs too: not torch's "set capturable=False" hint
    opt._warned_capturable_if_run_uncaptured = True
    return opt


def _set_lr(opt: torch.optim.Optimizer, cfg: TrainConfig, step: int) -> None:
    """Before step ``step`` (0-based): ``cfg.lr * min(1, (step + 1) / cfg.warmup)`` into every
    group of ``opt`` (from :func:`_make_optimizer`); nothing when ``cfg.warmup`` is 0. A
    tensor learning rate is filled in place (a captured step reads its storage)."""
    if cfg.warmup:
        value = cfg.lr * min(1.0, (step + 1) / cfg.warmup)
        for group in opt.param_groups:
            if torch.is_tensor(group["lr"]):
                group["lr"].fill_(value)
            else:
                group["lr"] = value


def _capture_failure_note(exc: BaseException) -> str:
    """``exc`` of a failed capture in one line: the first error (torch's ``__exit__`` of
    the capture raises its own, "operation failed due to a previous error during capture",
    with the op that broke the capture as its context) and the last when they differ."""
    first, seen = exc, {id(exc)}
    while (nxt := first.__cause__ or first.__context__) is not None and id(nxt) not in seen:
        first = nxt
        seen.add(id(nxt))

    def line(e: BaseException) -> str:
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0] if text else ''}"[:300]

    return line(first) if first is exc else f"{line(first)}; then {line(exc)}"


def use_cuda_graph(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether :func:`train_once` captures the step: ``cfg.cuda_graph`` ``"on"``, or
    ``"auto"`` on a CUDA device.

    Raises:
        ValueError: ``"on"`` on a device other than CUDA.
    """
    if cfg.cuda_graph == "on" and device.type != "cuda":
        raise ValueError(f"--cuda-graph on needs a CUDA device; this job runs on {device}")
    return cfg.cuda_graph != "off" and device.type == "cuda"


def _capture_step(model: nn.Module, opt: torch.optim.Optimizer, step_body, x0: torch.Tensor,
                  y0: torch.Tensor):
    """Capture one training step of ``step_body`` in a CUDA graph, as PyTorch's whole-network
    capture does: three warm-up steps on a side stream on the batch ``(x0, y0)`` (they
    compile the kernels and create the optimizer's state), the capture (gradients set to
    ``None`` first, so the captured backward writes fresh ones at every replay), then the
    weights and the optimizer's state put back to their values before the warm-up, so the
    replays train from the run's initial weights like an eager run. Returns ``replay(x, y)``:
    copies the batch into the graph's input buffers, replays, and returns the step's loss
    (a buffer the next replay overwrites). A capture that fails raises its error, with the
    weights and the optimizer's state put back all the same."""
    params = list(model.parameters())
    start = [p.detach().clone() for p in params]
    static_x, static_y = x0.clone(), y0.clone()
    captured = False
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                step_body(static_x, static_y)
        torch.cuda.current_stream().wait_stream(side)
        opt.zero_grad(set_to_none=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_loss = step_body(static_x, static_y)
        captured = True
    finally:  # captured or not, the run starts from its initial weights and a fresh state
        torch.cuda.synchronize()
        with torch.no_grad():  # the captured addresses stay; their values go back
            for p, p0 in zip(params, start, strict=True):
                p.copy_(p0)
            for state in opt.state.values():
                for v in state.values():
                    if torch.is_tensor(v):
                        v.zero_()
        if not captured:  # the eager steps that follow start without gradients
            opt.zero_grad(set_to_none=True)
    del start

    def replay(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay()
        return static_loss

    return replay


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def run_job(
    cfg: TrainConfig, *, progress: bool = True, corpus: ByteCorpus | None = None
) -> JobResult:
    """Run the main job (three trainings) and compare them.

    Args:
        cfg: the job config.
        progress: draw per-run progress bars on stderr.
        corpus: a pre-loaded corpus; default loads ``cfg.text`` / stdlib with ``cfg.bytes``.

    Returns:
        A :class:`JobResult`; ``result.identical`` is the determinism verdict.

    Raises:
        ValueError: on an inconsistent config, ``--device cuda`` without a GPU, or a corpus
            too small for ``seq_len`` (the validation split needs ``seq_len + 1`` bytes).
        FileNotFoundError: if ``cfg.text`` does not exist.
    """
    t_job = time.perf_counter()
    device = resolve_device(cfg.device)
    use_cuda_graph(cfg, device)  # "--cuda-graph on" without CUDA: refused before any work
    spec = HF_MODELS.get(cfg.model)
    if spec is not None:
        require_hf(spec)  # the missing-package error before the corpus is read
    mcfg = cfg.model_config()
    dtype = DTYPES[cfg.dtype]

    def build(impl: str, **kw: object) -> nn.Module:
        if spec is None:
            return build_model(mcfg, impl, **kw)
        return build_hf_model(mcfg, spec, impl, **kw)

    if corpus is None:
        corpus = load_corpus(cfg.text, cfg.bytes)
    train_data, val_data = split_train_val(corpus.data)
    starts = batch_starts(train_data.numel(), cfg.steps, cfg.batch_size, cfg.seq_len, cfg.seed)
    val_starts = make_val_windows(val_data, cfg.seq_len, cfg.val_windows)

    with torch.random.fork_rng(devices=[]):  # seed the init without touching the caller's RNG
        torch.manual_seed(cfg.seed)
        # tinylm: the cake build's init (as ever); a transformers model: unpatched (the same)
        init = build("cake" if spec is None else "torch")
        init_state = {k: v.clone() for k, v in init.state_dict().items()}

    runs: list[RunResult] = []
    for name, impl in (("cake-a", "cake"), ("cake-b", "cake"), ("torch", "torch")):
        # an unpatched transformers model may call torch ops without a deterministic
        # implementation (attention backward, scatters): warned about, not refused
        with deterministic_mode(warn_only=spec is not None and impl == "torch"):
            model = build(impl, device=device, dtype=dtype)
            model.load_state_dict(init_state)
            runs.append(
                train_once(
                    name,
                    model,
                    train_data,
                    starts,
                    cfg,
                    val_data=val_data,
                    val_starts=val_starts,
                    progress=progress,
                )
            )
    a, b, ref = runs
    return JobResult(
        config=cfg,
        model_config=mcfg,
        device=str(device),
        device_name=_device_name(device),
        corpus={
            "source": corpus.source,
            "n_bytes": corpus.n_bytes,
            "n_files": len(corpus.files),
            "n_train": int(train_data.numel()),
            "n_val": int(val_data.numel()),
        },
        runs=runs,
        losses_identical=_same_bits(a.losses, b.losses),
        weights_identical=_same_weights(a.model, b.model),
        max_gap_torch=float((a.losses.double() - ref.losses.double()).abs().max()),
        seconds=time.perf_counter() - t_job,
        n_params=sum(p.numel() for p in a.model.parameters()),
    )
