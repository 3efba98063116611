"""Command line: ``cake-tinylm train [options]`` (also ``python -m cake_tinylm train``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from . import __version__

__all__ = ["build_parser", "main"]

# Options whose default depends on the device and the model (TrainConfig defaults on CPU,
# CUDA_DEFAULTS, a transformers model's ModelSpec defaults).
_SIZED = ("steps", "batch_size", "seq_len", "d_model", "n_layers", "n_heads", "lr", "dtype")


def _moe_arg(text: str) -> tuple[int, int]:
    """``--moe E,k`` -> ``(E, k)``."""
    try:
        e, k = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected E,k (two ints), got {text!r}") from None
    if not 1 <= k <= e:
        raise argparse.ArgumentTypeError(f"need 1 <= k <= E, got E={e}, k={k}")
    return e, k


def build_parser() -> argparse.ArgumentParser:
    """The ``cake-tinylm`` argument parser (subcommand ``train``)."""
    from .hf import HF_MODELS, MODELS
    from .model import MIXERS
    from .train import CUDA_DEFAULTS, TrainConfig

    cpu = {f.name: f.default for f in dataclasses.fields(TrainConfig)}

    def sized(name: str) -> str:
        text = f"default: {cpu[name]} on CPU, {CUDA_DEFAULTS.get(name, cpu[name])} on CUDA"
        for spec in HF_MODELS.values():
            c, g = (d.get(name, cpu[name]) for d in (spec.cpu_defaults, spec.cuda_defaults))
            text += f"; --model {spec.name}: {c} / {g}"
        return text

    parser = argparse.ArgumentParser(
        prog="cake-tinylm",
        description="cake's main job: a tiny byte-level decoder LM built from cake kernels.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "train",
        help="train twice with cake (bitwise check) and once with torch (reference)",
        description=(
            "Train the tiny LM (or with --model qwen3-next / qwen3 a small transformers "
            "Qwen3-Next / Qwen3) "
            "twice with cake kernels (RMSNorm, every Linear projection, "
            "fused LM head + cross entropy; with --mixer gdn or kda also the short conv, the "
            "delta-rule core and the gated norm) from the same initial weights and batch order, "
            "check the two runs are bitwise identical (per-step losses and final weights), "
            "and train the same model built from torch modules for comparison. Prints "
            "a summary table, writes report.json and loss.png into --out. Exit code 0 if the "
            "two cake runs are identical, 1 if not, 2 on bad arguments or a missing package."
        ),
    )
    p.add_argument(
        "--model",
        choices=MODELS,
        default=cpu["model"],
        help="tinylm: cake's own model (the options below); qwen3-next: a small random-init "
        "transformers Qwen3NextForCausalLM (Gated DeltaNet and gated attention layers 3:1, "
        "1:1 for 2 layers, MoE with a shared expert; sized by --d-model, --n-layers, "
        "--n-heads, --seq-len, --moe), the cake runs patched by "
        "cake_transformers.apply_cake_kernels_to_qwen3_next, the torch run transformers' own "
        "code; qwen3: a small dense transformers Qwen3ForCausalLM (GQA attention, SwiGLU "
        "MLP; --d-model, --n-layers, --n-heads, --seq-len), patched by "
        "apply_cake_kernels_to_qwen3; both need pip install ./packages/cake-transformers "
        "(default: %(default)s)",
    )
    p.add_argument("--steps", type=int, help=f"optimizer steps per run ({sized('steps')})")
    p.add_argument("--batch-size", type=int, help=f"sequences per step ({sized('batch_size')})")
    p.add_argument("--seq-len", type=int, help=f"bytes per sequence ({sized('seq_len')})")
    p.add_argument("--d-model", type=int, help=f"model width ({sized('d_model')})")
    p.add_argument("--n-layers", type=int, help=f"decoder blocks ({sized('n_layers')})")
    p.add_argument("--n-heads", type=int, help=f"attention heads ({sized('n_heads')})")
    p.add_argument("--lr", type=float, help=f"AdamW learning rate ({sized('lr')})")
    p.add_argument(
        "--mixer",
        choices=MIXERS,
        default=cpu["mixer"],
        help="token mixer of every block: causal self-attention, a Gated DeltaNet layer (gdn: "
        "cake_gdn_det_train.GatedDeltaNet, FLA's layer on cake's kernels) or a Kimi Delta "
        "Attention layer (kda: cake_kda_det_train.KimiDeltaAttention); the torch run builds "
        "the same layer in plain torch (default: %(default)s)",
    )
    p.add_argument(
        "--moe",
        type=_moe_arg,
        default=None,
        metavar="E,k",
        help="replace every block's dense MLP with a mixture of E SwiGLU experts (each "
        "4x d_model wide), top-k softmax routing and a load-balancing loss (0.01): cake's "
        "MoEFeedForward on the det grouped GEMM in the cake runs, a dense masked torch "
        "version in the torch run (default: dense MLP; --model qwen3-next: its experts, "
        "default 4,2 on CPU, 32,4 on CUDA)",
    )
    p.add_argument(
        "--mhc",
        type=int,
        default=cpu["mhc"],
        metavar="N",
        help="widen the residual into N streams (2, 4 or 8) with a manifold-constrained "
        "hyper-connection (DeepSeek mHC; cake-mhc-det-train in the cake runs) around every "
        "mixer and MLP; 0 = the plain residual (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=cpu["seed"], help="seed (default: %(default)s)")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help=f"parameter/activation dtype ({sized('dtype')})",
    )
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default=cpu["device"],
        help="auto = cuda if available (default: %(default)s)",
    )
    p.add_argument(
        "--text",
        default=None,
        help="text file or directory of text files (default: this Python's stdlib sources)",
    )
    p.add_argument(
        "--bytes",
        type=int,
        default=cpu["bytes"],
        help="corpus byte budget; the last 5%% is validation (default: %(default)s)",
    )
    p.add_argument(
        "--cp",
        type=int,
        default=1,
        metavar="N",
        help="context parallelism: with N > 1 (and --mixer gdn or kda) train once in one "
        "process, then twice split over N processes (gloo on CPU, NCCL with one GPU each); "
        "report the loss gap to the single process and whether the CP runs are bitwise "
        "identical, write report_cp.json (default: %(default)s: the usual job)",
    )
    p.add_argument("--cp-layout", choices=("contiguous", "zigzag", "zigzag_per_document"),
                   default="contiguous",
                   help="how tokens are cut over the ranks: contiguous ranges, zigzag (the "
                   "batch in 2N parts, rank r holds parts r and 2N-1-r) or zigzag_per_document "
                   "(every document so) (default: %(default)s)")
    p.add_argument("--cp-exchange", choices=("allgather", "ring"), default="allgather",
                   help="the delta-rule state exchange (default: %(default)s)")
    p.add_argument("--cuda-graph", choices=("auto", "on", "off"), default=cpu["cuda_graph"],
                   help="capture each run's training step once in a CUDA graph and replay it "
                   "per batch (the host issues one replay per step, not every launch); auto = "
                   "on for CUDA, on needs CUDA (default: %(default)s)")
    p.add_argument("--out", default=cpu["out"], help="output directory (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    return parser


def _check_out(out) -> None:
    """Create the output directory before the job (ValueError if it cannot be: a file of
    that name, no permission), so a bad ``--out`` exits 2 up front, not 1 after training."""
    from pathlib import Path

    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # FileExistsError for a file of that name, PermissionError, ...
        raise ValueError(f"--out {out}: cannot create the output directory ({exc})") from exc


def main(argv: list[str] | None = None) -> int:
    """Entry point. Returns the exit code: 0 if the cake runs are bitwise identical, 1 if
    not, 2 on invalid arguments or a missing package (argparse errors also exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)

    from .report import format_summary, write_report
    from .train import default_config, run_job

    overrides = {k: getattr(args, k) for k in _SIZED if getattr(args, k) is not None}
    if args.moe is not None:
        overrides["moe_experts"], overrides["moe_top_k"] = args.moe
    try:
        cfg = default_config(
            args.device,
            model=args.model,
            seed=args.seed,
            mixer=args.mixer,
            mhc=args.mhc,
            text=args.text,
            bytes=args.bytes,
            out=args.out,
            cuda_graph=args.cuda_graph,
            **overrides,
        )
        _check_out(cfg.out)
        if args.cp > 1 and args.model != "tinylm":
            raise ValueError(f"--cp is tinylm's (--mixer gdn or kda), not --model {args.model}'s")
        if args.cp > 1:
            from .cp import CPConfig, run_cp_job, write_cp_report

            cp = CPConfig(args.cp, args.cp_layout, args.cp_exchange)
            cp_result = run_cp_job(cfg, cp, progress=not args.no_progress)
        elif args.cp < 1:
            raise ValueError(f"--cp must be >= 1, got {args.cp}")
        else:
            result = run_job(cfg, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"cake-tinylm: error: {exc}", file=sys.stderr)
        return 2
    if args.cp > 1:
        path = write_cp_report(cp_result, cfg.out)
        print(cp_result.summary())
        print(f"wrote {path}")
        return 0 if cp_result.identical else 1
    json_path, png_path = write_report(result, cfg.out)
    print(format_summary(result))
    print(f"wrote {json_path} and {png_path}")
    return 0 if result.identical else 1


if __name__ == "__main__":
    sys.exit(main())
