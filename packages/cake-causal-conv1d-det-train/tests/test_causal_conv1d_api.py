"""The module drop-in, plans, workspaces, the manifest, lazy imports."""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from cake_causal_conv1d_det_train import (
    CausalConv1dDetPlan,
    CausalConv1dDetWorkspace,
    ShortConvolution,
    causal_conv1d_det,
    causal_conv1d_det_bwd,
    causal_conv1d_det_fwd,
    make_plan,
)
from cake_core.testing import bitwise_equal, randn
from cake_core.triton_utils import default_device

DEV = default_device()


def _torch_short_conv(conv1d: torch.nn.Conv1d, x, activation):
    """FLA's ShortConvolution math with plain torch: a causal depthwise nn.Conv1d."""
    y = conv1d(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)
    return F.silu(y) if activation else y


@pytest.mark.parametrize("bias,activation", [(False, "silu"), (True, None)])
def test_module_loads_conv1d_state_dict_and_matches(bias, activation):
    D, W = 20, 4
    ref = torch.nn.Conv1d(D, D, W, groups=D, padding=W - 1, bias=bias, device=DEV)
    ours = ShortConvolution(D, W, bias=bias, activation=activation, device=DEV)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert ours.weight.shape == (D, 1, W)
    ours.load_state_dict(ref.state_dict())
    x = randn((2, 19, D), torch.float32, DEV, seed=1).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y, fs = ours(x)
    assert fs is None
    y2 = _torch_short_conv(ref, x2, activation)
    torch.testing.assert_close(y, y2, rtol=1e-5, atol=1e-5)
    dy = randn(y.shape, torch.float32, DEV, seed=2)
    y.backward(dy)
    y2.backward(dy)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-4)
    if bias:
        torch.testing.assert_close(ours.bias.grad, ref.bias.grad, rtol=1e-4, atol=1e-4)


def test_module_matches_functional_with_state(conv):
    D, W = 16, 3
    m = ShortConvolution(D, W, bias=True, device=DEV)
    cu = conv.CU_RAGGED[:5]
    inp = conv.make_inputs(1, cu[-1], D, W, cu=cu, seed=3)
    y, fs = m(inp.x, cache=inp.h0, output_final_state=True, cu_seqlens=inp.cu)
    y2, fs2 = causal_conv1d_det(inp.x, m.weight.reshape(D, W), m.bias, activation="silu",
                                cu_seqlens=inp.cu, initial_state=inp.h0,
                                output_final_state=True)
    assert bitwise_equal(y, y2) and bitwise_equal(fs, fs2)
    y3, _ = m(inp.x, initial_state=inp.h0, cu_seqlens=inp.cu)  # the other name
    assert bitwise_equal(y3, y)
    # residual (added after the activation), and [B, T, H, d] inputs flattened to D
    r = randn(y.shape, torch.float32, DEV, seed=4)
    y4, _ = m(inp.x.reshape(1, cu[-1], 4, 4), residual=r.reshape(1, cu[-1], 4, 4),
              cache=inp.h0, cu_seqlens=inp.cu)
    assert y4.shape == (1, cu[-1], 4, 4)
    assert bitwise_equal(y4.reshape(y.shape), y + r)
    with pytest.raises(ValueError, match="not both"):
        m(inp.x, cache=inp.h0, initial_state=inp.h0, cu_seqlens=inp.cu)
    with pytest.raises(ValueError, match="mask"):
        m(inp.x, mask=torch.ones(1, cu[-1], device=DEV), cu_seqlens=inp.cu)
    with pytest.raises(ValueError, match="flatten to hidden_size"):
        m(randn((1, 4, 15), torch.float32, DEV))


def test_module_mask_dtype_and_arguments():
    D, W = 8, 4
    m = ShortConvolution(D, W, bias=True, activation="swish", backend="triton",
                         dtype=torch.bfloat16, device=DEV)
    x = randn((2, 9, D), torch.float32, DEV, seed=5)  # fp32 input, bf16 module
    mask = torch.ones(2, 9, device=DEV)
    mask[1, 6:] = 0
    y, _ = m(x, mask=mask)
    ref = ShortConvolution(D, W, bias=True, device=DEV)
    ref.load_state_dict({k: v.float() for k, v in m.state_dict().items()})
    y2, _ = ref(x * mask[..., None])
    assert bitwise_equal(y, y2) and y.dtype == torch.float32
    assert m.state_size == D * (W - 1)
    for bad in (dict(kernel_size=1), dict(kernel_size=9), dict(activation="relu"),
                dict(backend="xla")):
        with pytest.raises(ValueError):
            ShortConvolution(**({"hidden_size": D, "kernel_size": W} | bad))


def test_module_residual_and_mask_shapes_checked_before_launch(monkeypatch):
    # a residual or mask of another shape raised torch's RuntimeError (the residual's after
    # the kernels ran); a [D] residual broadcast silently
    m = ShortConvolution(8, 4, device=DEV)

    def boom(*a, **k):
        raise AssertionError("the conv ran for a bad residual or mask")

    monkeypatch.setattr(m, "_conv", boom)
    x = randn((2, 9, 8), torch.float32, DEV, seed=8)
    for kw, name in ((dict(residual=randn((2, 9, 7), torch.float32, DEV, seed=9)), "residual"),
                     (dict(residual=randn((8,), torch.float32, DEV, seed=9)), "residual"),
                     (dict(residual=[1.0]), "residual"),
                     (dict(mask=torch.ones(2, 10, device=DEV)), "mask"),
                     (dict(mask=torch.ones(9, device=DEV)), "mask"),
                     (dict(mask=torch.ones(2, 9, 8, device=DEV)), "mask")):
        with pytest.raises(ValueError, match=name):
            m(x, **kw)


def test_double_backward_refused_not_silent():
    x = randn((1, 7, 4), torch.float32, DEV, seed=6).requires_grad_()
    w = randn((4, 2), torch.float32, DEV, seed=7).requires_grad_()
    y, _ = causal_conv1d_det(x, w, activation="silu")
    (g,) = torch.autograd.grad(y.pow(3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
        g.pow(2).sum().backward()


def test_plan_rules_and_roundtrip():
    p = make_plan(4096, 4, torch.bfloat16, "cuda")
    # the documented CUDA rule for W <= 4 (H200 sweeps, docs/benchmarks/causal_conv1d.md)
    assert (p.hidden_size, p.kernel_size, p.block_t_bwd, p.block_d_bwd, p.num_warps_bwd,
            p.block_d_fwd, p.bwd_da_once, p.weight_tap_major) == (4096, 4, 128, 64, 4, 128, 1, 1)
    pv = make_plan(4096, 4, torch.bfloat16, "cuda", varlen=True)
    assert pv == dataclasses.replace(p, block_d_fwd=64)  # packed calls: 64-channel forward
    assert make_plan(4096, 4, torch.bfloat16, "cuda", varlen=True) is pv
    assert make_plan(4096, 5, torch.bfloat16, "cuda").bwd_da_once == 0  # W > 4: untimed
    assert make_plan(4096, 4, torch.bfloat16, "cpu", varlen=True) == \
        make_plan(4096, 4, torch.bfloat16, "cpu")
    assert make_plan(4096, 4, torch.bfloat16, "cuda") is p  # a rule, memoised
    assert CausalConv1dDetPlan.from_dict(p.to_dict()) == p and p.mode.value == "det"
    q = make_plan(40, 3, torch.float32, "cpu")
    assert q.block_d_fwd == 64 and q.block_t_fwd == 32
    for bad in (dict(hidden_size=0), dict(kernel_size=1), dict(kernel_size=9),
                dict(hidden_size=True), dict(kernel_size=4.0)):
        args = dict(hidden_size=8, kernel_size=4) | bad
        with pytest.raises(ValueError):
            make_plan(args["hidden_size"], args["kernel_size"], torch.float32, DEV)
    with pytest.raises(ValueError, match="device"):
        make_plan(8, 4, torch.float32, "nope")
    good = q.to_dict()
    for field, value in (("block_t_bwd", 24), ("num_warps_fwd", 3), ("block_d_bwd", 1.0),
                         ("kernel_size", 12)):
        with pytest.raises(ValueError, match=field):
            CausalConv1dDetPlan.from_dict({**good, field: value})
    with pytest.raises(ValueError, match="channel blocks"):
        CausalConv1dDetPlan.from_dict({**good, "hidden_size": 1 << 20, "block_d_fwd": 1})


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_plan_rule_valid_for_every_documented_size(device):
    """Every D in [1, 2**20] and W in [2, 8] gets a plan the constructor accepts (the CUDA
    W > 4 backward's 16-channel tiles needed over 65535 channel blocks at D > 1048560)."""
    ds = sorted({*range(1, 70), *(k * 65535 + o for k in (1, 8, 16) for o in (-1, 0, 1)),
                 *range((1 << 20) - 20, (1 << 20) + 1)})
    for D in ds:
        for W in range(2, 9):
            p = make_plan(D, W, torch.bfloat16, device)
            assert CausalConv1dDetPlan.from_dict(p.to_dict()) == p
            for bd in (p.block_d_fwd, p.block_d_bwd):
                assert -(-D // bd) <= 65535 and bd <= max(64, 1 << (D - 1).bit_length())
    assert make_plan(1 << 20, 8, torch.float32, "cuda").block_d_bwd == 32
    assert make_plan((1 << 20) - 16, 8, torch.float32, "cuda").block_d_bwd == 16


def test_workspace_reuse_and_capacity(conv):
    D, W = 12, 4
    plan = make_plan(D, W, torch.float32, DEV)
    ws = CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=80, max_seqs=8)
    assert ws.names == ("dweight_partials", "dbias_partials") + \
        (("da_scratch",) if plan.bwd_da_once else ())  # the CUDA rule's dpre scratch
    assert ws["dweight_partials"].shape == (80 // plan.block_t_bwd + 8, D, W)
    for B, T, cu in ((2, 5, None), (1, 40, (0, 0, 3, 40))):  # one workspace, many calls
        inp = conv.make_inputs(B, T, D, W, cu=cu, seed=T)
        got = conv.run_cake(inp, "silu", plan=plan, workspace=ws)
        want = conv.run_cake(inp, "silu", plan=plan)  # the rule's plan differs when packed
        for k in got:
            assert bitwise_equal(got[k], want[k]), k
        got = conv.run_cake(inp, "silu", workspace=ws)  # no plan: the workspace's
        for k in got:
            assert bitwise_equal(got[k], want[k]), k
    with pytest.raises(ValueError, match="max_tokens"):
        CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=-1)
    with pytest.raises(ValueError, match="max_seqs"):
        CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=8, max_seqs=0)


def test_packed_plan_and_fixed_length_workspace(conv, monkeypatch):
    """A rule whose packed plan differs in forward fields only (the CUDA rule's 64- vs
    128-channel forward; on the CPU varlen changes nothing, so it is patched in): a packed
    call with a workspace made for the fixed-length plan takes the workspace's plan, through
    autograd and through the low-level backward, with the same bits as without it."""
    import cake_causal_conv1d_det_train.api as api

    real = api.make_plan

    def rule(D, W, dtype, device, *, varlen=False):
        p = real(D, W, dtype, device)
        return dataclasses.replace(p, block_d_fwd=p.block_d_fwd // 2) if varlen else p

    monkeypatch.setattr(api, "make_plan", rule)
    monkeypatch.setattr(api, "_DEFAULT_PLANS", {})
    D, W, cu = 20, 4, (0, 0, 1, 9, 40)
    inp = conv.make_inputs(1, cu[-1], D, W, cu=cu, seed=5)
    fixed = real(D, W, torch.float32, DEV)
    ws = CausalConv1dDetWorkspace.for_plan(fixed, DEV, max_tokens=40, max_seqs=4)
    y, fs, saved = causal_conv1d_det_fwd(inp.x, inp.weight, inp.bias, activation="silu",
                                         cu_seqlens=inp.cu, initial_state=inp.h0,
                                         output_final_state=True)
    assert saved.plan.block_d_fwd == fixed.block_d_fwd // 2  # the packed rule's plan
    want = causal_conv1d_det_bwd(inp.dy, inp.dfs, saved)
    got = causal_conv1d_det_bwd(inp.dy, inp.dfs, saved, workspace=ws)
    for a, b in zip(got, want, strict=True):
        assert (a is None and b is None) or bitwise_equal(a, b)
    auto = conv.run_cake(inp, "silu", workspace=ws)  # the entry takes the workspace's plan
    assert bitwise_equal(auto["y"], y) and bitwise_equal(auto["dx"], want.dx)


def test_manifest():
    import importlib

    from cake_causal_conv1d_det_train.cake_build import FAMILY, manifest
    from cake_core.build import validate_manifest
    from cake_core.families import family_info

    m = manifest()
    assert validate_manifest(m) == [] and m["source_digest"].startswith("sha256:")
    assert family_info(FAMILY).name == "cake-causal-conv1d-det-train"
    for k in m["kernels"]:
        assert hasattr(importlib.import_module(k["module"]), k["function"])
    import cake_causal_conv1d_det_train as pkg

    assert m["version"] == pkg.__version__
    for name in m["entry_points"] + pkg.__all__:
        assert hasattr(pkg, name)


def test_import_is_lazy():
    code = ("import sys, cake_causal_conv1d_det_train, cake_causal_conv1d_det_train.cake_build;"
            "print('triton' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
