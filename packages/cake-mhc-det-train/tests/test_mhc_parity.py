"""U, Y, the coefficients and every gradient against the float64 reference (autograd
through every Sinkhorn iteration), each n, each dtype, T in {0, 1, 333}."""

import dataclasses

import pytest
import torch
from _mhc_cases import DEV, F64, cake_run, make, ref_coefficients, ref_run
from cake_core.testing import assert_close_to_reference
from cake_mhc_det_train import make_plan

NAMES = ("U", "Y", "dX", "dphi", "dalpha", "dbias", "dB")


def _check(got, ref, dtype, T, names=NAMES, tol=None):
    for name in names:
        g, r = got[name], ref[name]
        assert g.shape == r.reshape(g.shape).shape, name
        if T == 0 and name in ("dphi", "dalpha", "dbias"):
            assert (g == 0).all(), name
            continue
        t = tol
        if t is None and dtype == torch.float32:
            t = 3e-5 if name in ("dphi", "dalpha", "dbias", "dX") else 1e-5
        assert_close_to_reference(g, r.reshape(g.shape), dtype, name, tol=t)


@pytest.mark.parametrize("T", [0, 1, 333])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_parity(n, dtype, T):
    case = make(T, n, 20, dtype, seed=n + T)
    _check(cake_run(case), ref_run(case), dtype, T)


def test_parity_4d_input_and_small_blocks():
    """[B, S, n, C] input; a plan with several channel steps, token blocks and slices."""
    case = make(None, 4, 40, torch.float32, lead=(2, 13), seed=7)
    plan = dataclasses.replace(make_plan(4, 40, torch.float32, DEV), mix_block_c=16,
                               mix_block_t=16, coef_block_t=8, coef_block_c=16, fin_block_t=4,
                               fin_block_c=16, dx_block_t=16, dx_block_c=16, dphi_slices=3,
                               reduce_block_r=2, reduce_block_w=32)
    got = cake_run(case, plan=plan)
    ref = ref_run(case)
    assert got["U"].shape == (2, 13, 40) and got["Y"].shape == (2, 13, 4, 40)
    _check(got, ref, torch.float32, 26)


@pytest.mark.parametrize("iters", [1, 3])
def test_parity_other_iteration_counts(iters):
    case = make(50, 4, 20, torch.float32, seed=3)
    _check(cake_run(case, iters=iters, eps=1e-3), ref_run(case, iters=iters, eps=1e-3),
           torch.float32, 50)


def test_h_res_columns_sum_to_one_rows_match_reference():
    case = make(333, 4, 20, torch.float32, seed=11)
    got = cake_run(case)
    ref = ref_run(case)
    H = got["H_res"].double()
    assert (H.sum(-2) - 1).abs().max() <= 1e-5
    assert (H.sum(-1) - ref["H_res"].sum(-1)).abs().max() <= 1e-5
    assert (H - ref["H_res"]).abs().max() <= 1e-5
    for k in ("H_pre", "H_post"):
        assert (got[k].double() - ref[k]).abs().max() <= 1e-5


# the interpreter's numpy sigmoid warns when exp(-x) overflows to inf (giving the right 0)
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("scale", ["bias", "alpha"])
def test_large_logits_no_overflow(scale):
    """Logits of +-50 (bias) and beyond (alpha_res = 50 times mix): all finite, parity."""
    n = 4
    g = torch.Generator().manual_seed(5)
    signs = (torch.randint(0, 2, (n * n,), generator=g) * 2 - 1).float() * 50
    if scale == "bias":
        case = make(333, n, 20, torch.float32, seed=13, res_bias=signs.to(DEV))
        case["bias"][:2 * n] = signs[:2 * n].to(DEV)  # pre/post sigmoids saturate too
        # a whole column at -50 in every row: the case a plain fp32 exp would lose
        case["bias"][2 * n:].view(n, n)[:, 1] = -50
        case["bias"][2 * n:].view(n, n)[:, 0] = 50
    else:
        case = make(333, n, 20, torch.float32, seed=13, alpha=(50.0, 50.0, 50.0))
    got = cake_run(case)
    ref = ref_run(case)
    for k in ("U", "Y", "H_res", "dX", "dphi", "dalpha", "dbias", "dB"):
        assert torch.isfinite(got[k]).all(), k
    H = got["H_res"].double()
    assert (H.sum(-2) - 1).abs().max() <= 1e-5
    _check(got, ref, torch.float32, 333, tol=3e-4)


def test_max_subtraction_is_harmless_float64():
    """Sinkhorn is invariant to a per-row (so also a per-matrix) factor of exp(h_res): the
    first row normalization cancels it. Checked in float64 with logits up to +-50."""
    g = torch.Generator().manual_seed(0)
    L = (torch.rand(64, 4, 4, generator=g, dtype=F64) * 100 - 50)

    def sk(m, iters=20):
        for _ in range(iters):
            m = m / m.sum(-1, keepdim=True)
            m = m / m.sum(-2, keepdim=True)
        return m

    plain = sk(torch.exp(L))
    per_matrix = sk(torch.exp(L - L.amax((-2, -1), keepdim=True)))
    per_row = sk(torch.exp(L - L.amax(-1, keepdim=True)))
    assert (plain - per_matrix).abs().max() <= 1e-12
    assert (plain - per_row).abs().max() <= 1e-12


def test_reference_module_matches_tests_reference():
    from cake_mhc_det_train import mhc_coefficients_reference

    case = make(40, 4, 20, torch.float32, seed=2)
    args = [case[k].to(F64) for k in ("X", "phi", "alpha", "bias")]
    ours = mhc_coefficients_reference(*args, dtype=F64)
    theirs = ref_coefficients(*args)
    for a, b in zip(ours, theirs, strict=True):
        assert (a - b).abs().max() <= 1e-12
