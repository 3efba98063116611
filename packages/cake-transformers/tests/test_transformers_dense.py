"""Tiny Qwen3 and Llama patched by apply_cake_kernels_to_qwen3 / _llama against transformers.

Two layers, hidden 64, 2 query heads over 1 key/value head of dim 64, SwiGLU MLP of 96,
byte vocabulary, fp32, T = 24, B = 2: the same weights run through transformers' code and
through the cake kernels. Qwen3 ties its LM head to the embedding (its q/k norms are
RMSNorms too); Llama carries biases on its attention and MLP projections. The configs keep
transformers' default ``use_cache=True``: the patched models must still train on cake.
Class patching is always undone (``patched_classes``) so it cannot leak into other tests.
"""

import contextlib
import copy

import pytest
import torch
from cake_core.triton_utils import is_interpreting
from cake_transformers import DENSE_PIECES, apply_cake_kernels_to_llama, apply_cake_kernels_to_qwen3
from torch import nn

# fp32 CPU models against transformers' own code (Triton's interpreter); on a GPU the
# patched models are checked in bf16 by benchmarks/bench_cake_transformers.py
pytestmark = pytest.mark.skipif(not is_interpreting(), reason=(
    "CPU tests under Triton's interpreter; on CUDA see benchmarks/bench_cake_transformers.py"))

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3  # noqa: E402

#: the autograd nodes the patched loss graph must hold: one (at least) per cake package
CAKE_NODES = {"_RMSNormDetFunctionBackward", "_GQAFunctionBackward",
              "_DenseProjectionDetFunctionBackward", "_LMHeadLossDetFunctionBackward"}

ARCHS = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, modeling_qwen3, "Qwen3",
              apply_cake_kernels_to_qwen3, dict(tie_word_embeddings=True)),
    "llama": (LlamaConfig, LlamaForCausalLM, modeling_llama, "Llama",
              apply_cake_kernels_to_llama, dict(attention_bias=True, mlp_bias=True)),
}


def tiny_config(arch, **over):
    config_cls, *_, extra = ARCHS[arch]
    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=64,
              max_position_embeddings=128, **extra)
    kw.update(over)
    return config_cls(**kw)


def tiny_model(arch, seed=0, **over):
    torch.manual_seed(seed)
    model = ARCHS[arch][1](tiny_config(arch, **over)).float()
    with torch.no_grad():  # norms start at one and biases at zero: move them so they matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.1)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.02)
    return model


def apply(arch, model=None, **flags):
    return ARCHS[arch][4](model, **flags)


@contextlib.contextmanager
def patched_classes(arch):
    """Patch transformers' classes of ``arch`` for the block, then put them back."""
    hf, prefix = ARCHS[arch][2], ARCHS[arch][3]
    classes = [getattr(hf, prefix + s) for s in ("RMSNorm", "Attention", "MLP", "ForCausalLM")]
    before = {c: c.forward for c in classes}
    try:
        assert apply(arch) is None
        apply(arch)  # twice: the originals are kept once
        assert all(c._cake_original_forward is before[c] for c in classes)
        assert all(c.forward is not before[c] for c in classes)
        yield
    finally:
        for c in classes:
            c.forward = before[c]
            if "_cake_original_forward" in c.__dict__:
                del c._cake_original_forward


def step(model, ids, labels=True):
    """One forward and backward; (loss, logits, {name: grad}, output) detached."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids if labels else None)
    loss = out.loss if labels else out.logits.float().square().mean()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    logits = None if out.logits is None else out.logits.detach()
    return loss.detach(), logits, grads, out


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module", params=sorted(ARCHS))
def runs(request, ids):
    arch = request.param
    ref = tiny_model(arch)
    cake = apply(arch, copy.deepcopy(ref))
    return {"arch": arch, "ref": step(ref, ids), "cake": step(cake, ids),
            "cake2": step(cake, ids), "model": cake, "ref_model": ref}


def close(got, want, what):
    # fp32 throughout: the kernels and torch differ only in summation order (tiles, fixed
    # partial sums, online softmax vs BLAS and torch's softmax), a few fp32 ulps of the
    # largest value; 1e-5 of it leaves room
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * max(scale, 1e-3),
                               msg=lambda m: f"{what}: {m}")


def test_loss_and_every_gradient_match_transformers(runs):
    loss_r, _, grads_r, _ = runs["ref"]
    loss_c, logits_c, grads_c, _ = runs["cake"]
    assert logits_c is None  # labels given: the fused head never forms the logits
    close(loss_c, loss_r, "loss")
    assert grads_c.keys() == grads_r.keys()
    for name in grads_r:
        close(grads_c[name], grads_r[name], name)


def test_logits_match_without_labels(runs, ids):
    with torch.no_grad():
        want = runs["ref_model"](input_ids=ids, use_cache=False).logits
        got = runs["model"](input_ids=ids, use_cache=False).logits
    close(got, want, "logits")


def test_every_piece_runs_on_cake(runs):
    names, seen, stack = set(), set(), [runs["cake"][3].loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(f for f, _ in node.next_functions)
    assert CAKE_NODES <= names, CAKE_NODES - names


def test_two_patched_runs_are_bitwise_equal(runs):
    (l1, _, g1, _), (l2, _, g2, _) = runs["cake"], runs["cake2"]
    assert torch.equal(l1, l2)
    for name in g1:
        assert torch.equal(g1[name], g2[name]), name


def test_state_dict_keys_and_patching_twice(runs, ids):
    model, ref = runs["model"], runs["ref_model"]
    assert list(model.state_dict()) == list(ref.state_dict())
    assert apply(runs["arch"], model) is model  # again: nothing more changes
    assert list(model.state_dict()) == list(ref.state_dict())
    loss, _, grads, _ = step(model, ids)
    assert torch.equal(loss, runs["cake"][0])
    assert all(torch.equal(grads[n], g) for n, g in runs["cake"][2].items())


def test_class_mode_patches_models_built_afterwards(runs, ids):
    arch = runs["arch"]
    with patched_classes(arch):
        loss, _, grads, _ = step(tiny_model(arch), ids)
    assert torch.equal(loss, runs["cake"][0])
    assert all(torch.equal(grads[n], g) for n, g in runs["cake"][2].items())
    # undone: a model built now runs transformers' code again
    loss, logits, _, _ = step(tiny_model(arch), ids)
    assert logits is not None and torch.equal(loss, runs["ref"][0])


def test_class_mode_refuses_config_when_a_module_first_runs(ids):
    with patched_classes("llama"):
        model = tiny_model("llama", hidden_act="gelu")
        with pytest.raises(ValueError, match="hidden_act"):
            model(input_ids=ids, labels=ids)


def test_bare_model_instance(ids):
    ref = tiny_model("qwen3").model
    cake = apply("qwen3", copy.deepcopy(ref))
    with torch.no_grad():
        want = ref(input_ids=ids, use_cache=False).last_hidden_state
        got = cake(input_ids=ids, use_cache=False).last_hidden_state
    close(got, want, "last_hidden_state")


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_flags_switch_pieces_off(arch):
    model = apply(arch, tiny_model(arch), **{k: False for k in DENSE_PIECES})
    assert all("forward" not in m.__dict__ for m in model.modules())
    model = apply(arch, tiny_model(arch), mlp=False, lm_head_loss=False)
    patched = {type(m).__name__ for m in model.modules() if "forward" in m.__dict__}
    prefix = ARCHS[arch][3]
    assert patched == {prefix + "RMSNorm", prefix + "Attention", prefix + "ForCausalLM"}


def test_autocast_bf16_trains(ids):
    # fp32 weights under bf16 autocast (HF Trainer's bf16=True): q/k/v and the MLP's GEMMs
    # run in bf16 as transformers' would. Tolerance: bf16 keeps 8 bits and flash attention
    # rounds P and dS to bf16 in its backward (the interpreter's casts truncate): against
    # fp32, torch's grads land within 1.5% of each tensor's largest entry, cake's within 4.5%,
    # so within 6% of each other; 8% leaves room. Llama: its biases get cast too
    ref = tiny_model("llama")
    cake = apply("llama", copy.deepcopy(ref))
    got = []
    for model in (ref, cake):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        got.append((out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_r, grads_r), (loss_c, grads_c) = got
    torch.testing.assert_close(loss_c, loss_r, rtol=1e-3, atol=0)
    for name, g in grads_r.items():
        assert grads_c[name].dtype == torch.float32
        torch.testing.assert_close(grads_c[name], g, rtol=0, atol=0.08 * g.abs().max().item(),
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_generation_with_a_cache_runs(ids):
    # decoding with a cache: the attention runs transformers' code, the norms and MLP cake's
    ref = tiny_model("llama").eval()
    cake = apply("llama", copy.deepcopy(ref))
    kw = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    want = ref.generate(ids[:, :8], **kw)
    got = cake.generate(ids[:, :8], **kw)
    assert torch.equal(got, want)


def test_causal_mask_served_padding_refused():
    model = tiny_model("qwen3")
    model.config._attn_implementation = "eager"  # eager hands the layers a 4-D causal mask
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(2))
    ones = torch.ones_like(ids)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=ones, use_cache=False).logits
        apply("qwen3", model)
        got = model(input_ids=ids, attention_mask=ones, use_cache=False).logits
        close(got, want, "logits")
        pad = ones.clone()
        pad[0, :3] = 0
        with pytest.raises(ValueError, match="padding mask"):
            model(input_ids=ids, attention_mask=pad)


@pytest.mark.parametrize("arch, other", [("qwen3", "llama"), ("llama", "qwen3")])
def test_other_architecture_refused(arch, other):
    prefix = ARCHS[arch][3]
    with pytest.raises(ValueError, match=f"expected a transformers {prefix}ForCausalLM or "
                                         f"{prefix}Model, got {ARCHS[other][3]}ForCausalLM"):
        apply(arch, tiny_model(other))
    with pytest.raises(ValueError, match="got Linear"):
        apply(arch, nn.Linear(4, 4))


@pytest.mark.parametrize("arch, over, match", [
    ("qwen3", {"head_dim": 96}, "head dims"),
    ("llama", {"head_dim": 96}, "head dims"),
    ("qwen3", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama", {"attention_dropout": 0.1}, "attention_dropout"),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0},
     "sliding-window"),
])
def test_unsupported_config_refused_at_patch_time(arch, over, match):
    model = tiny_model(arch, **over)
    with pytest.raises(ValueError, match=match):
        apply(arch, model)
    assert all("forward" not in m.__dict__ for m in model.modules())  # nothing patched


def test_unsupported_config_served_with_its_piece_off():
    model = apply("llama", tiny_model("llama", hidden_act="gelu"), mlp=False)
    assert "forward" not in model.model.layers[0].mlp.__dict__


def test_flag_not_a_bool_refused():
    with pytest.raises(ValueError, match="mlp: expected a bool"):
        apply_cake_kernels_to_llama(mlp=1)


def test_model_output_takes_either_cache_field_name():
    import dataclasses
    import warnings

    from cake_transformers._common import model_output

    @dataclasses.dataclass
    class Old:  # transformers 5.1x: past_key_values
        loss: object = None
        logits: object = None
        past_key_values: object = None
        hidden_states: object = None
        attentions: object = None

    @dataclasses.dataclass
    class New:  # later 5.x: cache
        loss: object = None
        logits: object = None
        cache: object = None
        hidden_states: object = None
        attentions: object = None

    for base in (Old(past_key_values="c", hidden_states="h"), New(cache="c", hidden_states="h")):
        for cls in (Old, New):
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no deprecated alias read
                model_output(cls, base, loss=1.0, logits=None)
            got = model_output(cls, base, loss=1.0, logits=None)
            assert isinstance(got, cls) and got.loss == 1.0 and got.hidden_states == "h"
            assert getattr(got, "cache", getattr(got, "past_key_values", None)) == "c"


class _LoRA(nn.Linear):
    """A Linear subclass whose forward adds a low-rank term (as a PEFT adapter does): the
    patched MLP must call it as a module, not read its weight."""

    calls = 0

    def __init__(self, old):
        super().__init__(old.in_features, old.out_features, bias=old.bias is not None)
        self.load_state_dict(old.state_dict())
        self.lora_a = nn.Parameter(torch.randn(4, old.in_features) * 0.1)
        self.lora_b = nn.Parameter(torch.randn(old.out_features, 4) * 0.1)

    def forward(self, x):
        type(self).calls += 1
        return super().forward(x) + x @ self.lora_a.t() @ self.lora_b.t()


@pytest.mark.parametrize("names", [("gate_proj",), ("down_proj",), ("v_proj", "up_proj")])
def test_mlp_adapters_run_their_own_forward(names, ids):
    """An adapter on some of the MLP's (or attention's) projections runs its own forward
    under the patch: loss and every gradient (the adapter's own too) match transformers'."""
    ref = tiny_model("llama", num_hidden_layers=1)
    torch.manual_seed(3)
    for layer in ref.model.layers:
        for name in names:
            owner = layer.self_attn if name.endswith(("q_proj", "k_proj", "v_proj")) \
                else layer.mlp
            setattr(owner, name, _LoRA(getattr(owner, name)))
    cake = apply("llama", copy.deepcopy(ref))
    _LoRA.calls = 0
    loss_c, _, grads_c, _ = step(cake, ids)
    assert _LoRA.calls == len(names)
    loss_r, _, grads_r, _ = step(ref, ids)
    close(loss_c, loss_r, "loss")
    assert grads_c.keys() == grads_r.keys()
    for name in grads_r:
        close(grads_c[name], grads_r[name], name)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_second_call_adds_pieces_and_undoes_none(arch, ids):
    # the README: a second call adds the pieces it names but does not undo earlier ones
    model = apply(arch, tiny_model(arch))
    apply(arch, model, lm_head_loss=False)
    assert model(input_ids=ids, labels=ids).logits is None  # the fused head still runs
    with patched_classes(arch):
        apply(arch, lm_head_loss=False)  # class mode likewise
        assert tiny_model(arch)(input_ids=ids, labels=ids).logits is None


def test_past_key_values_name_reaches_the_cache(ids):
    # transformers 5.x still takes its deprecated ``past_key_values=`` for ``cache=``: a
    # decoding loop written with it must read the cache it passes (not a fresh one)
    from transformers import DynamicCache

    ref = tiny_model("qwen3").eval()
    cake = apply("qwen3", copy.deepcopy(ref))
    got = []
    for model in (ref, cake):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids[:, :8], past_key_values=cache, use_cache=True)
            got.append(model(input_ids=ids[:, 8:9], past_key_values=cache,
                             use_cache=True).logits)
    close(got[1], got[0], "logits of the decoded token")


@pytest.mark.parametrize("in_config", [False, True])
def test_return_dict_false_gives_a_tuple_with_labels(runs, ids, in_config):
    # transformers' can_return_tuple: the output's non-None fields, loss first
    model = runs["model"]
    kw = {} if in_config else {"return_dict": False}
    model.config.return_dict = not in_config
    try:
        out = model(input_ids=ids, labels=ids, **kw)
    finally:
        model.config.return_dict = True
    assert isinstance(out, tuple)
    assert torch.equal(out[0].detach(), runs["cake"][0])


def test_packed_position_ids_refused_naming_packing(ids):
    # position_ids that restart (no mask): transformers builds a block-diagonal mask
    model = apply("qwen3", tiny_model("qwen3"))
    pos = torch.cat([torch.arange(10), torch.arange(14)])[None].expand(2, -1)
    with pytest.raises(ValueError, match="packed sequences"):
        model(input_ids=ids, position_ids=pos, labels=ids)


def test_output_attentions_refused_with_cake_attention(ids):
    # cake's attention has no weights to return: refused, not an empty tuple; an eager
    # attention implementation (the one transformers returns weights from)
    model = apply("qwen3", tiny_model("qwen3"))
    model.config._attn_implementation = "eager"
    for kw in (dict(labels=ids), {}):
        with pytest.raises(ValueError, match="cake's attention returns no attention weights"):
            model(input_ids=ids, output_attentions=True, **kw)
    model.config.output_attentions = True
    with pytest.raises(ValueError, match="cake's attention returns no attention weights"):
        model(input_ids=ids)
    model.config.output_attentions = False
    assert model(input_ids=ids, labels=ids).loss is not None
