"""Qwen3-Next (transformers' ``modeling_qwen3_next``) on cake's deterministic kernels.

Which transformers piece runs on which cake package (the math is transformers'; only the
kernels change):

=================  ==========================================  ===============================
flag               transformers code                           cake
=================  ==========================================  ===============================
rms_norm           ``Qwen3NextRMSNorm`` (``norm(x) * (1+w)``)  ``rmsnorm_det(x, w, offset=1)``
linear_attention   ``torch_chunk_gated_delta_rule``            ``chunk_gated_delta_rule_det``
short_conv         ``causal_conv1d_forward`` (depthwise, SiLU) ``causal_conv1d_det``
gated_norm         ``Qwen3NextRMSNormGated``                   ``rmsnorm_silu_gate_det``
attention          the SDPA / eager call of the attention      ``flash_attn_func`` (causal)
moe                ``Qwen3NextSparseMoeBlock``'s routed experts ``moe_experts_det``
lm_head_loss       ``lm_head`` + ``loss_function`` (labels)    ``lm_head_loss_det``
=================  ==========================================  ===============================

Projections that share an input run as one GEMM over their stacked weights where they are
plain ``nn.Linear`` layers (a subclass, e.g. an adapter, runs as its own module): Gated
DeltaNet's ``in_proj_qkvz`` and ``in_proj_ba``; the attention's ``q_proj``, ``k_proj``,
``v_proj``; the MoE block's shared-expert gate and up projections, its
``shared_expert_gate`` and the router's weight. One GEMM each way instead of one per
projection, and no adds of the input's gradient parts (bits differ from separate GEMMs).

Patched forwards replace ``forward`` only (of the instances, or of the classes); no
parameter, buffer or submodule is added, renamed or moved, so ``state_dict`` keys and
checkpoints stay transformers'. Decoding with a cache runs transformers' own forwards.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cake_transformers._common import (
    causal_attention,
    causal_lm_forward,
    check_attention_call,
    check_attention_config,
    check_flags,
    earlier_pieces,
    install,
    no_packing,
    original,
    stackable,
    stacked_linear,
    with_pieces,
)

__all__ = ["QWEN3_NEXT_PIECES", "apply_cake_kernels_to_qwen3_next"]

#: the keyword flags of :func:`apply_cake_kernels_to_qwen3_next`, one per piece
QWEN3_NEXT_PIECES = ("rms_norm", "linear_attention", "short_conv", "gated_norm", "attention",
                     "moe", "lm_head_loss")

#: the switch of :func:`apply_cake_kernels_to_qwen3_next` that is not a piece: carried in the
#: flag set ``on`` beside the pieces (so a later call keeps it, as it keeps pieces)
KEEP_STATES = "keep_states"


def _hf():
    """transformers' Qwen3-Next modeling module (ValueError where transformers lacks it)."""
    try:
        from transformers.models.qwen3_next import modeling_qwen3_next
    except ImportError as e:  # transformers missing, or a version without Qwen3-Next
        raise ValueError("apply_cake_kernels_to_qwen3_next: needs transformers>=5.25 with "
                         f"Qwen3-Next ({e})") from e
    return modeling_qwen3_next


def _check_config(config, on: frozenset) -> None:
    """Refuse a Qwen3-Next configuration a patched piece cannot serve (before any launch)."""
    act = getattr(config, "hidden_act", None)
    if ("moe" in on or "short_conv" in on) and act not in ("silu", "swish"):
        raise ValueError(f"config.hidden_act: cake's MoE (SwiGLU experts) and short "
                         f"convolution serve 'silu', got {act!r}")
    if "attention" in on and "full_attention" in config.layer_types:
        check_attention_config(config)
    if "moe" in on and getattr(config, "output_router_logits", False):
        raise ValueError("config.output_router_logits: the patched MoE does not return router "
                         "logits (no auxiliary loss yet); set it False or pass moe=False")


# ----------------------------------------------------------------------------- forwards


def _rmsnorm_forward(self, hidden_states):
    from cake_rmsnorm_det_train import rmsnorm_det

    # Qwen3-Next's norm is zero-centred: it scales by (1 + w); the kernels add the 1 in fp32,
    # as transformers does, with no torch op either way
    w = self.weight
    if w.dtype is not torch.float32 and w.dtype is not hidden_states.dtype:
        w = w.float()
    return rmsnorm_det(hidden_states, w, self.eps, offset=1.0)


def _make_gdn_forward(on: frozenset):
    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        if cache is not None:  # decoding with a cache: transformers' own code
            return original(type(self))(self, hidden_states, cache=cache,
                                        attention_mask=attention_mask, **kwargs)
        no_packing(kwargs, "Qwen3NextGatedDeltaNet")
        m = _hf()
        hidden_states = m.apply_mask_to_padding_states(hidden_states, attention_mask)
        B, T = hidden_states.shape[:2]
        if stackable(self.in_proj_qkvz, self.in_proj_ba):  # one GEMM each way for both
            qkvz, ba = stacked_linear(hidden_states, (self.in_proj_qkvz, self.in_proj_ba))
        else:
            qkvz, ba = self.in_proj_qkvz(hidden_states), self.in_proj_ba(hidden_states)
        q, k, v, z, b, a = self.fix_query_key_value_ordering(qkvz, ba)
        mixed = torch.cat([x.reshape(B, T, -1) for x in (q, k, v)], dim=-1)  # [B, T, C]
        w = self.conv1d.weight.squeeze(1)  # [C, W]
        if "short_conv" in on:
            from cake_causal_conv1d_det_train import causal_conv1d_det

            mixed, _ = causal_conv1d_det(mixed, w, self.conv1d.bias, activation=self.activation)
        else:
            mixed = m.causal_conv1d_fn(mixed.transpose(1, 2), w, self.conv1d.bias,
                                       activation=self.activation).transpose(1, 2)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(B, T, -1, self.head_k_dim).contiguous()
        k = k.reshape(B, T, -1, self.head_k_dim).contiguous()
        v = v.reshape(B, T, -1, self.head_v_dim).contiguous()
        if "linear_attention" in on:
            from cake_gdn_det_train import chunk_gated_delta_rule_det

            # keep_states: the entry's own rule plan with keep_states = 1 (FLA's
            # disable_recompute: the chunk states kept for the backward; the same bits)
            kept = {"disable_recompute": True} if KEEP_STATES in on else {}
            # the decay -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b) computed in
            # the kernels (FLA's flags): one launch each way instead of about ten torch ops
            o, _ = chunk_gated_delta_rule_det(q, k, v, g=a, beta=b,
                                              use_qk_l2norm_in_kernel=True,
                                              use_gate_in_kernel=True, A_log=self.A_log,
                                              dt_bias=self.dt_bias,
                                              use_beta_sigmoid_in_kernel=True, **kept)
        else:
            beta = b.sigmoid()
            g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
            o, _ = m.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta,
                                                  use_qk_l2norm_in_kernel=True)
        o = o.reshape(-1, o.shape[-1])
        z = z.reshape(-1, z.shape[-1]).contiguous()
        if "gated_norm" in on:
            from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det

            o = rmsnorm_silu_gate_det(o, z, self.norm.weight, self.norm.variance_epsilon)
        else:
            o = self.norm(o, z)
        return self.out_proj(o.reshape(B, T, -1))
    return with_pieces(forward, on)


def _attention_forward(self, hidden_states, position_embeddings, attention_mask=None,
                       cache=None, **kwargs):
    if cache is not None:  # decoding with a cache: transformers' own code
        return original(type(self))(self, hidden_states, position_embeddings, attention_mask,
                                    cache=cache, **kwargs)
    m = _hf()
    input_shape = hidden_states.shape[:-1]
    check_attention_call(self, attention_mask, input_shape[-1], kwargs, "Qwen3NextAttention")
    hidden_shape = (*input_shape, -1, self.head_dim)
    if stackable(self.q_proj, self.k_proj, self.v_proj):  # one GEMM each way for the three
        qg, k, v = stacked_linear(hidden_states, (self.q_proj, self.k_proj, self.v_proj))
    else:
        qg, k, v = (p(hidden_states) for p in (self.q_proj, self.k_proj, self.v_proj))
    q, gate = torch.chunk(qg.view(*input_shape, -1, self.head_dim * 2), 2, dim=-1)
    gate = gate.reshape(*input_shape, -1)
    q = self.q_norm(q.reshape(hidden_shape))  # [B, S, Hq, D]
    k = self.k_norm(k.view(hidden_shape))
    v = v.view(hidden_shape)
    cos, sin = position_embeddings
    # rotary on [B, S, H, D] (unsqueeze_dim=2): the same elementwise math, and q, k come out
    # in the attention's layout with no copy
    q, k = m.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    out = causal_attention(q, k, v, self.scaling)  # [B, S, Hq, D]
    out = out.reshape(*input_shape, -1) * torch.sigmoid(gate)
    return self.o_proj(out), None


def _moe_forward(self, hidden_states):
    from cake_core.swiglu import silu_mul, swiglu
    from cake_moe_grouped_det_gemm import moe_experts_det

    _check_config(self.shared_expert.config, frozenset({"moe"}))
    B, S, H = hidden_states.shape
    x = hidden_states.reshape(-1, H)
    se = self.shared_expert  # transformers' MLP: down(act(gate(x)) * up(x)), act = silu (checked)
    # the router's logits as transformers computes them (F.linear in the model's dtype)
    lins = (se.gate_proj, se.up_proj, self.shared_expert_gate)
    if stackable(*lins) and lins[0].bias is None:
        # the shared expert's gate and up, its sigmoid gate and the router: one GEMM each way
        h, shared_gate, logits = _stacked_moe_inputs(x, lins, self.gate.weight)
        shared = se.down_proj(swiglu(h))
    else:
        shared = se.down_proj(silu_mul(se.gate_proj(x), se.up_proj(x)))
        shared_gate, logits = self.shared_expert_gate(x), F.linear(x, self.gate.weight)
    # the softmax and top-k (fp32, ties to the lower expert), the SwiGLU experts of the stacked
    # gate_up_proj [E, 2f, H] / down_proj [E, H, f] and the slot-ordered combine: cake's det
    routed = moe_experts_det(x, logits, self.experts.gate_up_proj, self.experts.down_proj,
                             self.gate.top_k, normalize_topk=bool(self.gate.norm_topk_prob))
    shared = torch.sigmoid(shared_gate) * shared
    return (routed + shared).reshape(B, S, H)


def _stacked_moe_inputs(x, lins, router_weight):
    """``(h, shared_gate, logits)``: the shared expert's packed gate/up ``[T, 2f]`` (gate
    first, as :func:`cake_core.swiglu.swiglu` reads it), its sigmoid gate's logit ``[T, 1]``
    and the router's logits ``[T, E]``, from one GEMM."""
    w = torch.cat([m.weight for m in lins] + [router_weight])
    f = lins[0].out_features
    return F.linear(x, w).split([2 * f, 1, router_weight.shape[0]], dim=-1)


def _make_causal_lm_forward(on: frozenset):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, labels=None, use_cache=None, output_router_logits=None,
                logits_to_keep=0, **kwargs):
        want_router = output_router_logits if output_router_logits is not None else \
            self.config.output_router_logits
        if "moe" in on and want_router:
            raise ValueError("output_router_logits: the patched MoE does not return router "
                             "logits (no auxiliary loss yet)")
        from transformers.modeling_outputs import MoeCausalLMOutputWithPast

        args = dict(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids, cache=cache, inputs_embeds=inputs_embeds,
                    labels=labels, use_cache=use_cache, logits_to_keep=logits_to_keep)
        return causal_lm_forward(self, on, MoeCausalLMOutputWithPast, args, kwargs,
                                 original_extra={"output_router_logits": output_router_logits},
                                 model_extra={"output_router_logits": False})
    return with_pieces(forward, on)


# ----------------------------------------------------------------------------- patching


def _forwards(m, on: frozenset) -> dict:
    """class -> the cake forward that replaces its ``forward`` under the flags ``on``."""
    out = {}
    if "rms_norm" in on:
        out[m.Qwen3NextRMSNorm] = _rmsnorm_forward
    if on & {"linear_attention", "short_conv", "gated_norm"}:
        out[m.Qwen3NextGatedDeltaNet] = _make_gdn_forward(on)
    if "attention" in on:
        out[m.Qwen3NextAttention] = _attention_forward
    if "moe" in on:
        out[m.Qwen3NextSparseMoeBlock] = _moe_forward
    if on:
        out[m.Qwen3NextForCausalLM] = _make_causal_lm_forward(on)
    return out


def apply_cake_kernels_to_qwen3_next(model=None, *, rms_norm: bool = True,
                                     linear_attention: bool = True, short_conv: bool = True,
                                     gated_norm: bool = True, attention: bool = True,
                                     moe: bool = True, lm_head_loss: bool = True,
                                     keep_states: bool = False):
    """Run a transformers Qwen3-Next model's training compute on cake's det kernels.

    Two modes (as Liger-Kernel's ``apply_liger_kernel_to_*``):

    * ``model`` given (a ``Qwen3NextForCausalLM`` or ``Qwen3NextModel``): the ``forward``
      of each of its matching modules is replaced in place; the model is returned.
    * ``model=None``: transformers' Qwen3-Next classes get the cake forwards, so every model
      built (or loaded) afterwards, and every existing one, uses them; returns None (a model
      patched earlier in model mode keeps its own forwards: patch it again to change them).
      The configuration checks then run when a patched module first runs, before any
      launch.

    Each flag turns one piece on (module table of :mod:`cake_transformers.qwen3_next`).
    ``lm_head_loss``: with ``labels`` the loss comes from the fused LM head + cross entropy
    and the output's ``logits`` is None (never materialised); without labels the logits
    are transformers'. ``moe``: the router's softmax and top-k and the routed experts are
    cake's; the router's projection (``F.linear``, as transformers), the shared expert and
    its gate stay torch; router logits (the auxiliary loss) are not returned.
    Parameters, buffers and ``state_dict`` keys do not change. Patching twice
    (or a patched model again) changes nothing more. A patched ``Qwen3NextForCausalLM``
    builds no cache when given ``labels`` or in train mode (``use_cache=False`` unless
    passed True); with a cache (generation), or a piece switched off, transformers' code
    runs. A bare ``Qwen3NextModel`` needs ``use_cache=False`` passed for training.

    ``keep_states`` (default False; a switch of the ``linear_attention`` piece, not a piece
    itself): True runs cake's Gated DeltaNet core with the plan it would pick itself for the
    call (``make_plan`` with ``state_programs`` = sequences x value heads) and ``keep_states
    = 1`` (the core's ``disable_recompute=True``), as
    ``cake_gdn_det_train.GatedDeltaNet(keep_states=True)``: the forward keeps the chunk
    states for the backward, which then skips their recompute: less time for more memory
    (``cake_gdn_det_train.saved_bytes`` counts it). Eagerly the same bits as False (loss,
    logits and every gradient); under ``torch.compile`` the patched Gated DeltaNet forward
    traces as one graph, as with False (it builds no plan itself).

    A second call (on the same model, or on the classes again) adds the pieces it turns on
    and keeps those of earlier calls; ``keep_states`` likewise: once a call turned it on, a
    later call's ``keep_states=False`` (the default) does not turn it off, and a later
    ``keep_states=True`` turns it on for a model patched without it.

    Raises:
        ValueError: a flag that is not a bool (``keep_states`` too); ``keep_states=True``
            where ``linear_attention`` is off both in this call and in the earlier calls on
            the same target (this model's patched modules and the classes, or the
            classes; it would have no effect); ``model`` not a Qwen3-Next model; a
            configuration a piece does not serve: ``head_dim`` outside (64, 128, 256)
            (``attention``), ``hidden_act`` not SiLU (``moe``, ``short_conv``),
            ``attention_dropout`` > 0, ``output_router_logits`` (``moe``); transformers
            without Qwen3-Next. At call time: packed sequences (``cu_seq_lens_q``, or
            ``position_ids`` that restart), a padding attention mask or
            ``output_attentions`` (the causal-LM forward refuses them before any launch; a
            bare ``Qwen3NextModel`` a padding mask at its first attention layer).
    """
    on = check_flags({"rms_norm": rms_norm, "linear_attention": linear_attention,
                      "short_conv": short_conv, "gated_norm": gated_norm,
                      "attention": attention, "moe": moe, "lm_head_loss": lm_head_loss,
                      KEEP_STATES: keep_states})
    m = _hf()
    # an earlier call's pieces (and keep_states) stay on (its Gated DeltaNet and causal-LM
    # forwards, built for its flags, are replaced below)
    on |= earlier_pieces(model, (m.Qwen3NextGatedDeltaNet, m.Qwen3NextForCausalLM))
    if KEEP_STATES in on and "linear_attention" not in on:  # before anything is patched
        raise ValueError("keep_states: True serves cake's Gated DeltaNet core only, and the "
                         "linear_attention piece is off (in this call and in the earlier "
                         "calls on this model or the classes); pass linear_attention=True "
                         "or keep_states=False")
    return install(model, _forwards(m, on), (m.Qwen3NextForCausalLM, m.Qwen3NextModel),
                   _check_config, on)
