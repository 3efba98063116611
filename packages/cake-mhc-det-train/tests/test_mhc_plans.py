"""The plan rule: valid plans for every n and a range of C on CUDA and the CPU, by rule."""

import json

import pytest
import torch
from _mhc_cases import DEV, cake_run, make
from cake_mhc_det_train import MHCDetPlan, make_plan
from cake_mhc_det_train import plan as plan_mod


@pytest.mark.parametrize("n", [2, 4, 8])
def test_rule_gives_valid_plans(n, monkeypatch):
    monkeypatch.setattr(plan_mod, "sm_count", lambda d: 132)
    for C in (1, 5, 16, 100, 2048, 4096, 7168, 65536):
        for dev in ("cuda", "cpu"):
            p = plan_mod._rule(n, C, torch.device(dev))
            assert isinstance(p, MHCDetPlan) and p.n_streams == n and p.hidden_size == C
            assert p.block_m >= 2 * n + n * n
            assert MHCDetPlan.from_dict(json.loads(p.to_json())) == p
    big = plan_mod._rule(4, 7168, torch.device("cuda"))
    small = plan_mod._rule(4, 2048, torch.device("cuda"))
    assert big.dphi_slices <= small.dphi_slices and big.dot_precision == "tf32x3"


def test_make_plan_checks_and_caches():
    p = make_plan(4, 24, torch.float32, "cpu")
    assert p is make_plan(4, 24, torch.float32, "cpu") and p.dot_precision == "ieee"
    for args, msg in (((4, 0), "hidden_size"), ((4, 65537), "hidden_size"),
                      ((True, 8), "n_streams"), ((16, 8), "n_streams")):
        with pytest.raises(ValueError, match=msg):
            make_plan(*args, torch.float32, "cpu")
    with pytest.raises(ValueError, match="dtype"):
        make_plan(4, 8, torch.int32, "cpu")
    with pytest.raises(ValueError, match="device"):
        make_plan(4, 8, torch.float32, "nodevice")
    if not torch.cuda.is_available():  # the rule reads the SM count: a ValueError, not torch's
        with pytest.raises(ValueError, match="CUDA is not available here"):
            make_plan(4, 4096, torch.bfloat16, "cuda")


def test_plans_are_dtype_agnostic():
    """Fresh-user review: a plan made for bf16 is accepted with fp32 inputs (and the
    reverse). By design: the rule reads no dtype, so both make_plan calls give one plan, and
    a plan 'for' the other dtype runs to the same bits as the default plan."""
    for n, C in ((2, 8), (4, 16)):
        p32 = make_plan(n, C, torch.float32, DEV)
        assert make_plan(n, C, torch.bfloat16, DEV) is p32
        assert make_plan(n, C, torch.float16, DEV) is p32
    for dt, made_for in ((torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)):
        case = make(6, 4, 16, dt, seed=3)
        default = cake_run(case, iters=5)
        other = cake_run(case, iters=5, plan=make_plan(4, 16, made_for, DEV))
        for k in ("U", "Y", "dX", "dphi", "dalpha", "dbias", "dB"):
            assert torch.equal(default[k], other[k]), k
