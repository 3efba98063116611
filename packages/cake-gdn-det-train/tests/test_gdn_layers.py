"""GatedDeltaNet, the whole layer: float64 parity with a plain-torch layer on the same
parameters, FLA's state_dict keys, padding masks and packed input, bad arguments."""

import pytest
import torch
import torch.nn.functional as F
from cake_core.testing import (
    assert_close_to_reference,
    assert_layer_keep_states_compiles_as_default,
    assert_layer_keep_states_same_bits,
    assert_raises_unmodified,
)
from cake_core.triton_utils import default_device
from cake_gdn_det_train import GatedDeltaNet, gdn_reference

DEV = default_device()
#: fp32 tolerances: gradients summed with cancellation (dA_log, ddt_bias: over every token)
#: looser; CUDA's fp32 dots are tf32x3, not IEEE
TOL, PARAM_TOL = (1e-4, 3e-4) if DEV.type == "cuda" else (3e-5, 1e-4)
FLA_KEYS = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "a_proj.weight",
            "b_proj.weight", "A_log", "dt_bias", "q_conv1d.weight", "k_conv1d.weight",
            "v_conv1d.weight", "g_proj.weight", "o_norm.weight", "o_proj.weight"]


def _layer(seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(hidden_size=64, head_dim=16, num_heads=2, num_v_heads=4, expand_v=2)
    args.update(kw)
    layer = GatedDeltaNet(**args).to(DEV)
    with torch.no_grad():  # norm weights off their ones, so that they matter
        layer.o_norm.weight.uniform_(0.5, 1.5)
    return layer


def reference(layer, x, cu_seqlens=None):
    """The layer in float64 torch, from the layer's parameters."""
    p = {n: t.detach().double().requires_grad_() for n, t in layer.named_parameters()}
    x = x.detach().double().requires_grad_()

    def conv(t, name):
        if not layer.use_short_conv:
            return F.silu(t)
        w = p[f"{name}_conv1d.weight"]
        W = w.shape[-1]
        docs = [(0, t.shape[1])] if cu_seqlens is None else \
            list(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True))
        outs = []
        for s, e in docs:  # each document from a zero state
            seg = t[:, s:e].transpose(1, 2)
            y = F.conv1d(F.pad(seg, (W - 1, 0)), w, groups=w.shape[0])
            outs.append(y.transpose(1, 2))
        return F.silu(torch.cat(outs, 1))

    q = conv(F.linear(x, p["q_proj.weight"]), "q")
    k = conv(F.linear(x, p["k_proj.weight"]), "k")
    v = conv(F.linear(x, p["v_proj.weight"]), "v")
    H, HV, K, V = layer.num_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
    o, _ = gdn_reference(q.unflatten(-1, (H, K)), k.unflatten(-1, (H, K)),
                         v.unflatten(-1, (HV, V)), F.linear(x, p["a_proj.weight"]),
                         F.linear(x, p["b_proj.weight"]), cu_seqlens=cu_seqlens,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                         A_log=p["A_log"], dt_bias=p["dt_bias"],
                         use_beta_sigmoid_in_kernel=True,
                         allow_neg_eigval=layer.allow_neg_eigval, dtype=torch.float64)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + layer.norm_eps)
    o = o * p["o_norm.weight"]
    if layer.use_gate:
        o = o * F.silu(F.linear(x, p["g_proj.weight"]).unflatten(-1, (HV, V)))
    out = F.linear(o.flatten(-2), p["o_proj.weight"])
    return out, x, p


@pytest.mark.parametrize("kw", [{}, {"use_gate": False, "allow_neg_eigval": True},
                                {"use_short_conv": False, "num_v_heads": 2}])
def test_layer_matches_float64_torch(kw):
    layer = _layer(**kw)
    x = torch.randn(2, 33, 64, device=DEV, requires_grad=True)
    do = torch.randn(2, 33, 64, device=DEV)
    out, _, _ = layer(x)
    out.backward(do)
    ref, xr, p = reference(layer, x)
    ref.backward(do.double())
    assert_close_to_reference(out, ref, torch.float32, tol=TOL)
    assert_close_to_reference(x.grad, xr.grad, torch.float32, "dx", tol=TOL)
    for n, t in layer.named_parameters():
        assert_close_to_reference(t.grad, p[n].grad, torch.float32, f"d{n}",
                                  tol=PARAM_TOL if n in ("A_log", "dt_bias") else TOL)


def test_state_dict_keys_are_flas():
    assert sorted(_layer().state_dict()) == sorted(FLA_KEYS)
    keys = sorted(_layer(use_gate=False, use_short_conv=False).state_dict())
    assert keys == sorted(k for k in FLA_KEYS if "conv1d" not in k and k != "g_proj.weight")
    assert "q_conv1d.bias" in _layer(conv_bias=True).state_dict()
    layer, other = _layer(seed=1), _layer(seed=2)
    other.load_state_dict(layer.state_dict())
    x = torch.randn(1, 9, 64, device=DEV)
    assert torch.equal(layer(x)[0], other(x)[0])
    assert layer.A_log._no_weight_decay and layer.dt_bias._no_weight_decay


def test_packed_and_padded_equal_separate_documents():
    layer = _layer(seed=3)
    lens = [5, 1, 20]
    docs = [torch.randn(1, n, 64, device=DEV) for n in lens]
    alone = [layer(d)[0] for d in docs]
    cu = torch.tensor([0, 5, 6, 26], dtype=torch.int32, device=DEV)
    packed, _, _ = layer(torch.cat(docs, 1), cu_seqlens=cu)
    assert_close_to_reference(packed, torch.cat(alone, 1).double(), torch.float32, tol=TOL)
    T = max(lens)
    x = torch.randn(3, T, 64, device=DEV)
    mask = torch.zeros(3, T, dtype=torch.long, device=DEV)
    for i, (d, n) in enumerate(zip(docs, lens, strict=True)):
        x[i, T - n:] = d[0]  # left padding
        mask[i, T - n:] = 1
    x_before = x.clone()
    padded, none, _ = layer(x, attention_mask=mask)
    assert none is None and torch.equal(x, x_before)
    for i, n in enumerate(lens):
        assert bool((padded[i, : T - n] == 0).all())
        assert_close_to_reference(padded[i, T - n:], alone[i][0].double(), torch.float32,
                                  tol=TOL)
    ones = torch.ones(3, T, dtype=torch.long, device=DEV)
    assert torch.equal(layer(x, attention_mask=ones)[0], layer(x)[0])


def test_repeats_bitwise():
    layer = _layer(seed=4)
    x = torch.randn(2, 40, 64, device=DEV, requires_grad=True)

    def run():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out, _, _ = layer(x)
        out.square().sum().backward()
        return [out.detach(), x.grad] + [p.grad for p in layer.parameters()]

    a, b = run(), run()
    assert all(torch.equal(s, t) for s, t in zip(a, b, strict=True))


def test_keep_states_same_bits_no_recompute(monkeypatch):
    """keep_states=True: the core runs the entry's rule plan with keep_states = 1 (the
    backward does not recompute the chunk states) and gives the default layer's bits,
    outputs and every gradient, on packed documents of 1, 70 and 3 tokens."""
    import cake_gdn_det_train.api as api

    assert_layer_keep_states_same_bits(_layer, api, monkeypatch, hidden=64, device=DEV)


def test_keep_states_compiled_one_graph_same_bits():
    """Under torch.compile a keep_states=True layer traces as one graph (its core gets
    disable_recompute=True; the layer builds no plan) and gives the default layer's bits."""
    assert_layer_keep_states_compiles_as_default(_layer, hidden=64, device=DEV)


@pytest.mark.parametrize("kw,match", [
    ({"num_heads": 3, "num_v_heads": 4}, "multiple of num_heads"),
    ({"mode": "parallel"}, "mode"),
    ({"head_dim": 16, "expand_v": 0.3}, "expand_v"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"keep_states": "yes"}, "keep_states: expected a bool"),
])
def test_bad_constructor_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        _layer(**kw)


def test_bad_forward_arguments():
    layer = _layer()
    x = torch.randn(2, 8, 64, device=DEV)
    with pytest.raises(ValueError, match="decoding is not served"):
        layer(x, use_cache=True)
    with pytest.raises(ValueError, match="attention weights"):
        layer(x, output_attentions=True)
    with pytest.raises(ValueError, match=r"attention_mask: expected \[B, T\]"):
        layer(x, attention_mask=torch.ones(2, 9, device=DEV))
    with pytest.raises(ValueError, match="give one"):
        layer(x[:1], attention_mask=torch.ones(1, 8, device=DEV),
              cu_seqlens=torch.tensor([0, 8], device=DEV))
    with pytest.raises(ValueError, match=r"hidden_states: expected \[B, T, 64\]"):
        layer(x[..., :32])


def test_refused_before_any_launch_inputs_unchanged():
    """A head dim the kernels do not serve, a mask of the wrong shape: ValueError before
    the first projection runs, the caller's tensors as they were."""
    layer = GatedDeltaNet(hidden_size=64, head_dim=512, num_heads=1, expand_v=1).to(DEV)

    def launched(*args, **kwargs):
        raise AssertionError("a projection ran before the refusal")

    layer.q_proj.forward = launched
    x = torch.randn(2, 8, 64, device=DEV)
    assert_raises_unmodified(layer, {"hidden_states": x}, r"head_k_dim: must be an int")
    assert_raises_unmodified(layer, {"hidden_states": x,
                                      "attention_mask": torch.ones(2, 9, device=DEV)},
                             r"attention_mask: expected \[B, T\]")


def test_torch_impl_same_parameters_same_output():
    """impl="torch": the same state_dict from the same seed, plain torch modules, and the
    cake layer's output and gradients within fp32 tolerance (padded input too)."""
    args = dict(hidden_size=64, head_dim=16, num_heads=2, num_v_heads=4, expand_v=2)
    torch.manual_seed(5)
    cake = GatedDeltaNet(**args).to(DEV)
    torch.manual_seed(5)
    ref = GatedDeltaNet(**args, impl="torch").to(DEV)
    assert cake.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(t, ref.state_dict()[n]) for n, t in cake.state_dict().items())
    assert not [m for m in ref.modules() if type(m).__module__.startswith("cake_")
                and type(m).__module__ != "cake_core.layer_utils" and m is not ref]
    x = torch.randn(2, 20, 64, device=DEV)
    mask = torch.ones(2, 20, dtype=torch.long, device=DEV)
    mask[1, :6] = 0
    for kw in ({}, {"attention_mask": mask}):
        out, _, _ = cake(x, **kw)
        out_ref, _, _ = ref(x, **kw)
        out.square().sum().backward()
        out_ref.square().sum().backward()
        assert_close_to_reference(out, out_ref.double(), torch.float32, tol=TOL)
        for (n, p), q in zip(cake.named_parameters(), ref.parameters(), strict=True):
            assert_close_to_reference(p.grad, q.grad.double(), torch.float32, f"d{n}",
                                      tol=PARAM_TOL)
    with pytest.raises(ValueError, match="impl"):
        GatedDeltaNet(**args, impl="triton")
