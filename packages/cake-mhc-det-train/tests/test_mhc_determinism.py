"""Gradients are bitwise repeatable under one plan; a reordered dphi sum is not (so the test
can fail: the input is sensitive to the order atomics would impose)."""

import dataclasses

import torch
from _mhc_cases import DEV, cake_run, make
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_same_output_across_processes,
    bitwise_equal,
)
from cake_mhc_det_train import MHCDetWorkspace, make_plan

GRADS = ("U", "Y", "dX", "dphi", "dalpha", "dbias", "dB")


def _plan(C, dtype, slices):
    return dataclasses.replace(make_plan(4, C, dtype, DEV), dphi_slices=slices, dx_block_t=16)


def test_repeat_bitwise_five_runs_with_other_work_between():
    case = make(64, 4, 16, torch.bfloat16, seed=21)

    def step():
        out = cake_run(case)
        return [out[k] for k in GRADS]

    def noise():  # other kernels between repeats
        other = make(5, 2, 8, torch.float32, seed=3)
        cake_run(other)

    assert_bitwise_repeat(step, repeats=5, between=noise)


def test_reordered_partial_sum_changes_bits():
    """dphi as the kernels sum it vs the same per-slice partials summed in other orders (what
    atomics would do). At least one order differs; a repeat of the det path does not."""
    case = make(100, 4, 16, torch.float32, seed=22)
    plan = _plan(16, torch.float32, 8)  # 7 token blocks over 8 slices: one slice empty
    ws = MHCDetWorkspace.for_plan(plan, DEV)
    ordered = cake_run(case, plan=plan, workspace=ws)["dphi"]
    parts = ws["dphi_partials"].clone()
    assert torch.isfinite(parts).all()
    gen = torch.Generator().manual_seed(0)
    differs = 0
    for _ in range(20):
        perm = torch.randperm(parts.shape[0], generator=gen)
        s = torch.zeros_like(parts[0])
        for i in perm.tolist():  # sequential fp32 adds in arrival order
            s = s + parts[i]
        differs += not bitwise_equal(s, ordered)
    assert differs > 0, "no reordering changed the bits: this input cannot detect atomics"
    again = cake_run(case, plan=plan, workspace=ws)["dphi"]
    assert bitwise_equal(again, ordered)


def test_other_plan_other_order():
    """Bits are promised per plan: another dphi_slices regroups the sum over tokens."""
    case = make(100, 4, 16, torch.float32, seed=23)
    dphis = [cake_run(case, plan=_plan(16, torch.float32, s))["dphi"] for s in (1, 3, 7)]
    assert any(not bitwise_equal(dphis[0], d) for d in dphis[1:])


_HASH_SCRIPT = """
import hashlib, sys, torch
sys.path.insert(0, %r)
from _mhc_cases import cake_run, make
from cake_core.testing import bits
out = cake_run(make(20, 4, 16, torch.bfloat16, seed=5))
d = hashlib.sha256()
for k in ("U", "Y", "dX", "dphi", "dalpha", "dbias", "dB"):
    d.update(bits(out[k]).cpu().numpy().tobytes())
print(d.hexdigest())
"""


def test_same_bits_process_after_process():
    from pathlib import Path

    assert_same_output_across_processes(_HASH_SCRIPT % str(Path(__file__).parent))
