"""Hugging Face ``transformers`` models for the main job (``--model qwen3-next``).

The job trains a ``transformers`` causal LM as it trains :class:`~cake_tinylm.model.TinyLM`:
the same initial weights (random, from the job's seed) go into two models patched by
cake-transformers (``apply_cake_kernels_to_<arch>(model)``, in place: the compute runs on
cake's det kernels, the parameters and ``state_dict`` keys stay transformers') and into one
unpatched model (transformers' own torch code); the three train on the same batches.

Each model is a :class:`ModelSpec` in :data:`HF_MODELS`: a config builder (``TrainConfig`` ->
a ``transformers`` config), the ``transformers`` class, the cake-transformers patch function,
the cake families the patch runs on, and the job defaults on CPU and on CUDA. Adding an
architecture is one more entry.

Needs the ``transformers`` extra: ``pip install ./packages/cake-transformers`` (it pulls
``transformers``), or ``pip install 'cake-tinylm[transformers]'``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from .train import TrainConfig

__all__ = [
    "HF_MODELS",
    "MODELS",
    "HFCausalLM",
    "ModelSpec",
    "build_hf_model",
    "hf_config",
    "qwen3_config",
    "qwen3_next_config",
    "require_hf",
]

#: the byte vocabulary of every model of the job
VOCAB = 256

_INSTALL_HINT = (
    "pip install ./packages/cake-transformers (from the cake repository; it pulls "
    "transformers>=5.25), or pip install 'cake-tinylm[transformers]'"
)


@dataclass(frozen=True)
class ModelSpec:
    """One ``transformers`` architecture the job can train.

    Attributes:
        name: the ``--model`` value.
        build_config: ``TrainConfig -> transformers config`` (reads ``d_model``,
            ``n_layers``, ``n_heads``, ``seq_len``, ``moe_experts`` / ``moe_top_k``).
        model_class: name of the causal-LM class in ``transformers``.
        patch: name of the function in ``cake_transformers`` that patches a model in place.
        families: the cake kernel families (distribution names) the patched model runs on.
        cpu_defaults, cuda_defaults: :class:`~cake_tinylm.train.TrainConfig` field values for
            this model on CPU and on CUDA (over the TinyLM defaults; the user's options win).
    """

    name: str
    build_config: Callable[[TrainConfig], Any]
    model_class: str
    patch: str
    families: tuple[str, ...]
    cpu_defaults: dict[str, object] = field(default_factory=dict)
    cuda_defaults: dict[str, object] = field(default_factory=dict)


def _import(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{what} needs cake-transformers and transformers ({e}): "
                          f"{_INSTALL_HINT}") from e


def require_hf(spec: ModelSpec) -> None:
    """Import transformers and cake-transformers, or raise ``ImportError`` naming the
    install command."""
    _import("transformers", f"--model {spec.name}")
    _import("cake_transformers", f"--model {spec.name}")


def _check_sizes(cfg: TrainConfig) -> None:
    """Sizes every transformers model of the job needs: a head, a width, a layer, and windows
    of at least 2 tokens (transformers' loss scores ``T - 1`` predictions per window)."""
    for name, v, low in (("--n-heads", cfg.n_heads, 1), ("--d-model", cfg.d_model, 1),
                         ("--n-layers", cfg.n_layers, 1), ("--seq-len", cfg.seq_len, 2)):
        if v < low:
            raise ValueError(f"--model {cfg.model}: {name} must be >= {low}, got {v}")


def qwen3_next_config(cfg: TrainConfig):
    """A small random-init ``transformers.Qwen3NextConfig`` for the job.

    Byte vocabulary (256), ``hidden_size = d_model``, ``num_hidden_layers = n_layers``. Layer
    types as Qwen3-Next: every 4th layer full (gated) attention, the others Gated DeltaNet
    (3 linear : 1 full); with fewer than 4 layers the last one is the full attention layer
    (2 layers: 1 : 1). Full attention: ``n_heads`` query heads of 64, ``max(1, n_heads // 4)``
    key/value heads. Gated DeltaNet: ``n_heads`` value heads and ``max(1, n_heads // 2)`` key
    heads, key and value head dim 64, short conv of 4. Every layer's MLP is a sparse MoE of
    ``moe_experts`` SwiGLU experts (``moe_intermediate_size = max(32, d_model // 16)``),
    top-``moe_top_k`` routing (normalised), plus a shared expert of ``d_model // 2`` with its
    sigmoid gate. SiLU, no attention dropout, no router logits (no auxiliary loss), untied
    LM head, ``max_position_embeddings = seq_len``, no cache.

    Raises:
        ImportError: transformers (or its Qwen3-Next) missing.
        ValueError: fewer than 2 layers; ``moe_experts`` / ``moe_top_k`` not set (``1 <= k <= E``);
            no head, width or layer, or windows under 2 tokens.
    """
    _check_sizes(cfg)
    if cfg.n_layers < 2:
        raise ValueError(f"--model qwen3-next needs at least 2 layers (one Gated DeltaNet, one "
                         f"attention), got --n-layers {cfg.n_layers}")
    if not 1 <= cfg.moe_top_k <= cfg.moe_experts:
        raise ValueError(f"--model qwen3-next needs experts: --moe E,k with 1 <= k <= E, got "
                         f"E={cfg.moe_experts}, k={cfg.moe_top_k}")
    transformers = _import("transformers", "--model qwen3-next")
    n, heads, d = cfg.n_layers, cfg.n_heads, cfg.d_model
    every = 4 if n >= 4 else n
    layer_types = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                   for i in range(n)]
    return transformers.Qwen3NextConfig(
        vocab_size=VOCAB,
        hidden_size=d,
        intermediate_size=4 * d,  # unused: every layer's MLP is the MoE
        num_hidden_layers=n,
        layer_types=layer_types,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=64,
        linear_num_key_heads=max(1, heads // 2),
        linear_num_value_heads=heads,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        num_experts=cfg.moe_experts,
        num_experts_per_tok=cfg.moe_top_k,
        moe_intermediate_size=max(32, d // 16),
        shared_expert_intermediate_size=d // 2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        hidden_act="silu",
        output_router_logits=False,
        attention_dropout=0.0,
        max_position_embeddings=cfg.seq_len,
        tie_word_embeddings=False,
        use_cache=False,
    )


def qwen3_config(cfg: TrainConfig):
    """A small random-init ``transformers.Qwen3Config`` (dense Qwen3) for the job.

    Byte vocabulary (256), ``hidden_size = d_model``, ``num_hidden_layers = n_layers``, every
    layer full causal attention: ``n_heads`` query heads of 64, ``max(1, n_heads // 4)``
    key/value heads (GQA), q/k RMSNorm per head; a SwiGLU MLP of ``3 * d_model``; no sliding
    window, no attention dropout, untied LM head, ``max_position_embeddings = seq_len``, no
    cache.

    Raises:
        ImportError: transformers missing.
        ValueError: experts requested (``--moe``: Qwen3 is dense); no head, width or layer,
            or windows under 2 tokens.
    """
    _check_sizes(cfg)
    if cfg.moe_experts:
        raise ValueError("--model qwen3 is dense: drop --moe (or use --model qwen3-next)")
    transformers = _import("transformers", "--model qwen3")
    heads, d = cfg.n_heads, cfg.d_model
    return transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=d,
        intermediate_size=3 * d,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=64,
        hidden_act="silu",
        attention_dropout=0.0,
        use_sliding_window=False,
        max_position_embeddings=cfg.seq_len,
        tie_word_embeddings=False,
        use_cache=False,
    )


#: the ``transformers`` models of ``--model`` (``tinylm``, cake's own model, is not one)
HF_MODELS: dict[str, ModelSpec] = {
    "qwen3-next": ModelSpec(
        name="qwen3-next",
        build_config=qwen3_next_config,
        model_class="Qwen3NextForCausalLM",
        patch="apply_cake_kernels_to_qwen3_next",
        families=(
            "cake-rmsnorm-det-train",
            "cake-causal-conv1d-det-train",
            "cake-gdn-det-train",
            "cake-rmsnorm-silu-gate-det-train",
            "cake-gqa-det-train",
            "cake-moe-grouped-det-gemm",
            "cake-lm-head-loss-det-train",
        ),
        # a cake step costs a few seconds of interpreted launches on the CPU: few steps
        # (a short warm-up), 4 x 32 tokens, one validation forward
        cpu_defaults=dict(steps=12, warmup=4, batch_size=4, seq_len=32, d_model=128,
                          n_layers=2, n_heads=2, lr=2e-3, moe_experts=4, moe_top_k=2,
                          val_windows=16),
        # about 100M parameters: 6 Gated DeltaNet + 2 attention layers, 32 experts top-4
        cuda_defaults=dict(steps=200, batch_size=8, seq_len=4096, d_model=1024, n_layers=8,
                           n_heads=16, lr=6e-4, moe_experts=32, moe_top_k=4,
                           dtype="bfloat16"),
    ),
    "qwen3": ModelSpec(
        name="qwen3",
        build_config=qwen3_config,
        model_class="Qwen3ForCausalLM",
        patch="apply_cake_kernels_to_qwen3",
        families=(
            "cake-rmsnorm-det-train",
            "cake-gqa-det-train",
            "cake-dense-projection-det-gemm",
            "cake-lm-head-loss-det-train",
        ),
        cpu_defaults=dict(steps=16, warmup=4, batch_size=4, seq_len=32, d_model=128,
                          n_layers=2, n_heads=2, lr=2e-3, val_windows=16),
        # about 100M parameters: 8 layers of width 1024, 16 query / 4 key-value heads
        cuda_defaults=dict(steps=200, batch_size=8, seq_len=4096, d_model=1024, n_layers=8,
                           n_heads=16, lr=6e-4, dtype="bfloat16"),
    ),
}

#: the ``--model`` choices
MODELS: tuple[str, ...] = ("tinylm", *HF_MODELS)


def hf_config(cfg: TrainConfig):
    """The ``transformers`` config of ``cfg.model`` (raises ``KeyError`` for ``tinylm``)."""
    return HF_MODELS[cfg.model].build_config(cfg)


class HFCausalLM(nn.Module):
    """A ``transformers`` causal LM behind the job's model interface.

    ``forward(idx, targets)`` returns ``(None, loss)``: transformers' causal-LM loss with
    ``labels = idx`` (transformers and the cake patch shift the labels: position ``t``
    predicts ``idx[:, t + 1]``, ``T - 1`` predictions per window). ``targets`` (``idx``
    shifted by one, from :func:`~cake_tinylm.data.get_batch`) is accepted for the job's
    loop and must be given; the last target byte of each window is not scored.

    Attributes:
        lm: the ``transformers`` model (patched in place when ``impl == "cake"``).
        impl: ``"cake"`` or ``"torch"``.
    """

    def __init__(self, lm: nn.Module, impl: str) -> None:
        super().__init__()
        self.lm, self.impl = lm, impl

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        if targets is None:
            raise ValueError("HFCausalLM: the job scores a loss; pass targets")
        return None, self.lm(input_ids=idx, labels=idx).loss


def build_hf_model(config, spec: ModelSpec, impl: str, *, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32) -> HFCausalLM:
    """Build ``spec``'s ``transformers`` model from ``config`` (initialised from the current
    torch RNG state) on ``device`` in ``dtype``; with ``impl="cake"`` patch it in place with
    cake-transformers' ``spec.patch``.

    Raises:
        ValueError: on an unknown ``impl``, or a config the patch refuses.
        ImportError: cake-transformers or transformers missing.
    """
    if impl not in ("cake", "torch"):
        raise ValueError(f"impl must be 'cake' or 'torch', got {impl!r}")
    transformers = _import("transformers", f"--model {spec.name}")
    lm = getattr(transformers, spec.model_class)(config).to(device=device, dtype=dtype)
    if impl == "cake":
        getattr(_import("cake_transformers", f"--model {spec.name}"), spec.patch)(lm)
    return HFCausalLM(lm, impl)
