"""Outputs fully written, torch.compile through the custom ops, the module, imports."""

import dataclasses

import cake_mhc_det_train.api as api
import pytest
import torch
from _mhc_cases import DEV, F64, branch, cake_run, make, ref_run
from cake_core.testing import (
    assert_close_to_reference,
    assert_imports_without_triton,
    bitwise_equal,
    poison_,
    randn,
)
from cake_mhc_det_train import (
    HyperConnection,
    MHCDetSavedSet,
    MHCDetWorkspace,
    collapse_streams,
    expand_streams,
    make_plan,
    mhc_det_finish,
    mhc_det_prepare,
    mhc_reference,
)

BACKEND = "aot_eager" if DEV.type == "cpu" else "inductor"
KEYS = ("U", "Y", "H_res", "dX", "dphi", "dalpha", "dbias", "dB")


@pytest.mark.parametrize("T", [0, 37])
def test_poisoned_outputs_fully_written(T, monkeypatch):
    """Every buffer the launches allocate (outputs, coefficients, partials, scratch) starts as
    NaN: the results come back finite with the bits of a clean run (tail tokens, channel
    tails, empty slices included)."""
    case = make(T, 4, 20, torch.float32, seed=31)
    plan = dataclasses.replace(make_plan(4, 20, torch.float32, DEV), dphi_slices=5,
                               dx_block_t=16, coef_block_t=16, fin_block_t=4, fin_block_c=16,
                               coef_block_c=16, dx_block_c=16)
    clean = cake_run(case, plan=plan)
    monkeypatch.setattr(api, "_empty", lambda *a, **k: poison_(torch.empty(*a, **k)))
    dirty = cake_run(case, plan=plan)
    for k in KEYS:
        assert torch.isfinite(dirty[k]).all(), k
        assert bitwise_equal(dirty[k], clean[k]), k


def test_unused_u_or_y_still_differentiates():
    """Only Y used (U's gradient arrives as None) and only U used (no finish)."""
    case = make(9, 2, 16, torch.float32, seed=3)
    X = case["X"].clone().requires_grad_()
    phi = case["phi"].clone().requires_grad_()
    U, h = mhc_det_prepare(X, phi, case["alpha"], case["bias"])
    mhc_det_finish(X, U.detach(), h).sum().backward()
    assert torch.isfinite(X.grad).all() and torch.isfinite(phi.grad).all()
    X2 = case["X"].clone().requires_grad_()
    U2, _ = mhc_det_prepare(X2, phi, case["alpha"], case["bias"])
    U2.sum().backward()
    assert torch.isfinite(X2.grad).all()


def test_compile_fullgraph_same_bits():
    """Eager and torch.compile(fullgraph) give the same bits, with one workspace shared by
    two layers and a 4-D input (its reshape inside the graph)."""
    torch._dynamo.reset()
    case = make(None, 4, 16, torch.float32, seed=41, lead=(3, 7))
    plan = dataclasses.replace(make_plan(4, 16, torch.float32, DEV), dphi_slices=3)
    ws = MHCDetWorkspace.for_plan(plan, DEV)

    def f(X, phi, alpha, bias, W, dY):
        U, h = mhc_det_prepare(X, phi, alpha, bias, plan=plan, workspace=ws)
        Y = mhc_det_finish(X, branch(U, W), h)
        U2, h2 = mhc_det_prepare(Y, phi, alpha, bias, plan=plan, workspace=ws)
        Y2 = mhc_det_finish(Y, branch(U2, W), h2)
        return (Y2 * dY).sum()

    outs = []
    for fn in (f, torch.compile(f, fullgraph=True, backend=BACKEND)):
        leaves = [case[k].clone().requires_grad_() for k in ("X", "phi", "alpha", "bias")]
        loss = fn(*leaves, case["W"], case["dY"])
        loss.backward()
        outs.append([loss.detach()] + [t.grad for t in leaves])
    for a, b in zip(*outs, strict=True):
        assert bitwise_equal(a, b)


def test_hyper_connection_module_matches_reference():
    torch.manual_seed(0)
    C, n = 16, 4
    lin = torch.nn.Linear(C, C, dtype=torch.float32, device=DEV)
    hc = HyperConnection(lin, C, n, sinkhorn_iters=7, device=DEV)
    assert set(dict(hc.named_parameters())) == {"phi", "alpha", "bias", "branch.weight",
                                                "branch.bias"}
    assert "n_streams=4" in repr(hc)
    x = randn((2, 5, C), torch.float32, DEV, seed=1)
    X = expand_streams(x, n)
    assert X.shape == (2, 5, n, C) and X.is_contiguous()
    with torch.no_grad():
        hc.phi.normal_(std=0.3)
        hc.alpha.fill_(0.7)
    Y = hc(X)
    Y.square().sum().backward()
    got = [p.grad.clone() for p in hc.parameters()]
    hc.zero_grad()
    hc64 = HyperConnection(torch.nn.Linear(C, C, dtype=F64, device=DEV), C, n,
                           sinkhorn_iters=7, device=DEV)
    hc64.load_state_dict(hc.state_dict())
    hc64.double()
    Yr = mhc_reference(X.double(), hc64.phi, hc64.alpha, hc64.bias, hc64.branch,
                       sinkhorn_iters=7, dtype=F64)
    Yr.square().sum().backward()
    assert_close_to_reference(Y, Yr, torch.float32, "Y")
    for g, p in zip(got, hc64.parameters(), strict=True):
        assert_close_to_reference(g, p.grad, torch.float32, "grad", tol=3e-5)
    out = collapse_streams(Y)
    assert out.shape == (2, 5, C)
    assert torch.allclose(out, Y.mean(-2))


def test_module_initialisation_is_a_plain_residual_on_equal_streams():
    """At init with equal streams every output stream is x + branch(x) up to alpha * mix."""
    C, n = 16, 4
    lin = torch.nn.Linear(C, C, device=DEV)
    hc = HyperConnection(lin, C, n, device=DEV)
    with torch.no_grad():
        hc.phi.zero_()
    x = randn((7, C), torch.float32, DEV, seed=2)
    Y = hc(expand_streams(x, n))
    want = x + lin(x)
    assert (Y - want[:, None, :]).abs().max() < 1e-5


def test_module_bad_arguments():
    lin = torch.nn.Linear(8, 8)
    for kw, msg in (({"n_streams": 3}, "n_streams"), ({"hidden_size": 0}, "hidden_size"),
                    ({"sinkhorn_iters": 0}, "sinkhorn_iters")):
        args = {"hidden_size": 8, **kw}
        with pytest.raises(ValueError, match=msg):
            HyperConnection(lin, **args)
    with pytest.raises(ValueError, match="n: must be one of"):
        expand_streams(torch.zeros(2, 8), 5)
    with pytest.raises(ValueError, match="branch: expected a module or callable"):
        HyperConnection(None, 8)


def test_module_with_a_callable_branch_registers_nothing_else():
    lin = torch.nn.Linear(8, 8, device=DEV)
    hc = HyperConnection(lambda u: lin(u), 8, 2, device=DEV)
    assert set(dict(hc.named_parameters())) == {"phi", "alpha", "bias"}
    X = expand_streams(randn((3, 8), torch.float32, DEV, seed=4), 2)
    hc(X).sum().backward()
    assert lin.weight.grad is not None and hc.phi.grad is not None


def test_module_takes_a_branch_output_of_any_strides():
    """A branch whose output's last dim is strided (here a column-major view) raised the
    finish's ValueError from inside the module; the module serves any branch: it gives the
    bits of the same output made contiguous."""
    lin = torch.nn.Linear(8, 8, device=DEV)

    def strided(u):  # lin(u) as (W u^T)^T + b: last-dim stride T, not 1
        return (lin.weight @ u.reshape(-1, 8).t()).t().reshape(u.shape) + lin.bias

    X = expand_streams(randn((2, 3, 8), torch.float32, DEV, seed=5), 4).requires_grad_()
    out = []
    for br in (strided, lambda u: strided(u).contiguous()):
        hc = HyperConnection(br, 8, 4, device=DEV)
        torch.manual_seed(1)
        hc.reset_parameters()
        Y = hc(X)
        out += [Y, *torch.autograd.grad(Y.square().sum(), (X, hc.phi, lin.weight))]
    assert all(bitwise_equal(a, b) for a, b in zip(out[:4], out[4:], strict=True))


def test_handle_contents():
    case = make(11, 8, 12, torch.bfloat16, seed=4)
    U, h = mhc_det_prepare(case["X"], case["phi"], case["alpha"], case["bias"],
                           sinkhorn_iters=5)
    assert isinstance(h, MHCDetSavedSet) and h.sinkhorn_iters == 5 and h.x_shape == (11, 8, 12)
    assert h.coef.shape == (11, 80) and h.coef.dtype == torch.float32
    assert U.dtype == torch.bfloat16 and "MHCDetSavedSet(mode=det" in repr(h)


def test_bf16_parity_against_reference_default_plan_4d():
    case = make(None, 2, 24, torch.bfloat16, lead=(2, 9), seed=8)
    got, ref = cake_run(case), ref_run(case)
    for k in ("U", "Y", "dX", "dphi", "dbias", "dB"):
        assert_close_to_reference(got[k], ref[k].reshape(got[k].shape), torch.bfloat16, k)


def test_import_without_triton_and_manifest():
    assert_imports_without_triton("cake_mhc_det_train", "cake_mhc_det_train.cake_build")
    from cake_core.build import validate_manifest
    from cake_core.naming import check_name
    from cake_mhc_det_train import __version__, cake_build

    m = cake_build.manifest()
    assert validate_manifest(m) == []
    assert m["version"] == __version__
    assert check_name("cake-mhc-det-train") == []


def test_finish_dx_part_added_inside_the_dx_kernel(monkeypatch):
    """Same X in both calls: the finish's dX part reaches the prepare's backward (one fp32
    add in the dX kernel). Another X in the finish: each gets its own gradient."""
    seen = []
    real = api._launch_prepare_bwd

    def spy(dU, dcoef, dX_in, *rest):
        seen.append(dX_in is not None)
        return real(dU, dcoef, dX_in, *rest)

    monkeypatch.setattr(api, "_launch_prepare_bwd", spy)
    case = make(30, 4, 16, torch.float32, seed=51)
    got = cake_run(case)
    assert seen == [True]
    ref = ref_run(case)
    assert_close_to_reference(got["dX"], ref["dX"], torch.float32, "dX", tol=3e-5)
    # the finish on another tensor with X's values: X gets the prepare's part only
    X = case["X"].clone().requires_grad_()
    X2 = case["X"].clone().requires_grad_()
    U, h = mhc_det_prepare(X, case["phi"], case["alpha"], case["bias"])
    Y = mhc_det_finish(X2, branch(U, case["W"]), h)
    (Y * case["dY"]).sum().backward()
    assert seen == [True, False]
    assert_close_to_reference(X.grad + X2.grad, ref["dX"], torch.float32, "dX", tol=3e-5)


def test_module_and_stream_helpers_refuse_bad_arguments_with_value_error():
    """Breaker findings: a float n (``4.0 in (2, 4, 8)`` is True) used to reach torch as a
    TypeError, ``sinkhorn_iters`` / ``eps`` out of the prepare's range were accepted by the
    module and only refused at the first forward, and the stream helpers raised IndexError /
    TypeError (or returned a NaN mean over zero streams) instead of ValueError."""
    lin = torch.nn.Linear(8, 8)
    for kw, msg in (({"n_streams": 4.0}, "n_streams"), ({"sinkhorn_iters": 101}, "sinkhorn_iters"),
                    ({"eps": 0.0}, "eps"), ({"eps": float("nan")}, "eps")):
        with pytest.raises(ValueError, match=msg):
            HyperConnection(lin, 8, **kw)
    x = torch.zeros(2, 8)
    for bad, n in ((x, 2.0), (x, True), (torch.tensor(1.0), 2), ([1.0, 2.0], 2)):
        with pytest.raises(ValueError):
            expand_streams(bad, n)
    for bad in (torch.zeros(4), torch.tensor(1.0), torch.zeros(3, 0, 4), torch.zeros(3, 3, 4),
                torch.ones(3, 2, 4, dtype=torch.long), [[1.0], [2.0]]):
        with pytest.raises(ValueError):
            collapse_streams(bad)
    assert torch.equal(collapse_streams(torch.ones(3, 2, 4)), torch.ones(3, 4))


def test_compile_dynamic_fullgraph_same_bits():
    """Breaker finding: ``torch.compile(dynamic=True, fullgraph=True)`` failed in the eps
    check (``math.isfinite`` of a traced float is a graph break). One compiled function over
    several token counts (0 included) gives the eager bits."""
    torch._dynamo.reset()
    case = make(5, 2, 8, torch.float32, seed=43)

    def f(X, phi, alpha, bias):
        U, h = mhc_det_prepare(X, phi, alpha, bias, sinkhorn_iters=3)
        return mhc_det_finish(X, torch.tanh(U), h)

    cf = torch.compile(f, fullgraph=True, backend=BACKEND, dynamic=True)
    for T in (5, 0):
        X = randn((T, 2, 8), torch.float32, DEV, seed=T)
        outs = []
        for fn in (f, cf):
            leaves = [X.clone().requires_grad_()] + [
                case[k].clone().requires_grad_() for k in ("phi", "alpha", "bias")]
            Y = fn(*leaves)
            Y.sum().backward()
            outs.append([Y.detach()] + [t.grad for t in leaves])
        for a, b in zip(*outs, strict=True):
            assert bitwise_equal(a, b)


def test_double_backward_refused_not_silent():
    """Fresh-user review: double backward must fail loudly, as in the other cake families
    (once_differentiable), through either call, for every differentiable input, and through
    the module."""
    case = make(5, 4, 16, torch.float32, seed=8)
    for wrt in ("X", "phi", "alpha", "bias", "B"):
        leaves = {k: case[k].clone().requires_grad_() for k in ("X", "phi", "alpha", "bias")}
        U, h = mhc_det_prepare(leaves["X"], leaves["phi"], leaves["alpha"], leaves["bias"])
        B = branch(U, case["W"])
        Y = mhc_det_finish(leaves["X"], B, h)
        (g,) = torch.autograd.grad(Y.pow(3).sum(), leaves.get(wrt, B), create_graph=True)
        with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
            g.pow(2).sum().backward()
    X = case["X"].clone().requires_grad_()  # the prepare alone
    U, _ = mhc_det_prepare(X, case["phi"], case["alpha"], case["bias"])
    (g,) = torch.autograd.grad(U.pow(3).sum(), X, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
        g.pow(2).sum().backward()
    hc = HyperConnection(torch.nn.Linear(16, 16, device=DEV), 16, 4, sinkhorn_iters=3,
                         device=DEV)
    X = case["X"].clone().requires_grad_()
    (g,) = torch.autograd.grad(hc(X).pow(3).sum(), X, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
        g.pow(2).sum().backward()
