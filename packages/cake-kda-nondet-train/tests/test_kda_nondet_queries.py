"""is_supported_nondet / workspace_bytes_nondet / saved_bytes_nondet against what the nondet
entry checks, allocates and keeps (issue 45)."""

import cake_kda_det_train.api as det_api
import pytest
import torch
from _kda_nd_cases import DEV, cu_of, make
from cake_core.support import owned_nbytes
from cake_kda_det_train import KDADetWorkspace, make_plan
from cake_kda_nondet_train import (
    KDANondetWorkspace,
    chunk_kda_nondet,
    is_supported_nondet,
    make_nondet_plan,
    saved_bytes_nondet,
    workspace_bytes_nondet,
)


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched")

    for name in ("_launch_fwd", "_launch_bwd", "_l2norm", "kda_chunk_fwd", "kda_chunk_bwd"):
        monkeypatch.setattr(det_api, name, boom)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_workspace_bytes_nondet_is_what_for_plan_allocates(dtype):
    for K, V in ((16, 16), (100, 7)):
        plan = make_nondet_plan(K, V, dtype, DEV)
        for HV, tokens, seqs in ((1, 0, 1), (3, 65, 2), (8, 257, 17)):
            kw = dict(num_v_heads=HV, max_tokens=tokens, max_seqs=seqs, dtype=dtype)
            ws = KDANondetWorkspace.for_plan(plan, DEV, **kw)
            assert workspace_bytes_nondet(plan, **kw) == ws.nbytes
    det = make_plan(16, 16, torch.float32, DEV)
    with pytest.raises(ValueError) as want:
        KDANondetWorkspace.for_plan(det, DEV, num_v_heads=1, max_tokens=1)
    with pytest.raises(ValueError) as got:
        workspace_bytes_nondet(det, num_v_heads=1, max_tokens=1)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("raw, state_dtype", ((False, torch.float32), (True, torch.float32),
                                               (False, torch.bfloat16)))
def test_saved_bytes_nondet_is_what_the_entry_keeps(raw, state_dtype):
    """With a 16-bit initial_state the entry keeps its fp32 copy (counted)."""
    q, k, v, g, beta, h0, A_log, dt_bias = make(1, 70, 2, 4, 16, 16, seed=3, raw=raw,
                                                n_states=2)
    h0 = h0.to(state_dtype)
    kw = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, cu_seqlens=cu_of([6, 64]),
              use_qk_l2norm_in_kernel=raw)
    if raw:
        kw.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                  use_beta_sigmoid_in_kernel=True)
    for t in (q, k, v, g, beta):
        t.requires_grad_(True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        chunk_kda_nondet(**kw)
    inputs = [t for t in kw.values() if isinstance(t, torch.Tensor)]
    want = saved_bytes_nondet(**kw)
    assert want == owned_nbytes(packed, exclude=inputs)
    if state_dtype != torch.float32:
        assert want == saved_bytes_nondet(**{**kw, "initial_state": h0.float()}) + \
            h0.numel() * 4


def test_is_supported_nondet(no_launch):
    q, k, v, g, beta, *_ = make(1, 10, 2, 4, 16, 16, seed=1, h0=False)
    assert is_supported_nondet(q, k, v, g, beta)
    h16 = torch.randn(1, 4, 16, 16, device=DEV).bfloat16()  # taken as fp32, as FLA
    h_before = h16.clone()
    assert is_supported_nondet(q, k, v, g, beta, initial_state=h16)
    assert h16.dtype == torch.bfloat16 and torch.equal(h16, h_before)
    before = [t.clone() for t in (q, k, v, g, beta)]
    det_ws = KDADetWorkspace.for_plan(make_plan(16, 16, torch.float32, DEV), DEV,
                                      num_v_heads=4, max_tokens=10)
    for kw in (dict(plan=make_plan(16, 16, torch.float32, DEV)), dict(workspace=det_ws),
               dict(scale=-1.0), dict(chunk_size=32), dict(lower_bound=1.0),
               dict(initial_state=torch.zeros(2, 4, 16, 16))):
        s = is_supported_nondet(q, k, v, g, beta, **kw)
        with pytest.raises(ValueError) as want:
            chunk_kda_nondet(q, k, v, g, beta, **kw)
        assert not s and s.reason == str(want.value)
        with pytest.raises(ValueError) as got:
            saved_bytes_nondet(q, k, v, g, beta, **kw)
        assert str(got.value) == str(want.value)
    for t, b in zip((q, k, v, g, beta), before, strict=True):
        assert torch.equal(t, b)
