"""Parity of cake-rmsnorm-silu-gate-nondet-train's y, dx, dz, dweight with the float64
reference, on a few of cake-rmsnorm-silu-gate-det-train's cases: both gate orders, groups,
both gates, dtypes, the accumulator, the low-level pair, torch.compile."""

import pytest
import torch
from _gate_norm_nd_cases import DEV, make, reference, run
from cake_core.testing import TOLERANCES, assert_close_to_reference, randn, rel_fro_error
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det
from cake_rmsnorm_silu_gate_nondet_train import (
    rmsnorm_silu_gate_nondet,
    rmsnorm_silu_gate_nondet_bwd,
    rmsnorm_silu_gate_nondet_fwd,
)

NAMES = ("y", "dx", "dz", "dweight")


def _check(got, want, dtype):
    for name, a, r in zip(NAMES, got, want, strict=True):
        assert_close_to_reference(a, r, dtype, name)


@pytest.mark.parametrize("dtype,norm_before_gate,group_size,activation", [
    (torch.float32, True, None, "silu"),
    (torch.bfloat16, False, 32, "silu"),
    (torch.float16, True, 24, "sigmoid"),
    (torch.float32, False, None, "swish"),
], ids=["fla-fp32", "mamba-groups-bf16", "kda-sigmoid-groups-fp16", "mamba-swish-fp32"])
def test_parity(dtype, norm_before_gate, group_size, activation):
    x, z, w, dy = make((3, 25, 96), dtype, seed=7)
    kw = dict(norm_before_gate=norm_before_gate, group_size=group_size, activation=activation)
    got = run(rmsnorm_silu_gate_nondet, x, z, w, dy, 1e-5, **kw)
    assert all(t.dtype == dtype for t in got) and got[0].shape == x.shape
    _check(got, reference(x, z, w, dy, 1e-5, **kw), dtype)


def test_zero_rows_and_fp32_weight():
    x, z, w, dy = make((0, 64), seed=3)
    _, dx, dz, dw = run(rmsnorm_silu_gate_nondet, x, z, w, dy)
    assert dx.shape == x.shape and torch.equal(dw, torch.zeros_like(w))
    x, z, w, dy = make((2, 9, 64), torch.bfloat16, seed=4, w_dtype=torch.float32)
    got = run(rmsnorm_silu_gate_nondet, x, z, w, dy)
    assert got[3].dtype == torch.float32
    _check(got, reference(x, z, w, dy), torch.bfloat16)


def test_low_level_matches_autograd_and_det_forward():
    x, z, w, dy = make((33, 80), seed=11)
    kw = dict(norm_before_gate=False, group_size=40, activation="sigmoid")
    y, saved = rmsnorm_silu_gate_nondet_fwd(x, z, w, **kw)
    assert saved.activation == "sigmoid" and saved.group_size == 40
    g = rmsnorm_silu_gate_nondet_bwd(dy, saved)
    y2, dx2, dz2, dw2 = run(rmsnorm_silu_gate_nondet, x, z, w, dy, **kw)
    assert torch.equal(y, y2) and torch.equal(g.dx, dx2) and torch.equal(g.dz, dz2)
    assert torch.equal(g.dweight, dw2)
    # the det package's forward kernel today
    assert torch.equal(y, rmsnorm_silu_gate_det(x, z, w, **kw))


def test_dweight_accumulator():
    x, z, w, dy = make((70, 96), torch.bfloat16, seed=31)
    main_grad = randn((96,), torch.float32, DEV, seed=34)
    start = main_grad.clone()
    xx, zz, ww = (t.clone().requires_grad_() for t in (x, z, w))
    rmsnorm_silu_gate_nondet(xx, zz, ww, dweight_accumulator=main_grad).backward(dy)
    assert ww.grad is None
    dw64 = reference(x, z, w, dy)[3]
    assert rel_fro_error(main_grad - start, dw64) < TOLERANCES[torch.bfloat16]


def test_torch_compile_fullgraph():
    x, z, w, dy = make((9, 64), seed=41)
    fn = torch.compile(lambda a, b, c, eps, **kw: rmsnorm_silu_gate_nondet(a, b, c, eps, **kw),
                       fullgraph=True, backend="aot_eager")
    kw = dict(norm_before_gate=False, group_size=16)
    _check(run(fn, x, z, w, dy, **kw), reference(x, z, w, dy, **kw), torch.float32)
