"""is_supported_nondet / workspace_bytes_nondet / saved_bytes_nondet against what the nondet
entry checks, allocates and keeps (issue 45)."""

import dataclasses

import cake_gdn_det_train.api as det_api
import pytest
import torch
from _gdn_nd_cases import DEV, make_inputs
from cake_core.support import owned_nbytes
from cake_gdn_det_train import make_plan
from cake_gdn_nondet_train import (
    GDNNondetWorkspace,
    chunk_gated_delta_rule_nondet,
    is_supported_nondet,
    make_nondet_plan,
    saved_bytes_nondet,
    workspace_bytes_nondet,
)


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched")

    for name in ("_launch_fwd", "_launch_bwd", "_l2norm"):
        monkeypatch.setattr(det_api, name, boom)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_workspace_bytes_nondet_is_what_for_plan_allocates(dtype):
    for K, V in ((16, 16), (100, 7)):
        try:
            plan = make_nondet_plan(K, V, dtype, DEV)
        except ValueError:  # a head size this device refuses (CUDA: fp32 needs K <= 64)
            assert str(DEV).startswith("cuda") and K > 64
            continue
        for HV, tokens, seqs in ((1, 0, 1), (3, 65, 2), (8, 257, 17)):
            kw = dict(num_v_heads=HV, max_tokens=tokens, max_seqs=seqs, dtype=dtype)
            ws = GDNNondetWorkspace.for_plan(plan, DEV, **kw)
            assert workspace_bytes_nondet(plan, **kw) == ws.nbytes
    det = make_plan(16, 16, torch.float32, DEV)
    with pytest.raises(ValueError) as want:
        GDNNondetWorkspace.for_plan(det, DEV, num_v_heads=1, max_tokens=1)
    with pytest.raises(ValueError) as got:
        workspace_bytes_nondet(det, num_v_heads=1, max_tokens=1)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("keep", (0, 1))
def test_saved_bytes_nondet_is_what_the_entry_keeps(keep):
    q, k, v, g, beta, h0 = make_inputs(1, 70, 2, 4, 16, 16, torch.bfloat16, n_states=2,
                                       h0=True)
    plan = dataclasses.replace(make_nondet_plan(16, 16, torch.bfloat16, DEV), keep_states=keep)
    kw = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, use_qk_l2norm_in_kernel=True,
              cu_seqlens=torch.tensor([0, 6, 70], dtype=torch.int32, device=DEV), plan=plan)
    for t in (q, k, v, g, beta):
        t.requires_grad_(True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        chunk_gated_delta_rule_nondet(**kw)
    inputs = [t for t in kw.values() if isinstance(t, torch.Tensor)]
    assert saved_bytes_nondet(**kw) == owned_nbytes(packed, exclude=inputs)


def test_is_supported_nondet(no_launch):
    q, k, v, g, beta, _ = make_inputs(1, 10, 2, 4, 16, 16)
    assert is_supported_nondet(q, k, v, g, beta)
    before = [t.clone() for t in (q, k, v, g, beta)]
    for kw in (dict(plan=make_plan(16, 16, torch.float32, DEV)), dict(scale=-1.0),
               dict(chunk_size=32), dict(initial_state=torch.zeros(2, 4, 16, 16))):
        s = is_supported_nondet(q, k, v, g, beta, **kw)
        with pytest.raises(ValueError) as want:
            chunk_gated_delta_rule_nondet(q, k, v, g, beta, **kw)
        assert not s and s.reason == str(want.value)
        with pytest.raises(ValueError) as got:
            saved_bytes_nondet(q, k, v, g, beta, **kw)
        assert str(got.value) == str(want.value)
    for t, b in zip((q, k, v, g, beta), before, strict=True):
        assert torch.equal(t, b)
