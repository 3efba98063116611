"""Dense decoders (transformers' ``modeling_qwen3`` and ``modeling_llama``) on cake's
deterministic kernels.

Which transformers piece runs on which cake package (the math is transformers'; only the
kernels change):

============  ===============================================  ==============================
flag          transformers code                                cake
============  ===============================================  ==============================
rms_norm      ``Qwen3RMSNorm`` / ``LlamaRMSNorm``               ``rmsnorm_det(x, w)``
              (``norm(x) * w``; Qwen3's per-head q/k norms too)
attention     the SDPA / eager call of the attention           ``flash_attn_func`` (causal)
mlp           ``Qwen3MLP`` / ``LlamaMLP``: gate/up/down        ``dense_projection_det``
              projections of the SwiGLU                        (gate and up stacked in one),
                                                               ``swiglu`` (cake-core)
lm_head_loss  ``lm_head`` + ``loss_function`` (labels)         ``lm_head_loss_det``
============  ===============================================  ==============================

The attention's q, k, v projections (and the MLP's gate and up) share their input: where
they are plain ``nn.Linear`` layers they run as one GEMM over their stacked weights (one
GEMM each way, no adds of the input's gradient parts); a subclass (an adapter) runs as its
own module.

Patched forwards replace ``forward`` only (of the instances, or of the classes); the MLP's
projections keep their ``nn.Linear`` parameters, no parameter, buffer or submodule is added,
renamed or moved, so ``state_dict`` keys and checkpoints stay transformers'. Decoding with a
cache runs transformers' own forwards.
"""

from __future__ import annotations

import torch

from cake_transformers._common import (
    autocast_dtype,
    causal_attention,
    causal_lm_forward,
    check_attention_call,
    check_attention_config,
    check_flags,
    check_silu,
    earlier_pieces,
    install,
    original,
    stackable,
    stacked_linear,
    with_pieces,
)

__all__ = ["DENSE_PIECES", "apply_cake_kernels_to_llama", "apply_cake_kernels_to_qwen3"]

#: the keyword flags of :func:`apply_cake_kernels_to_qwen3` and
#: :func:`apply_cake_kernels_to_llama`, one per piece
DENSE_PIECES = ("rms_norm", "attention", "mlp", "lm_head_loss")


class _Arch:
    """One dense architecture: its transformers module and class names."""

    def __init__(self, name: str, module: str, prefix: str, fn: str):
        self.name, self.module, self.prefix, self.fn = name, module, prefix, fn

    def hf(self):
        """transformers' modeling module (ValueError where transformers lacks it)."""
        import importlib

        try:
            return importlib.import_module(f"transformers.models.{self.module}")
        except ImportError as e:  # transformers missing, or too old
            raise ValueError(f"{self.fn}: needs transformers>=5.25 with {self.name} ({e})") \
                from e

    def cls(self, m, suffix: str):
        return getattr(m, self.prefix + suffix)


_QWEN3 = _Arch("Qwen3", "qwen3.modeling_qwen3", "Qwen3", "apply_cake_kernels_to_qwen3")
_LLAMA = _Arch("Llama", "llama.modeling_llama", "Llama", "apply_cake_kernels_to_llama")


def _check_config(config, on: frozenset) -> None:
    """Refuse a configuration a patched piece cannot serve (before any launch)."""
    if "mlp" in on:
        check_silu(config, "MLP (SwiGLU)")
    if "attention" in on:
        check_attention_config(config)
        if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
            raise ValueError("config.layer_types: cake's attention serves full causal "
                             "attention; sliding-window layers are not served yet (set "
                             "use_sliding_window=False, or pass attention=False)")


# ----------------------------------------------------------------------------- forwards


def _rmsnorm_forward(self, hidden_states):
    from cake_rmsnorm_det_train import rmsnorm_det

    # plain RMSNorm (T5's): norm(x) * w, w as stored
    return rmsnorm_det(hidden_states, self.weight, self.variance_epsilon)


def _make_attention_forward(arch: _Arch, m):
    where = arch.prefix + "Attention"

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None,
                **kwargs):
        if cache is not None:  # decoding with a cache: transformers' own code
            return original(type(self))(self, hidden_states, position_embeddings,
                                        attention_mask, cache=cache, **kwargs)
        if getattr(self, "sliding_window", None) is not None:
            raise ValueError(f"{where}: sliding-window attention is not served by cake's "
                             "attention yet (pass attention=False)")
        input_shape = hidden_states.shape[:-1]
        check_attention_call(self, attention_mask, input_shape[-1], kwargs, where)
        hidden_shape = (*input_shape, -1, self.head_dim)
        projs = (self.q_proj, self.k_proj, self.v_proj)
        if stackable(*projs):  # one GEMM each way for the three
            q, k, v = stacked_linear(hidden_states, projs)
        else:
            q, k, v = (p(hidden_states) for p in projs)
        q, k, v = q.view(hidden_shape), k.view(hidden_shape), v.view(hidden_shape)
        if hasattr(self, "q_norm"):  # Qwen3: an RMSNorm over each head's dim, before rotary
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = position_embeddings
        # rotary on [B, S, H, D] (transformers' unsqueeze_dim=2): the same elementwise math,
        # and q, k come out in the attention's layout with no copy
        q, k = m.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
        out = causal_attention(q, k, v, self.scaling)  # [B, S, Hq, D]
        return self.o_proj(out.reshape(*input_shape, -1)), None
    return forward


def _linear(lin, x):
    """``lin(x)``: on cake-dense-projection-det-gemm with the module's own parameters for a
    plain ``nn.Linear``; any other module (a subclass or wrapper, e.g. an adapter) runs its
    own forward, which may be more than ``F.linear`` of its weight."""
    if type(lin) is not torch.nn.Linear:
        return lin(x)
    return _project(x, lin.weight, lin.bias)


def _project(x, w, b):
    """``F.linear(x, w, b)`` on cake-dense-projection-det-gemm."""
    from cake_dense_projection_det_gemm import dense_projection_det

    dt = autocast_dtype(x) or x.dtype  # autocast: its dtype, as F.linear would run in
    x, w = x.to(dt), w.to(dt)  # no copy when already dt; autograd flows through a cast
    b = None if b is None else b.to(dt)
    return dense_projection_det(x, w, b)


def _mlp_forward(self, x):
    check_silu(self.config, "MLP (SwiGLU)")
    from cake_core.swiglu import silu_mul, swiglu

    # down(silu(gate(x)) * up(x)): the GEMMs det, the gate one elementwise launch each way;
    # gate and up stacked into one GEMM (packed [..., 2f], gate first, as swiglu reads it)
    # where both are plain Linear layers
    g, u = self.gate_proj, self.up_proj
    if stackable(g, u):
        w = torch.cat([g.weight, u.weight])
        b = None if g.bias is None else torch.cat([g.bias, u.bias])
        return _linear(self.down_proj, swiglu(_project(x, w, b)))
    return _linear(self.down_proj, silu_mul(_linear(g, x), _linear(u, x)))


def _make_causal_lm_forward(on: frozenset):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        args = dict(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids, cache=cache, inputs_embeds=inputs_embeds,
                    labels=labels, use_cache=use_cache, logits_to_keep=logits_to_keep)
        return causal_lm_forward(self, on, CausalLMOutputWithPast, args, kwargs)
    return with_pieces(forward, on)


# ----------------------------------------------------------------------------- patching


def _apply(arch: _Arch, model, flags: dict):
    on = check_flags(flags)
    m = arch.hf()
    # an earlier call's pieces stay on (its causal-LM forward is replaced below)
    on |= earlier_pieces(model, (arch.cls(m, "ForCausalLM"),))
    forwards = {}
    if "rms_norm" in on:
        forwards[arch.cls(m, "RMSNorm")] = _rmsnorm_forward
    if "attention" in on:
        forwards[arch.cls(m, "Attention")] = _make_attention_forward(arch, m)
    if "mlp" in on:
        forwards[arch.cls(m, "MLP")] = _mlp_forward
    if on:
        forwards[arch.cls(m, "ForCausalLM")] = _make_causal_lm_forward(on)
    expected = (arch.cls(m, "ForCausalLM"), arch.cls(m, "Model"))
    return install(model, forwards, expected, _check_config, on)


_DOC = """Run a transformers {name} model's training compute on cake's det kernels.

    Two modes (as Liger-Kernel's ``apply_liger_kernel_to_*``):

    * ``model`` given (a ``{name}ForCausalLM`` or ``{name}Model``): the ``forward`` of each
      of its matching modules is replaced in place; the model is returned.
    * ``model=None``: transformers' {name} classes get the cake forwards, so every model
      built (or loaded) afterwards, and every existing one, uses them; returns None. The
      configuration checks then run when a patched module first runs, before any launch.

    Each flag turns one piece on (module table of :mod:`cake_transformers.dense`).
    ``lm_head_loss``: with ``labels`` the loss comes from the fused LM head + cross entropy
    and the output's ``logits`` is None (never materialised); without labels the logits
    are transformers'. ``mlp``: the gate, up and down projections run on
    cake-dense-projection-det-gemm with the modules' own weights (and biases, with
    ``mlp_bias``) in the input's dtype, or autocast's (weights are cast, as ``F.linear``);
    a projection that is not a plain ``nn.Linear`` (an adapter) runs its own forward.
    Parameters, buffers and ``state_dict`` keys do not change. Patching twice (or a
    patched model again) changes nothing more. A patched ``{name}ForCausalLM`` builds no
    cache when given ``labels`` or in train mode (``use_cache=False`` unless passed True);
    with a cache (generation), or a piece switched off, transformers' code runs. A bare
    ``{name}Model`` needs ``use_cache=False`` passed for training.

    Raises:
        ValueError: a flag that is not a bool; ``model`` not a {name} model; a
            configuration a piece does not serve: ``head_dim`` outside (64, 128, 256),
            ``attention_dropout`` > 0, sliding-window layers (``attention``);
            ``hidden_act`` not SiLU (``mlp``); transformers without {name}. At call time:
            packed sequences (``cu_seq_lens_q``, or ``position_ids`` that restart), a
            padding attention mask or ``output_attentions`` (the causal-LM forward refuses
            them before any launch; a bare ``{name}Model`` a padding mask at its first
            attention layer).
    """


def apply_cake_kernels_to_qwen3(model=None, *, rms_norm: bool = True, attention: bool = True,
                                mlp: bool = True, lm_head_loss: bool = True):
    return _apply(_QWEN3, model, {"rms_norm": rms_norm, "attention": attention, "mlp": mlp,
                                  "lm_head_loss": lm_head_loss})


def apply_cake_kernels_to_llama(model=None, *, rms_norm: bool = True, attention: bool = True,
                                mlp: bool = True, lm_head_loss: bool = True):
    return _apply(_LLAMA, model, {"rms_norm": rms_norm, "attention": attention, "mlp": mlp,
                                  "lm_head_loss": lm_head_loss})


apply_cake_kernels_to_qwen3.__doc__ = _DOC.format(name="Qwen3")
apply_cake_kernels_to_llama.__doc__ = _DOC.format(name="Llama")
