"""What the model patches of cake-transformers share (private): flag and configuration
checks, the attention-mask judge, the causal attention call, the fused LM head + loss
forward of a ``*ForCausalLM``, and installing forwards on classes or on a model's modules.
"""

from __future__ import annotations

import dataclasses
import types
import weakref

import torch
import torch.nn.functional as F

#: head dims cake-gqa-det-train serves (its HEAD_DIMS; repeated to check without importing
#: Triton at patch time)
GQA_HEAD_DIMS = (64, 128, 256)

#: hidden_act values that are SiLU in transformers' ACT2FN (what cake's SwiGLU pieces serve)
SILU_ACTS = ("silu", "swish")

#: marks a function of this package installed as a forward (patching twice is a no-op)
TAG = "_cake_transformers_piece"

#: on a forward built for one call's flags (the causal-LM forward, Qwen3-Next's Gated
#: DeltaNet): the pieces that call turned on
PIECES = "_cake_transformers_pieces"


def with_pieces(fn, on: frozenset):
    """``fn``, marked as built for the pieces ``on`` (read back by :func:`earlier_pieces`)."""
    setattr(fn, PIECES, on)
    return fn


def earlier_pieces(model, classes) -> frozenset:
    """The pieces earlier calls patched: read from the flag-dependent forwards installed on
    ``classes`` and (a model given) on ``model``'s modules. A later call keeps them on, so
    that it adds pieces but never undoes one (its forwards replace the earlier ones)."""
    fns = [c.__dict__.get("forward") for c in classes]
    if isinstance(model, torch.nn.Module):
        fns += [getattr(f, "__func__", f) for f in
                (mod.__dict__.get("forward") for mod in model.modules())]
    return frozenset().union(*(getattr(f, PIECES, ()) for f in fns))


def check_flags(flags: dict) -> frozenset:
    """The names of the flags that are on; ValueError for a flag that is not a bool."""
    for name, v in flags.items():
        if not isinstance(v, bool):
            raise ValueError(f"{name}: expected a bool, got {v!r}")
    return frozenset(k for k, v in flags.items() if v)


def original(cls):
    """The class's own transformers forward, also after the class was patched."""
    return getattr(cls, "_cake_original_forward", cls.forward)


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def check_attention_config(config) -> None:
    """Refuse an attention configuration cake-gqa-det-train does not serve."""
    hd = head_dim(config)
    if hd not in GQA_HEAD_DIMS:
        raise ValueError(f"config.head_dim: cake-gqa-det-train serves head dims "
                         f"{GQA_HEAD_DIMS}, got {hd}")
    if getattr(config, "attention_dropout", 0.0):
        raise ValueError("config.attention_dropout: cake's attention has no dropout, got "
                         f"{config.attention_dropout}")


def check_silu(config, what: str) -> None:
    act = getattr(config, "hidden_act", None)
    if act not in SILU_ACTS:
        raise ValueError(f"config.hidden_act: cake's {what} serves 'silu', got {act!r}")


def no_packing(kwargs, where: str) -> None:
    if kwargs.get("cu_seq_lens_q") is not None:
        raise ValueError(f"{where}: packed sequences (cu_seq_lens_q) are not served by the "
                         "cake patch yet; pass a [B, T] batch")


#: the last mask judged eagerly by :func:`is_plain_causal`: (weak reference, version, q_len,
#: k_len, verdict); every attention layer of one forward gets the same mask tensor, so one
#: host sync per forward instead of one per layer
_LAST_MASK: list = [None]


def _capturing(t: torch.Tensor) -> bool:
    """Whether ``t`` is a CUDA tensor and a CUDA graph is being captured on the current
    stream (a CPU-only torch raises on the capture query: not asked for CPU tensors)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def holds(cond: torch.Tensor, msg: str) -> bool:
    """``bool(cond)`` for a one-element bool tensor; while a CUDA graph is being captured
    (where a host read is not allowed) a device-side assertion instead, and True. A replay
    where ``cond`` is false then trips the assertion: a sticky CUDA error ("device-side
    assert triggered") that the next sync raises and that leaves the process's CUDA context
    unusable (no ValueError to catch). transformers itself skips its mask checks under
    capture; this keeps cake's refusals without a host sync there."""
    if _capturing(cond):
        torch._assert_async(cond, msg)
        return True
    return bool(cond)


def is_plain_causal(mask: torch.Tensor, q_len: int, k_len: int) -> bool:
    """Whether a 4-D transformers mask lets each query see exactly the keys up to its own
    position (bool: True = seen; float: 0 = seen). One host sync per mask tensor (none
    under CUDA-graph capture: :func:`holds`)."""
    if mask.dim() != 4 or mask.shape[-2:] != (q_len, k_len):
        return False
    if _capturing(mask):
        # every layer of every captured graph asserts on the device itself (nothing kept: an
        # eager verdict does not hold for a graph's replays, nor a capture's unchecked True
        # for an eager call or another graph)
        seen = mask if mask.dtype == torch.bool else mask == 0
        causal = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).tril(
            k_len - q_len)
        return holds((seen == causal).all(), "cake's attention serves the causal mask only")
    last = _LAST_MASK[0]
    key = (mask._version, q_len, k_len)
    if last is not None and last[0]() is mask and last[1:4] == key:
        return last[4]
    seen = mask if mask.dtype == torch.bool else mask == 0
    causal = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).tril(k_len - q_len)
    verdict = holds((seen == causal).all(), "cake's attention serves the causal mask only")
    _LAST_MASK[0] = (weakref.ref(mask), *key, verdict)
    return verdict


def check_attention_call(module, attention_mask, seq_len: int, kwargs, where: str) -> None:
    """What a patched attention layer checks before its launch (ValueError)."""
    check_attention_config(module.config)
    no_packing(kwargs, where)
    if attention_mask is not None and not is_plain_causal(attention_mask, seq_len, seq_len):
        raise ValueError(f"{where}: cake's attention serves the causal mask only; a padding "
                         "mask is not served yet, nor packed sequences (position_ids that "
                         "restart give a block-diagonal mask): drop it, or pass "
                         "attention=False")


def stackable(*mods) -> bool:
    """Whether these modules are plain ``nn.Linear`` layers (no subclass or adapter, e.g. a
    PEFT LoRA layer, whose forward is more than ``F.linear``) with biases all present or
    all absent: then :func:`stacked_linear` computes their outputs in one GEMM."""
    return all(type(m) is torch.nn.Linear for m in mods) and \
        len({m.bias is None for m in mods}) == 1


def stacked_linear(x: torch.Tensor, mods) -> tuple:
    """``tuple(m(x) for m in mods)`` from one ``F.linear`` over the stacked weights (and
    biases): one GEMM each way instead of one per layer, and no adds of the input's
    gradient contributions. The outputs are column slices of one tensor (views); the
    weights' gradients are row slices of one gradient. ``mods`` must pass
    :func:`stackable`."""
    bias = None if mods[0].bias is None else torch.cat([m.bias for m in mods])
    out = F.linear(x, torch.cat([m.weight for m in mods]), bias)
    return out.split([m.out_features for m in mods], dim=-1)


def autocast_dtype(t: torch.Tensor):
    """The dtype autocast runs matmuls in on ``t``'s device, or None outside autocast."""
    dev = t.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None


def causal_attention(q, k, v, scaling: float):
    """Causal attention on cake-gqa-det-train: q ``[B, S, Hq, D]``, k and v ``[B, S, Hkv, D]``
    (flash-attn's layout: the patched forwards apply rotary with ``unsqueeze_dim=2``, so no
    head-first copy is made) -> ``[B, S, Hq, D]``. Under autocast q, k and v are cast to its
    dtype first (as SDPA would be), else k and v to q's."""
    from cake_gqa_det_train import flash_attn_func

    dt = autocast_dtype(q) or q.dtype
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    return flash_attn_func(q, k, v, softmax_scale=scaling, causal=True)


def causal_lm_forward(self, on: frozenset, output_cls, args: dict, kwargs: dict,
                      original_extra: dict | None = None, model_extra: dict | None = None):
    """A patched ``*ForCausalLM.forward``: with labels (and ``lm_head_loss`` on) the LM head
    and the shifted cross entropy run fused on cake-lm-head-loss-det-train and ``logits`` is
    None; otherwise transformers' own forward runs.

    ``args``: input_ids, attention_mask, position_ids, cache, inputs_embeds, labels,
    use_cache, logits_to_keep; ``kwargs``: the rest of the call; ``original_extra`` goes to
    transformers' forward only, ``model_extra`` to ``self.model`` only.
    """
    a = dict(args)
    if a["cache"] is None and "past_key_values" in kwargs:
        # transformers' deprecated name of ``cache`` (its forwards still map it): passed on
        # as is, transformers' forward would drop it for the ``cache=None`` given beside it
        a["cache"] = kwargs.pop("past_key_values")
    cache, labels, mask = a["cache"], a["labels"], a["attention_mask"]
    if a["use_cache"] is None and cache is None and (labels is not None or self.training):
        # training builds no cache (the config's default is True): with one, the layers
        # would run transformers' decoding code instead of cake's
        a["use_cache"] = False
    if "attention" in on and cache is None and isinstance(mask, torch.Tensor) \
            and mask.dim() == 2 and not holds(mask.all(), "attention_mask: padding not served"):
        # refused before any launch (the attention layers would refuse it later)
        raise ValueError("attention_mask: cake's attention serves the causal mask only; "
                         "a padding mask is not served yet (drop it, or pass attention=False)")
    if "attention" in on and kwargs.get("output_attentions",
                                        getattr(self.config, "output_attentions", False)):
        # cake's attention forms no probability matrix: no weights to return
        raise ValueError("output_attentions: cake's attention returns no attention weights "
                         "(pass attention=False to the patch for them)")
    if labels is None or "lm_head_loss" not in on or a["logits_to_keep"] != 0:
        return original(type(self))(self, **a, **(original_extra or {}), **kwargs)
    from cake_lm_head_loss_det_train import lm_head_loss_det

    # transformers' ``can_return_tuple``: return_dict=False (or the config's) gives a tuple;
    # the base model is asked for its output object, whose fields are read below
    ret = kwargs.pop("return_dict", None)
    ret = getattr(self.config, "return_dict", True) if ret is None else ret
    kwargs["return_dict"] = True
    n_items = kwargs.pop("num_items_in_batch", None)
    shift = kwargs.pop("shift_labels", None)
    ignore = kwargs.pop("ignore_index", -100)
    del a["labels"], a["logits_to_keep"]
    out = self.model(**a, **(model_extra or {}), **kwargs)
    h = out.last_hidden_state
    if shift is None:  # transformers' ForCausalLMLoss: token t predicts label t + 1
        shift = F.pad(labels, (0, 1), value=ignore)[..., 1:]
    w = self.lm_head.weight
    if w.dtype != h.dtype:
        w = w.to(h.dtype)
    red = "mean" if n_items is None else "sum"
    loss = lm_head_loss_det(h, w, shift.to(h.device).contiguous(), ignore_index=ignore,
                            reduction=red)
    if n_items is not None:
        loss = loss / n_items
    out = model_output(output_cls, out, loss=loss, logits=None)
    return out if ret else out.to_tuple()


def model_output(output_cls, out, **fields):
    """``output_cls(**fields)`` with the cache, hidden states and attentions of the base
    model's output ``out``, under either name transformers gives the cache field
    (``past_key_values`` in earlier 5.x releases, ``cache`` in later ones)."""
    names = {f.name for f in dataclasses.fields(output_cls)}
    key = "cache" if "cache" in names else "past_key_values"
    have = {f.name for f in dataclasses.fields(out)} if dataclasses.is_dataclass(out) else ()
    # read the field out's class declares (5.25 keeps past_key_values as a deprecated alias)
    fields[key] = getattr(out, "cache" if "cache" in have or not have else "past_key_values",
                          None)
    return output_cls(hidden_states=out.hidden_states, attentions=out.attentions, **fields)


def install(model, forwards: dict, expected: tuple, check_config, on: frozenset):
    """Put ``forwards`` (class -> cake forward) on the classes (``model=None``; returns None)
    or on the matching modules of ``model`` (returned), after checking its type and config."""
    for fn in forwards.values():
        setattr(fn, TAG, True)
    if model is None:
        for cls, fn in forwards.items():
            if "_cake_original_forward" not in cls.__dict__:
                cls._cake_original_forward = cls.forward
            cls.forward = fn
        return None
    if not isinstance(model, expected):
        names = " or ".join(c.__name__ for c in expected)
        raise ValueError(f"model: expected a transformers {names}, got {type(model).__name__}")
    check_config(model.config, on)
    for mod in model.modules():
        fn = forwards.get(type(mod))
        if fn is not None:
            mod.forward = types.MethodType(fn, mod)
    return model
