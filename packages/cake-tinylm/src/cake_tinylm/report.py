"""Summary table, ``report.json`` and ``loss.png`` of a :class:`~cake_tinylm.train.JobResult`."""

from __future__ import annotations

import json
import platform
from importlib import metadata
from pathlib import Path

import torch

from .hf import HF_MODELS
from .train import JobResult, TrainConfig

__all__ = ["cake_families", "format_summary", "job_families", "package_versions", "report_dict",
           "write_report"]

_CAKE_PACKAGES = {
    "cake-core": "cake_core",
    "cake-rmsnorm-det-train": "cake_rmsnorm_det_train",
    "cake-dense-projection-det-gemm": "cake_dense_projection_det_gemm",
    "cake-lm-head-loss-det-train": "cake_lm_head_loss_det_train",
    "cake-gdn-det-train": "cake_gdn_det_train",
    "cake-causal-conv1d-det-train": "cake_causal_conv1d_det_train",
    "cake-rmsnorm-silu-gate-det-train": "cake_rmsnorm_silu_gate_det_train",
    "cake-kda-det-train": "cake_kda_det_train",
    "cake-gdn-det-train-kcp": "cake_gdn_det_train_kcp",
    "cake-causal-conv1d-det-train-kcp": "cake_causal_conv1d_det_train_kcp",
    "cake-kda-det-train-kcp": "cake_kda_det_train_kcp",
    "cake-moe-grouped-det-gemm": "cake_moe_grouped_det_gemm",
    "cake-mhc-det-train": "cake_mhc_det_train",
    "cake-gqa-det-train": "cake_gqa_det_train",
    "cake-transformers": "cake_transformers",
    "cake-tinylm": "cake_tinylm",
}

_BASE_FAMILIES = (
    "cake-rmsnorm-det-train",
    "cake-dense-projection-det-gemm",
    "cake-lm-head-loss-det-train",
)
_MIXER_FAMILIES = {
    "attention": ("cake-gqa-det-train",),
    "gdn": ("cake-causal-conv1d-det-train", "cake-gdn-det-train",
            "cake-rmsnorm-silu-gate-det-train"),
    "kda": ("cake-causal-conv1d-det-train", "cake-kda-det-train",
            "cake-rmsnorm-silu-gate-det-train"),
}


def cake_families(mixer: str, moe: bool = False, mhc: int = 0) -> list[str]:
    """The cake kernel families (distribution names) the cake runs train with, for a token
    ``mixer``: the norms, projections and fused head + loss always; with ``"attention"``
    the attention core; with ``"gdn"`` or
    ``"kda"`` also the short conv, the delta-rule core and the gated output norm; with
    ``moe`` the MoE grouped GEMM; with ``mhc`` streams (> 0) the hyper-connections.

    Raises:
        KeyError: on an unknown mixer.
    """
    return [*_BASE_FAMILIES, *_MIXER_FAMILIES[mixer],
            *(("cake-moe-grouped-det-gemm",) if moe else ()),
            *(("cake-mhc-det-train",) if mhc else ())]


def job_families(cfg: TrainConfig) -> list[str]:
    """The cake kernel families the job's cake runs train with: :func:`cake_families` for
    tinylm, the patch's families for a ``transformers`` model (``--model qwen3-next``)."""
    if cfg.model in HF_MODELS:
        return list(HF_MODELS[cfg.model].families)
    return cake_families(cfg.mixer, bool(cfg.moe_experts), cfg.mhc)


def package_versions() -> dict[str, str | None]:
    """Versions of python, torch, triton, transformers and the cake packages (``None`` if
    not importable).

    Installed distributions are asked first; when running from source (``PYTHONPATH``) the
    module's ``__version__`` is used.
    """
    import triton

    out: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    try:
        out["transformers"] = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        out["transformers"] = None
    for dist, module in _CAKE_PACKAGES.items():
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            try:
                out[dist] = getattr(__import__(module), "__version__", None)
            except ImportError:
                out[dist] = None
    return out


def report_dict(result: JobResult) -> dict[str, object]:
    """The JSON-serialisable content of ``report.json``."""
    return {
        "model": result.config.model,
        "n_params": result.n_params,
        "config": result.config_dict(),
        "device": result.device,
        "device_name": result.device_name,
        "corpus": result.corpus,
        "versions": package_versions(),
        "cake_families": job_families(result.config),
        "identical": result.identical,
        "losses_identical": result.losses_identical,
        "weights_identical": result.weights_identical,
        "max_abs_loss_gap_cake_vs_torch": result.max_gap_torch,
        "seconds_total": result.seconds,
        "runs": {
            r.name: {
                "impl": r.impl,
                "final_train_loss": r.final_train_loss,
                "val_loss": r.val_loss,
                "tokens_per_s": r.tokens_per_s,
                "seconds": r.seconds,
                "cuda_graph": r.cuda_graph,
                "cuda_graph_note": r.cuda_graph_note,
                "losses": r.losses.tolist(),
            }
            for r in result.runs
        },
    }


def format_summary(result: JobResult) -> str:
    """Plain-text summary table (one row per run) plus the verdict lines."""
    header = f"{'run':<8}{'final train loss':>18}{'val loss':>10}{'tokens/s':>12}{'seconds':>10}"
    lines = [header, "-" * len(header)]
    for r in result.runs:
        lines.append(
            f"{r.name:<8}{r.final_train_loss:>18.6f}{r.val_loss:>10.4f}"
            f"{r.tokens_per_s:>12,.0f}{r.seconds:>10.1f}"
        )
    yes = {True: "yes", False: "NO"}
    lines += [
        "",
        f"cake-a vs cake-b losses bitwise identical: {yes[result.losses_identical]}",
        f"cake-a vs cake-b final weights identical:  {yes[result.weights_identical]}",
        f"largest |loss gap| cake-a vs torch:       {result.max_gap_torch:.3e}",
        f"device: {result.device_name}; total {result.seconds:.1f} s",
    ]
    graphed = [r.name for r in result.runs if r.cuda_graph]
    if graphed:  # named: a run whose capture failed ran eagerly (its line below)
        lines.append(f"step captured once in a CUDA graph and replayed per batch "
                     f"(--cuda-graph): {', '.join(graphed)}; their tokens/s include the "
                     f"warm-up and the capture")
    for r in result.runs:
        if r.cuda_graph_note:
            lines.append(f"{r.name}: not captured, eager steps ({r.cuda_graph_note})")
    if result.device == "cpu":
        lines.append("(on the CPU cake's kernels run in Triton's interpreter: its tokens/s "
                     "say nothing of the kernels' speed)")
    spec = HF_MODELS.get(result.config.model)
    if spec is not None:
        lines.append(f"model: {spec.name} (transformers {spec.model_class}, "
                     f"{result.n_params:,} parameters; cake runs patched by "
                     f"cake_transformers.{spec.patch}, the torch run transformers' code)")
    if result.config.mixer != "attention":
        lines.append(f"token mixer: {result.config.mixer}")
    if result.config.moe_experts and spec is None:
        lines.append(f"mlp: mixture of {result.config.moe_experts} experts, "
                     f"top-{result.config.moe_top_k}")
    if result.config.mhc:
        lines.append(f"hyper-connections: {result.config.mhc} residual streams (mHC)")
    lines.append("cake families: " + ", ".join(job_families(result.config)))
    return "\n".join(lines)


def write_report(result: JobResult, out: str | Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``loss.png`` into ``out`` (created if missing).

    Returns:
        ``(json_path, png_path)``.

    Raises:
        OSError: if ``out`` cannot be created or written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "report.json"
    json_path.write_text(json.dumps(report_dict(result), indent=2) + "\n")

    png_path = out / "loss.png"
    fig, (ax, ax_gap) = plt.subplots(1, 2, figsize=(13, 4.5))
    styles = {"cake-a": ("-", 2.5), "cake-b": ("--", 1.5), "torch": (":", 1.5)}
    what = ({"cake": "patched with cake", "torch": "transformers' code"}
            if result.config.model in HF_MODELS else {"cake": "cake modules",
                                                       "torch": "torch modules"})
    for r in result.runs:
        ls, lw = styles.get(r.name, ("-", 1.0))
        ax.plot(
            range(1, r.losses.numel() + 1),
            r.losses.numpy(),
            ls,
            lw=lw,
            label=f"{r.name} ({what[r.impl]}), val {r.val_loss:.3f}",
        )
    cfg = result.config
    mixer = ("" if cfg.mixer == "attention" else f"{cfg.mixer} ") + \
        (f"mHC{cfg.mhc} " if cfg.mhc else "") + \
        (f"E{cfg.moe_experts}k{cfg.moe_top_k} " if cfg.model in HF_MODELS else "")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (nats/byte)")
    ax.set_title(
        f"cake-tinylm{'' if cfg.model == 'tinylm' else ' ' + cfg.model}: "
        f"d{cfg.d_model} L{cfg.n_layers} T{cfg.seq_len} B{cfg.batch_size} "
        f"{mixer}{cfg.dtype} on {result.device}; cake runs identical: {result.identical}",
        fontsize=9,
    )
    ax.legend()
    ax.grid(alpha=0.3)
    # the second panel: |loss difference| per step on a log scale (exact zeros are drawn
    # at the axis floor and named in the legend)
    by_name = {r.name: r.losses.double() for r in result.runs}
    floor = 1e-12
    for (a, b), ls in ((("cake-a", "cake-b"), "-"), (("cake-a", "torch"), ":")):
        if a in by_name and b in by_name:
            n = min(by_name[a].numel(), by_name[b].numel())
            d = (by_name[a][:n] - by_name[b][:n]).abs()
            zero = bool((d == 0).all())
            ax_gap.plot(range(1, n + 1), d.clamp_min(floor).numpy(), ls,
                        label=f"|{a} - {b}|" + (" (exactly 0)" if zero else ""))
    ax_gap.set_yscale("log")
    ax_gap.set_xlabel("step")
    ax_gap.set_ylabel("|train loss difference| (floor 1e-12)")
    ax_gap.set_title("cake-a vs cake-b: 0 when bitwise identical; vs torch: the gap",
                     fontsize=9)
    ax_gap.legend()
    ax_gap.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return json_path, png_path
