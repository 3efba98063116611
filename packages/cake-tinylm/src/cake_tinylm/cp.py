"""The main job under context parallelism (``cake-tinylm train --cp N``).

Each step's batch of ``B`` windows of ``T`` bytes is one packed sequence of ``B``
documents (``cu_seqlens = [0, T, 2T, ..., BT]``) split over ``N`` processes by
:func:`cake_core.kcp.Partition` (``"contiguous"`` or ``"zigzag"``). Every process holds a
full replica of the cake model and runs it on its own tokens only:

- per-token modules (embeddings with each token's position in its window, RMSNorm, every
  Linear, the MLP, the fused LM head + cross entropy) need nothing from other ranks;
- the GDN / KDA blocks' short convolution takes the ``W - 1`` rows before each of the
  rank's fragments from the ranks that hold them
  (``cake_causal_conv1d_det_train_kcp.causal_conv1d_det_kcp``), and the delta-rule core
  hands the recurrent state across the cuts (``cake_gdn_det_train_kcp`` /
  ``cake_kda_det_train_kcp``, exchange ``"allgather"`` or ``"ring"``);
- the loss is the mean over all ``B T`` tokens: rank ``r`` back-propagates its local mean
  times ``T_r / (B T)``;
- parameter gradients are summed across ranks in a fixed order: one all-gather of every
  rank's gradients (flattened, fp32), then ``g_0 + g_1 + ... + g_{N-1}`` on every rank,
  so every replica takes the same AdamW step and the replicas stay bitwise equal (no
  all-reduce, whose summation order NCCL does not fix).

The attention mixer has no context-parallel route (``ValueError``). gloo on CPUs (the
Triton interpreter), NCCL on GPUs (rank ``r`` on ``cuda:r``). The GDN block's gate
(``-exp(A_log) softplus(a + dt_bias)``) and beta's sigmoid run in fp32 torch on this route
(the GDN KCP entry takes no in-kernel gate), so the CP run agrees with the single-process
run within float tolerance, not bitwise: bits are promised per partition.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .data import get_batch

__all__ = ["CPConfig", "CPContext", "CPJobResult", "CPRunResult", "EXCHANGES", "LAYOUTS",
           "check_cp",
           "run_cp_job", "train_cp", "write_cp_report"]

LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag", "zigzag_per_document")
EXCHANGES: tuple[str, ...] = ("allgather", "ring")


@dataclass(frozen=True)
class CPConfig:
    """How the job is split.

    Attributes:
        world_size: processes ``N >= 1`` (on CUDA at most the number of GPUs).
        layout: ``"contiguous"``, ``"zigzag"`` or ``"zigzag_per_document"``
            (:class:`cake_core.kcp.Partition`).
        exchange: ``"allgather"`` or ``"ring"`` (the delta-rule cores' state exchange).
    """

    world_size: int
    layout: str = "contiguous"
    exchange: str = "allgather"

    def __post_init__(self) -> None:
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) \
                or self.world_size < 1:
            raise ValueError(f"cp world_size must be an int >= 1, got {self.world_size!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"cp layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.exchange not in EXCHANGES:
            raise ValueError(f"cp exchange must be one of {EXCHANGES}, got {self.exchange!r}")


@dataclass
class CPContext:
    """What a mixer needs on the context-parallel route: the KCP context of this rank
    (``cake_core.kcp.Context``, shared by the conv halo and the delta-rule exchange) and
    the mixer kind."""

    ctx: object
    mixer: str


@dataclass
class CPRunResult:
    """One context-parallel training run (``N`` processes).

    Attributes:
        name: ``"cp-a"`` or ``"cp-b"``.
        losses: fp32 CPU ``[steps]``: the global mean loss per step (rank-order sum of the
            ranks' shares; the same bits on every rank).
        seconds: wall time of rank 0's training loop.
        tokens_per_s: global tokens per second.
        state: rank 0's final ``state_dict`` (CPU).
        replica_hashes: sha256 of every rank's final parameters (all equal when the
            replicas stayed in step).
    """

    name: str
    losses: torch.Tensor
    seconds: float
    tokens_per_s: float
    state: dict[str, torch.Tensor] = field(repr=False)
    replica_hashes: list[str]

    @property
    def replicas_identical(self) -> bool:
        """Every rank ended with the same parameter bits."""
        return len(set(self.replica_hashes)) == 1


def _partition(cp: CPConfig, batch_size: int, seq_len: int):
    """The partition of one step's packed windows (the same every step)."""
    from cake_core.kcp import Partition

    cu = list(range(0, batch_size * seq_len + 1, seq_len))
    return Partition.from_cu_seqlens(cu, cp.world_size, cp.layout)


def check_cp(cfg, cp: CPConfig, batch_size: int) -> None:
    """Refuse, before anything trains, what the context-parallel route cannot run: another
    mixer than GDN / KDA, more ranks than GPUs on CUDA, or a split that leaves a rank
    without tokens (``B * seq_len`` tokens cut by ``cp.layout``: zigzag can leave a rank
    empty even with more tokens than ranks).

    Raises:
        ValueError: naming the reason.
    """
    if getattr(cfg, "moe_experts", 0):
        raise ValueError("--cp with --moe is not supported (the load-balancing loss would "
                         "need every rank's routing)")
    if cfg.mixer not in ("gdn", "kda"):
        raise ValueError(f"--cp needs --mixer gdn or kda (the {cfg.mixer!r} mixer has no "
                         f"context-parallel route)")
    if cfg.mhc:
        raise ValueError("--cp: hyper-connections (--mhc) have no context-parallel route")
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda and cp.world_size > torch.cuda.device_count():
        raise ValueError(f"cp: {cp.world_size} ranks but {torch.cuda.device_count()} GPUs")
    tokens = batch_size * cfg.seq_len
    part = _partition(cp, batch_size, cfg.seq_len)
    counts = [part.local_num_tokens(r) for r in range(cp.world_size)]
    if min(counts) == 0:
        raise ValueError(f"cp: {tokens} tokens per step ({batch_size} x {cfg.seq_len}) cut "
                         f"{cp.layout} over {cp.world_size} ranks leave a rank without "
                         f"tokens (per rank: {counts}); use fewer ranks or more tokens")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _params_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().view(torch.int32).numpy().tobytes())
    return h.hexdigest()[:16]


def _rank_order_sum(t: torch.Tensor, world: int) -> torch.Tensor:
    """Every rank's ``t`` (fp32, same shape) summed in rank order; the same bits on every
    rank (all-gather, then sequential adds)."""
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    out = parts[0].clone()
    for p in parts[1:]:
        out += p
    return out


def _sync_grads(model: torch.nn.Module, world: int) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).float().reshape(-1)
                      for p in params])
    total = _rank_order_sum(flat, world)
    off = 0
    for p in params:
        n = p.numel()
        p.grad = total[off:off + n].view_as(p).to(p.dtype).clone()
        off += n


def _worker(rank: int, world: int, port: int, cfg, cp: CPConfig, init_state, train_data,
            starts, out_dir: str, name: str, progress: bool) -> None:
    from .model import build_model
    from .train import DTYPES, _make_optimizer, _set_lr, deterministic_mode

    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    try:
        from cake_core.kcp import build_context

        from .model import SHORT_CONV_SIZE

        with deterministic_mode():
            model = build_model(cfg.model_config(), "cake", device=device,
                                dtype=DTYPES[cfg.dtype])
            model.load_state_dict(init_state)
            # the single-process run's optimizer (capturable, tensor lr on CUDA): the gap
            # to it is the split's, not AdamW's rounding
            opt = _make_optimizer(model, cfg)
            steps, bsz = starts.shape
            T = cfg.seq_len
            part = _partition(cp, bsz, T)
            gi = part.global_index(rank)  # never empty: check_cp ran in the parent
            ctx = build_context(part, None, rank, device, SHORT_CONV_SIZE,
                                exchange=cp.exchange)
            cpc = CPContext(ctx=ctx, mixer=cfg.mixer)
            pos = (gi % T)[None].to(device)
            share = gi.numel() / (bsz * T)
            losses = []
            model.train()
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            for step in range(steps):
                _set_lr(opt, cfg, step)
                x, y = get_batch(train_data, starts[step], T, torch.device("cpu"))
                xl = x.reshape(-1)[gi][None].to(device)
                yl = y.reshape(-1)[gi][None].to(device)
                _, loss = model(xl, yl, positions=pos, cp=cpc)
                opt.zero_grad(set_to_none=True)
                (loss * share).backward()
                _sync_grads(model, world)
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
                losses.append(_rank_order_sum((loss.detach().float() * share).reshape(1),
                                              world))
                if progress and rank == 0 and ((step + 1) % max(1, steps // 10) == 0):
                    print(f"{name:>7} step {step + 1}/{steps} loss {float(losses[-1]):.4f}",
                          flush=True)
            if cuda:
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0
            result = {"rank": rank, "losses": torch.cat(losses).float().cpu(),
                      "seconds": seconds, "hash": _params_hash(model)}
            if rank == 0:
                result["state"] = {k: v.detach().cpu().clone()
                                   for k, v in model.state_dict().items()}
            torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
            dist.barrier()  # leave together: a rank torn down early can abort gloo peers
    finally:
        dist.destroy_process_group()


def train_cp(name: str, cfg, cp: CPConfig, init_state, train_data: torch.Tensor,
             starts: torch.Tensor, *, progress: bool = True) -> CPRunResult:
    """Train the cake model context-parallel over ``cp.world_size`` spawned processes.

    Args:
        name: label of the run.
        cfg: the job's :class:`~cake_tinylm.train.TrainConfig` (``mixer`` must be
            ``"gdn"`` or ``"kda"``).
        cp: the split.
        init_state: the initial ``state_dict`` (CPU), loaded on every rank.
        train_data: ``uint8`` CPU ``[N]``; starts: ``int64`` ``[steps, B]`` window offsets.
        progress: rank 0 prints about ten progress lines.

    Raises:
        ValueError: as :func:`check_cp` (before any process starts).
    """
    steps, bsz = starts.shape
    check_cp(cfg, cp, bsz)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="cake-tinylm-cp-") as out_dir:
        mp.spawn(_worker, args=(cp.world_size, _free_port(), cfg, cp, init_state, train_data,
                                starts, out_dir, name, progress),
                 nprocs=cp.world_size, join=True)
        res = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
               for r in range(cp.world_size)]
    r0 = res[0]
    return CPRunResult(name=name, losses=r0["losses"], seconds=r0["seconds"],
                       tokens_per_s=steps * bsz * cfg.seq_len / max(r0["seconds"], 1e-9),
                       state=r0["state"], replica_hashes=[r["hash"] for r in res])


@dataclass
class CPJobResult:
    """Outcome of :func:`run_cp_job`.

    Attributes:
        config, model_config, cp: what ran.
        device, device_name: resolved device.
        single: the single-process cake run (:class:`~cake_tinylm.train.RunResult`).
        runs: the two context-parallel runs ``[cp-a, cp-b]``.
        val_loss_cp: validation loss of cp-a's final weights (single-process evaluation).
        losses_identical / weights_identical: cp-a and cp-b equal bit for bit.
        replicas_identical: within each CP run, every rank ended with the same weights.
        max_gap_single: ``max |loss_cp_a - loss_single|`` over steps.
        seconds: wall time of the whole job.
    """

    config: object
    model_config: object
    cp: CPConfig
    device: str
    device_name: str
    single: object
    runs: list[CPRunResult]
    val_loss_cp: float
    losses_identical: bool
    weights_identical: bool
    replicas_identical: bool
    max_gap_single: float
    seconds: float

    @property
    def identical(self) -> bool:
        """The CP run repeats bitwise (losses, weights) and its replicas agree."""
        return self.losses_identical and self.weights_identical and self.replicas_identical

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable summary (losses as lists)."""
        from dataclasses import asdict

        from .report import package_versions

        return {
            "job": "cake-tinylm train --cp",
            "config": {"train": asdict(self.config), "model": self.model_config.to_dict(),
                       "cp": asdict(self.cp)},
            "device": self.device, "device_name": self.device_name,
            "torch": torch.__version__, "packages": package_versions(),
            "single": {"losses": self.single.losses.tolist(), "val_loss": self.single.val_loss,
                       "tokens_per_s": self.single.tokens_per_s,
                       "cuda_graph": self.single.cuda_graph,
                       "cuda_graph_note": self.single.cuda_graph_note},
            "cp_runs": [{"name": r.name, "losses": r.losses.tolist(),
                         "tokens_per_s": r.tokens_per_s, "replica_hashes": r.replica_hashes}
                        for r in self.runs],
            "val_loss_cp": self.val_loss_cp,
            "identical": self.identical,
            "losses_identical": self.losses_identical,
            "weights_identical": self.weights_identical,
            "replicas_identical": self.replicas_identical,
            "max_gap_single": self.max_gap_single,
            "seconds": self.seconds,
        }

    def summary(self) -> str:
        """A few lines for the terminal."""
        c = self.cp
        lines = [
            f"cake-tinylm --cp {c.world_size} ({c.layout}, {c.exchange}), mixer "
            f"{self.config.mixer}, {self.device_name}",
            f"  single-process: final loss {float(self.single.losses[-1]):.4f}, val "
            f"{self.single.val_loss:.4f}, {self.single.tokens_per_s:,.0f} tok/s",
        ]
        if self.single.cuda_graph:  # --cuda-graph: the single-process run only
            lines.append("  (single-process steps replayed from one CUDA graph, its tok/s with "
                         "the warm-up and the capture; the cp runs eager)")
        elif self.single.cuda_graph_note:
            lines.append(f"  (single-process step not captured, eager steps: "
                         f"{self.single.cuda_graph_note})")
        for r in self.runs:
            lines.append(f"  {r.name}: final loss {float(r.losses[-1]):.4f}, "
                         f"{r.tokens_per_s:,.0f} tok/s, replicas "
                         f"{'equal' if r.replicas_identical else 'DIFFER'}")
        lines.append(f"  cp val loss {self.val_loss_cp:.4f}; max |loss gap| to single "
                     f"process {self.max_gap_single:.3e}")
        lines.append(f"  cp runs bitwise identical: losses {self.losses_identical}, weights "
                     f"{self.weights_identical}, replicas {self.replicas_identical}")
        return "\n".join(lines)


def run_cp_job(cfg, cp: CPConfig, *, progress: bool = True, corpus=None) -> CPJobResult:
    """The main job under context parallelism: one single-process cake run, then the same
    training split over ``cp.world_size`` processes twice; reports the loss gap to the
    single-process run and whether the CP run repeats bitwise.

    Raises:
        ValueError: as :func:`check_cp` (before anything trains) and
            :func:`cake_tinylm.train.run_job`.
    """
    from .data import batch_starts, load_corpus, split_train_val
    from .data import val_windows as make_val_windows
    from .model import build_model
    from .train import (
        DTYPES,
        EVAL_BATCH,
        _device_name,
        deterministic_mode,
        evaluate,
        resolve_device,
        train_once,
        use_cuda_graph,
    )

    t_job = time.perf_counter()
    check_cp(cfg, cp, cfg.batch_size)  # before the single-process run, not after it
    device = resolve_device(cfg.device)
    use_cuda_graph(cfg, device)  # "--cuda-graph on" without CUDA: refused before any work
    mcfg = cfg.model_config()
    dtype = DTYPES[cfg.dtype]
    if corpus is None:
        corpus = load_corpus(cfg.text, cfg.bytes)
    train_data, val_data = split_train_val(corpus.data)
    starts = batch_starts(train_data.numel(), cfg.steps, cfg.batch_size, cfg.seq_len, cfg.seed)
    val_starts = make_val_windows(val_data, cfg.seq_len, cfg.val_windows)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        init_state = {k: v.clone() for k, v in build_model(mcfg, "cake").state_dict().items()}
    with deterministic_mode():
        model = build_model(mcfg, "cake", device=device, dtype=dtype)
        model.load_state_dict(init_state)
        single = train_once("single", model, train_data, starts, cfg, val_data=val_data,
                            val_starts=val_starts, progress=progress)
    runs = [train_cp(name, cfg, cp, init_state, train_data, starts, progress=progress)
            for name in ("cp-a", "cp-b")]
    a, b = runs
    with deterministic_mode():
        model = build_model(mcfg, "cake", device=device, dtype=dtype)
        model.load_state_dict(a.state)
        val_cp = evaluate(model, val_data, val_starts, cfg.seq_len,
                          max(cfg.batch_size, EVAL_BATCH))
    same_w = a.state.keys() == b.state.keys() and all(
        torch.equal(a.state[k], b.state[k]) for k in a.state)
    return CPJobResult(
        config=cfg, model_config=mcfg, cp=cp, device=str(device),
        device_name=_device_name(device), single=single, runs=runs, val_loss_cp=val_cp,
        losses_identical=torch.equal(a.losses.view(torch.int32), b.losses.view(torch.int32)),
        weights_identical=same_w,
        replicas_identical=a.replicas_identical and b.replicas_identical,
        max_gap_single=float((a.losses.double() - single.losses.double()).abs().max()),
        seconds=time.perf_counter() - t_job,
    )


def write_cp_report(result: CPJobResult, out) -> str:
    """Write ``report_cp.json`` into ``out`` (created if needed); returns its path."""
    import json
    from pathlib import Path

    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "report_cp.json"
    path.write_text(json.dumps(result.to_dict(), indent=1))
    return str(path)
