"""cake-tinylm: cake's main job, a tiny byte-level decoder LM trained on real text.

The model (:class:`TinyLM`) is a pre-norm decoder built from cake kernels: every RMSNorm is
``cake_rmsnorm_det_train.RMSNorm``, every projection (attention qkv/out, MLP) is
``cake_dense_projection_det_gemm.Linear``, and the output head with its cross entropy is
``cake_lm_head_loss_det_train.LMHeadLoss`` (fused, chunked, logits never materialized).
:func:`run_job` trains it twice from the same initial weights on the same batches, checks
that the two runs are bitwise identical (losses and final weights), and trains the same
model built from torch modules for comparison. With ``mixer="gdn"`` (``--mixer gdn``) every
block's token mixer is cake-gdn-det-train's Gated DeltaNet layer
(``cake_gdn_det_train.GatedDeltaNet``, FLA's layer on cake's kernels); with
``mixer="kda"`` (``--mixer kda``) cake-kda-det-train's Kimi Delta Attention layer
(``cake_kda_det_train.KimiDeltaAttention``). The torch model builds the same layers with
``impl="torch"`` (plain torch, the same parameters).
With ``model="qwen3-next"`` (``--model qwen3-next``) the job trains a small random-init
``transformers`` Qwen3-Next instead, patched by cake-transformers in the cake runs
(:mod:`cake_tinylm.hf`; needs ``pip install ./packages/cake-transformers``).
``cake-tinylm train`` (or ``python -m cake_tinylm train``) runs it from the shell.
"""

from .data import ByteCorpus, batch_starts, get_batch, load_corpus, split_train_val, stdlib_files
from .model import (
    ModelConfig,
    TinyLM,
    build_model,
    make_head,
    make_linear,
    make_mixer,
    make_mlp,
    make_norm,
)
from .report import format_summary, write_report
from .train import CUDA_DEFAULTS, JobResult, RunResult, TrainConfig, default_config, run_job

__version__ = "0.1.0"

__all__ = [
    "CUDA_DEFAULTS",
    "ByteCorpus",
    "JobResult",
    "ModelConfig",
    "RunResult",
    "TinyLM",
    "TrainConfig",
    "__version__",
    "batch_starts",
    "build_model",
    "default_config",
    "format_summary",
    "get_batch",
    "load_corpus",
    "make_head",
    "make_linear",
    "make_mixer",
    "make_mlp",
    "make_norm",
    "run_job",
    "split_train_val",
    "stdlib_files",
    "write_report",
]
