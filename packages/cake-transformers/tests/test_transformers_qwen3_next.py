"""A tiny Qwen3-Next patched by apply_cake_kernels_to_qwen3_next against transformers' own.

Two layers (one Gated DeltaNet, one gated full attention, both with a sparse MoE of 4
experts, top 2, and a shared expert), hidden 64, byte vocabulary, fp32, T = 24, B = 2: the
same weights run through transformers' code and through the cake kernels. The config keeps
transformers' default ``use_cache=True``: the patched model must still train on cake.
"""

import copy
import dataclasses

import pytest
import torch
from cake_core.triton_utils import is_interpreting
from cake_transformers import QWEN3_NEXT_PIECES, apply_cake_kernels_to_qwen3_next
from torch import nn

# fp32 CPU models against transformers' own code; on a GPU the patched model is checked in
# bf16 by benchmarks/bench_cake_transformers.py (bitwise repeat, loss gap, speed)
pytestmark = pytest.mark.skipif(not is_interpreting(), reason=(
    "CPU tests under Triton's interpreter; on CUDA see benchmarks/bench_cake_transformers.py"))

transformers = pytest.importorskip("transformers")
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next as hf  # noqa: E402

#: the autograd nodes the patched loss graph must hold: one (at least) per cake package
CAKE_NODES = {"_RMSNormDetFunctionBackward", "_RMSNormSiluGateDetFunctionBackward",
              "_CausalConv1dDetFunctionBackward", "_GQAFunctionBackward",
              "_MoEGroupedDetFunctionBackward", "_LMHeadLossDetFunctionBackward",
              "_ChunkGDNDetFunctionBackward"}


def tiny_config(**over):
    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
              layer_types=["linear_attention", "full_attention"], num_attention_heads=2,
              num_key_value_heads=1, head_dim=64, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
              moe_intermediate_size=32, shared_expert_intermediate_size=32,
              decoder_sparse_step=1, max_position_embeddings=128)
    kw.update(over)
    return Qwen3NextConfig(**kw)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(tiny_config()).float()
    with torch.no_grad():  # norms start at zero (weight 1 + 0); move them so (1 + w) matters
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.1)
    return model


def step(model, ids, labels=True):
    """One forward and backward; (loss, logits, {name: grad}) detached."""
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


@pytest.fixture(scope="module")
def runs(ids):
    ref = tiny_model()
    cake = apply_cake_kernels_to_qwen3_next(copy.deepcopy(ref))
    return {"ref": step(ref, ids), "cake": step(cake, ids), "cake2": step(cake, ids),
            "model": cake, "ref_model": ref}


def close(got, want, what):
    # fp32 throughout: the kernels and torch differ only in summation order (tiles, fixed
    # partial sums vs BLAS), a few fp32 ulps of the largest value; 1e-5 of it leaves room
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
    names = graph_names(runs["cake"][3].loss)
    assert CAKE_NODES <= names, CAKE_NODES - names


def test_two_patched_runs_are_bitwise_equal(runs):
    (l1, _, g1, _), (l2, _, g2, _) = runs["cake"], runs["cake2"]
    assert torch.equal(l1, l2)
    for name in g1:
        assert torch.equal(g1[name], g2[name]), name


def test_state_dict_keys_and_patching_twice(runs, ids):
    model, ref = runs["model"], runs["ref_model"]
    assert list(model.state_dict()) == list(ref.state_dict())
    assert apply_cake_kernels_to_qwen3_next(model) is model  # again: nothing more changes
    assert list(model.state_dict()) == list(ref.state_dict())
    loss, _, grads, _ = step(model, ids)
    assert torch.equal(loss, runs["cake"][0])
    assert all(torch.equal(grads[n], g) for n, g in runs["cake"][2].items())


def test_class_mode_patches_models_built_afterwards(runs, ids):
    classes = [hf.Qwen3NextRMSNorm, hf.Qwen3NextGatedDeltaNet, hf.Qwen3NextAttention,
               hf.Qwen3NextSparseMoeBlock, hf.Qwen3NextForCausalLM]
    before = {c: c.forward for c in classes}
    try:
        assert apply_cake_kernels_to_qwen3_next() is None
        apply_cake_kernels_to_qwen3_next()  # twice: the originals are kept once
        assert all(c._cake_original_forward is before[c] for c in classes)
        loss, _, grads, _ = step(tiny_model(), ids)
        assert torch.equal(loss, runs["cake"][0])
        assert all(torch.equal(grads[n], g) for n, g in runs["cake"][2].items())
    finally:
        for c in classes:
            c.forward = before[c]
            if "_cake_original_forward" in c.__dict__:
                del c._cake_original_forward


def test_some_pieces_on_still_match(runs, ids):
    # moe and the fused head off: transformers' experts and logits + loss, cake elsewhere
    model = apply_cake_kernels_to_qwen3_next(tiny_model(), moe=False, lm_head_loss=False)
    loss, logits, grads, _ = step(model, ids)
    assert logits is not None
    close(loss, runs["ref"][0], "loss")
    for name, g in runs["ref"][2].items():
        close(grads[name], g, name)


def test_bare_model_instance(ids):
    ref = tiny_model().model
    cake = apply_cake_kernels_to_qwen3_next(copy.deepcopy(ref))
    with torch.no_grad():
        want = ref(input_ids=ids, use_cache=False).last_hidden_state
        got = cake(input_ids=ids, use_cache=False).last_hidden_state
    close(got, want, "last_hidden_state")


def test_flags_switch_pieces_off(ids):
    off = {k: False for k in QWEN3_NEXT_PIECES}
    model = apply_cake_kernels_to_qwen3_next(tiny_model(), **off)
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_causal_mask_served_padding_refused(impl):
    model = tiny_model()
    model.config._attn_implementation = impl  # eager hands the layers a 4-D causal mask
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(2))
    ones = torch.ones_like(ids)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=ones, use_cache=False).logits
        apply_cake_kernels_to_qwen3_next(model)
        got = model(input_ids=ids, attention_mask=ones, use_cache=False).logits
        close(got, want, "logits")
        pad = ones.clone()
        pad[0, :3] = 0
        with pytest.raises(ValueError, match="padding mask"):
            model(input_ids=ids, attention_mask=pad)


def test_other_architecture_refused():
    with pytest.raises(ValueError, match="Qwen3NextForCausalLM or Qwen3NextModel, got Linear"):
        apply_cake_kernels_to_qwen3_next(nn.Linear(4, 4))


@pytest.mark.parametrize("over, match", [
    ({"head_dim": 32}, "head dims"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_dropout": 0.1}, "attention_dropout"),
    ({"output_router_logits": True}, "output_router_logits"),
])
def test_unsupported_config_refused_at_patch_time(over, match):
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(tiny_config(**over))
    with pytest.raises(ValueError, match=match):
        apply_cake_kernels_to_qwen3_next(model)
    assert all("forward" not in m.__dict__ for m in model.modules())  # nothing patched


def test_flag_not_a_bool_refused():
    with pytest.raises(ValueError, match="moe: expected a bool"):
        apply_cake_kernels_to_qwen3_next(moe=1)


class _Adapter(nn.Linear):
    """A Linear subclass (as a PEFT adapter is): its forward must run, so the patch may not
    stack its weight with others."""

    calls = 0

    def forward(self, x):
        type(self).calls += 1
        return super().forward(x)


def test_projections_stacked_and_adapters_respected(runs, ids):
    """The patched layers compute the projections that share an input in one GEMM (GDN's
    in_proj_qkvz / in_proj_ba, attention's q / k / v, the shared expert's gate / up with its
    sigmoid gate and the router): no projection module's forward runs. A Linear subclass
    (an adapter) is called as a module instead, and the loss and gradients still match
    transformers'."""
    model = runs["model"]
    called = []
    hooks = [m.register_forward_pre_hook(lambda m, a, n=n: called.append(n))
             for n, m in model.named_modules()
             if n.endswith(("in_proj_qkvz", "in_proj_ba", "q_proj", "k_proj", "v_proj",
                            "shared_expert.gate_proj", "shared_expert.up_proj",
                            "shared_expert_gate"))]
    try:
        step(model, ids)
    finally:
        for h in hooks:
            h.remove()
    assert called == []

    ref = tiny_model()
    cake = apply_cake_kernels_to_qwen3_next(copy.deepcopy(ref))
    for model_ in (ref, cake):
        for layer in model_.model.layers:
            for owner, name in ((getattr(layer, "self_attn", None), "k_proj"),
                                (getattr(layer, "linear_attn", None), "in_proj_ba"),
                                (layer.mlp, "shared_expert_gate")):
                if owner is None:
                    continue
                old = getattr(owner, name)
                new = _Adapter(old.in_features, old.out_features, bias=old.bias is not None)
                new.load_state_dict(old.state_dict())
                setattr(owner, name, new)
    _Adapter.calls = 0
    loss_c, _, grads_c, _ = step(cake, ids)
    assert _Adapter.calls == 4  # each layer: its mixer's adapted projection and the MoE's
    loss_r, _, grads_r, _ = step(ref, ids)
    close(loss_c, loss_r, "loss")
    for name in grads_r:
        close(grads_c[name], grads_r[name], name)


def graph_names(loss):
    """The type names of the autograd nodes behind ``loss``."""
    names, seen, stack = set(), set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(f for f, _ in node.next_functions)
    return names


def test_a_second_call_adds_pieces_and_undoes_none(ids):
    # the README: a second call adds the pieces it names but does not undo earlier ones (the
    # Gated DeltaNet and causal-LM forwards are built for one call's flags)
    model = apply_cake_kernels_to_qwen3_next(tiny_model())
    apply_cake_kernels_to_qwen3_next(model, linear_attention=False, short_conv=False,
                                     lm_head_loss=False)
    out = model(input_ids=ids, labels=ids)
    assert out.logits is None
    assert {"_ChunkGDNDetFunctionBackward", "_CausalConv1dDetFunctionBackward"} <= \
        graph_names(out.loss)


def _gdn_pieces(model):
    """The flag set the Gated DeltaNet forward installed on ``model`` was built for."""
    (gdn,) = [m for m in model.modules() if isinstance(m, hf.Qwen3NextGatedDeltaNet)]
    return gdn.forward.__func__._cake_transformers_pieces


def test_keep_states_same_bits_with_the_rules_plan_kept(ids, monkeypatch):
    """keep_states=True: the core runs the plan the entry picks itself for the call with
    keep_states = 1 (FLA's disable_recompute=True, no plan given; one plan object,
    cached), its backward recomputes no chunk state, and the loss, the logits and every
    gradient are bitwise those of keep_states=False."""
    import cake_gdn_det_train
    from cake_gdn_det_train import api

    given, resolved, recomputes = [], [], []
    real_entry, real_resolve, real_prep = (cake_gdn_det_train.chunk_gated_delta_rule_det,
                                           api._resolve_plan, api._prep_and_state)

    def entry(*a, **kw):
        given.append((kw.get("plan"), kw.get("disable_recompute")))
        return real_entry(*a, **kw)

    def resolve(*a, **kw):
        resolved.append(real_resolve(*a, **kw))
        return resolved[-1]

    monkeypatch.setattr(cake_gdn_det_train, "chunk_gated_delta_rule_det", entry)
    monkeypatch.setattr(api, "_resolve_plan", resolve)
    monkeypatch.setattr(api, "_prep_and_state",
                        lambda *a, **kw: recomputes.append(1) or real_prep(*a, **kw))
    ref = tiny_model()
    base = apply_cake_kernels_to_qwen3_next(copy.deepcopy(ref))
    kept = apply_cake_kernels_to_qwen3_next(copy.deepcopy(ref), keep_states=True)
    assert "keep_states" in _gdn_pieces(kept) and "keep_states" not in _gdn_pieces(base)

    want = step(base, ids)
    # the forward's recurrence, the backward's recompute
    assert given == [(None, None)] and len(recomputes) == 2
    (default,) = set(resolved)  # the entry's own plan for [B=2, T] x HV=4 value heads
    assert default.keep_states == 0
    given.clear(), resolved.clear(), recomputes.clear()
    got = step(kept, ids)
    assert given == [(None, True)] and len(recomputes) == 1
    assert set(resolved) == {dataclasses.replace(default, keep_states=1)}
    with torch.no_grad():
        logits_want = base(input_ids=ids, use_cache=False).logits
        logits_got = kept(input_ids=ids, use_cache=False).logits
    assert resolved[-1] is resolved[0]  # the kept plan is made once, not per call
    assert torch.equal(got[0], want[0]) and torch.equal(logits_got, logits_want)
    assert got[2].keys() == want[2].keys()
    for name, g in want[2].items():
        assert torch.equal(got[2][name], g), name
    # without labels (transformers' logits and a loss on them): the same bits too
    got, want = step(kept, ids, labels=False), step(base, ids, labels=False)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    for name, g in want[2].items():
        assert torch.equal(got[2][name], g), name


def test_keep_states_compiled_gdn_forward_one_graph(ids):
    """Under torch.compile (aot_eager) the patched Gated DeltaNet forward with keep_states
    traces as one graph, as without it (the core takes disable_recompute=True; the forward
    builds no plan), and the loss and every gradient keep keep_states=False's bits."""
    from torch._dynamo.testing import CompileCounterWithBackend

    ref, res = tiny_model(), {}
    for keep in (False, True):
        model = apply_cake_kernels_to_qwen3_next(copy.deepcopy(ref), keep_states=keep)
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend("aot_eager")
        for m in model.modules():
            if isinstance(m, hf.Qwen3NextGatedDeltaNet):
                m.forward = torch.compile(m.forward, backend=cnt)
        res[keep] = step(model, ids)
        assert cnt.frame_count == 1, (keep, cnt.frame_count)
    (loss, _, grads, _), (loss_k, _, grads_k, _) = res[False], res[True]
    assert torch.equal(loss_k, loss) and grads_k.keys() == grads.keys()
    for name, g in grads.items():
        assert torch.equal(grads_k[name], g), name


def test_keep_states_bad_values_refused_before_any_patch():
    classes = [hf.Qwen3NextRMSNorm, hf.Qwen3NextGatedDeltaNet, hf.Qwen3NextAttention,
               hf.Qwen3NextSparseMoeBlock, hf.Qwen3NextForCausalLM]
    before = {c: c.forward for c in classes}
    model = tiny_model()
    for bad in (1, "yes", None, torch.tensor(True)):
        with pytest.raises(ValueError, match="keep_states: expected a bool"):
            apply_cake_kernels_to_qwen3_next(model, keep_states=bad)
        with pytest.raises(ValueError, match="keep_states: expected a bool"):
            apply_cake_kernels_to_qwen3_next(keep_states=bad)
    # no effect without cake's Gated DeltaNet core: refused
    with pytest.raises(ValueError, match="keep_states: .*linear_attention"):
        apply_cake_kernels_to_qwen3_next(model, linear_attention=False, keep_states=True)
    with pytest.raises(ValueError, match="keep_states: .*linear_attention"):
        apply_cake_kernels_to_qwen3_next(linear_attention=False, keep_states=True)
    assert all("forward" not in m.__dict__ for m in model.modules())  # nothing patched
    assert all(c.forward is before[c] and "_cake_original_forward" not in c.__dict__
               for c in classes)


def test_keep_states_persists_across_calls_as_pieces_do():
    # linear_attention on from an earlier call: keep_states=True is served (and adds it)
    model = apply_cake_kernels_to_qwen3_next(tiny_model())
    assert "keep_states" not in _gdn_pieces(model)
    apply_cake_kernels_to_qwen3_next(model, linear_attention=False, keep_states=True)
    assert {"linear_attention", "keep_states"} <= _gdn_pieces(model)
    apply_cake_kernels_to_qwen3_next(model)  # keep_states=False does not turn it off
    assert {"linear_attention", "keep_states"} <= _gdn_pieces(model)
    # only the short convolution patched earlier: still no cake core, still refused
    model = apply_cake_kernels_to_qwen3_next(tiny_model(), linear_attention=False)
    with pytest.raises(ValueError, match="keep_states: .*linear_attention"):
        apply_cake_kernels_to_qwen3_next(model, linear_attention=False, keep_states=True)
    assert "keep_states" not in _gdn_pieces(model)
