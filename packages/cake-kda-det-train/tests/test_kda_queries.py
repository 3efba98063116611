"""is_supported / workspace_bytes / saved_bytes against what chunk_kda_det checks, allocates
and keeps (issue 45)."""

import dataclasses
import importlib.util
from pathlib import Path

import cake_kda_det_train.api as api
import pytest
import torch
from cake_core.support import owned_nbytes
from cake_core.triton_utils import default_device
from cake_kda_det_train import (
    KDADetWorkspace,
    chunk_kda_det,
    is_supported,
    make_plan,
    saved_bytes,
    workspace_bytes,
)

DEV = default_device()


def _sibling(name):
    """A module of this folder (the tests import in importlib mode: no sys.path entry)."""
    spec = importlib.util.spec_from_file_location(f"_kda_q_{name}",
                                                  Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_helpers = _sibling("conftest")
_bad = _sibling("test_kda_bad_inputs")
#: the autograd entry's refusals (a 16-bit initial_state is refused by the low-level only)
CASES = {n: c for n, c in _bad.CASES.items() if n not in _bad.LOW_LEVEL_ONLY}


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16))
def test_workspace_bytes_is_what_for_plan_allocates(dtype):
    for K, V in ((16, 16), (32, 128), (100, 7)):
        base = make_plan(K, V, dtype, DEV)
        for plan in (base, dataclasses.replace(base, store_16bit=0)):
            for HV in (1, 3, 8):
                for tokens in (0, 1, 63, 64, 65, 257):
                    for seqs in (1, 2, 17):
                        kw = dict(num_v_heads=HV, max_tokens=tokens, max_seqs=seqs, dtype=dtype)
                        ws = KDADetWorkspace.for_plan(plan, DEV, **kw)
                        assert workspace_bytes(plan, **kw) == ws.nbytes, (K, V, HV, tokens)
                        assert workspace_bytes(plan, DEV, **kw) == ws.nbytes


def test_workspace_bytes_refuses_as_for_plan():
    plan = make_plan(16, 16, torch.float32, DEV)
    for p, kw in ((plan, dict(num_v_heads=0, max_tokens=4)),
                  (plan, dict(num_v_heads=2, max_tokens=-1)),
                  (plan, dict(num_v_heads=2, max_tokens=4, max_seqs=0)),
                  (plan, dict(num_v_heads=2, max_tokens=4, dtype=torch.float64)),
                  (plan.to_dict(), dict(num_v_heads=2, max_tokens=4))):
        with pytest.raises(ValueError) as want:
            KDADetWorkspace.for_plan(p, DEV, **kw)
        with pytest.raises(ValueError) as got:
            workspace_bytes(p, **kw)
        assert str(got.value) == str(want.value)


# (B, T, H, HV, K, V, dtype, cu_seqlens, options)
SAVED_CASES = [
    (2, 20, 2, 4, 16, 16, torch.float32, None, {"h0": True}),
    (1, 100, 2, 4, 32, 16, torch.bfloat16, [0, 37, 100], {"l2": True, "h0": True}),
    (1, 70, 1, 2, 16, 32, torch.float16, [0, 0, 5, 70],
     {"gate": True, "cu64": True, "l2": True, "final": True}),
    (1, 0, 1, 1, 16, 16, torch.float32, None, {}),
    # a 16-bit initial_state: the entry keeps its fp32 copy
    (1, 100, 2, 4, 32, 16, torch.bfloat16, [0, 37, 37, 100],
     {"l2": True, "h0": torch.bfloat16, "final": True}),
    (2, 20, 2, 4, 16, 16, torch.float32, None, {"h0": torch.float16}),
]


@pytest.mark.parametrize("case", range(len(SAVED_CASES)))
def test_saved_bytes_is_what_the_entry_keeps(case):
    B, T, H, HV, K, V, dtype, cu, opt = SAVED_CASES[case]
    N = len(cu) - 1 if cu else B
    q, k, v, g, beta, h0 = _helpers.make_kda_inputs(B, T, H, HV, K, V, dtype, n_states=N,
                                                    h0=bool(opt.get("h0")))
    if h0 is not None and opt["h0"] is not True:
        h0 = h0.to(opt["h0"])
    kw = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
              output_final_state=bool(opt.get("final")),
              use_qk_l2norm_in_kernel=bool(opt.get("l2")))
    if cu is not None:
        kw["cu_seqlens"] = torch.tensor(cu, device=DEV,
                                        dtype=torch.int64 if opt.get("cu64") else torch.int32)
    if opt.get("gate"):
        A_log, dt_bias = _helpers.make_gate_params(HV, K, seed=3)
        kw.update(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    for t in (q, k, v, g, beta):
        t.requires_grad_(True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        chunk_kda_det(**kw)
    inputs = [t for t in kw.values() if isinstance(t, torch.Tensor)]
    want = saved_bytes(**kw)
    assert want == owned_nbytes(packed, exclude=inputs), \
        [(tuple(t.shape), t.dtype) for t in packed]
    if h0 is not None and h0.dtype != torch.float32:  # the fp32 copy, counted once
        assert want == saved_bytes(**{**kw, "initial_state": h0.float()}) + h0.numel() * 4


def test_saved_bytes_refuses_as_the_entry():
    q, k, v, g, beta, _ = _helpers.make_kda_inputs(1, 8, 1, 1, 16, 16)
    for args, kw in (([t.to("meta") for t in (q, k, v, g, beta)], {}),  # the entry: no meta
                     ((q, k, v, g, beta), dict(scale=0.0)),
                     ((q, k, v, g, beta), dict(chunk_size=32))):
        with pytest.raises(ValueError) as want:
            chunk_kda_det(*args, **kw)
        with pytest.raises(ValueError) as got:
            saved_bytes(*args, **kw)
        assert str(got.value) == str(want.value)


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched")

    for name in ("_launch_fwd", "_launch_bwd", "_l2norm", "_beta_fwd", "_beta_bwd",
                 "kda_chunk_fwd", "kda_chunk_bwd"):
        monkeypatch.setattr(api, name, boom)


@pytest.mark.parametrize("case", list(CASES))
def test_is_supported_false_with_the_entry_message(case, no_launch):
    kwargs = CASES[case][0]()
    before = {n: t.clone() for n, t in kwargs.items()
              if isinstance(t, torch.Tensor) and t.device.type != "meta"}
    s = is_supported(**kwargs)
    assert not s and s.ok is False
    for n, t in before.items():
        assert torch.equal(kwargs[n], t), n
    with pytest.raises(ValueError) as want:
        chunk_kda_det(**kwargs)
    assert s.reason == str(want.value)


def test_is_supported_true_launches_nothing(no_launch):
    q, k, v, g, beta, h0 = _helpers.make_kda_inputs(1, 70, 2, 4, 16, 16, torch.bfloat16,
                                                    n_states=2, h0=True)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=DEV)
    assert is_supported(q, k, v, g, beta, cu_seqlens=cu)
    plan = make_plan(16, 16, torch.bfloat16, DEV)
    ws = KDADetWorkspace.for_plan(plan, DEV, num_v_heads=4, max_tokens=70, max_seqs=2,
                                  dtype=torch.bfloat16)
    assert is_supported(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu,
                        use_qk_l2norm_in_kernel=True, output_final_state=True, plan=plan,
                        workspace=ws)
    for dt in (torch.bfloat16, torch.float16):  # taken as fp32, as FLA (nothing copied)
        h16 = h0.to(dt)
        before = h16.clone()
        assert is_supported(q, k, v, g, beta, initial_state=h16, cu_seqlens=cu,
                            use_qk_l2norm_in_kernel=True, output_final_state=True, plan=plan,
                            workspace=ws)
        assert h16.dtype == dt and torch.equal(h16, before)
    s = is_supported(q, k, v, g, beta, initial_state=h0.double(), cu_seqlens=cu)
    assert not s and "initial_state: expected dtype" in s.reason
    A_log, dt_bias = _helpers.make_gate_params(4, 16, seed=1)
    assert is_supported(q, k, v, g, beta, cu_seqlens=cu, use_gate_in_kernel=True,
                        A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True,
                        allow_neg_eigval=True, chunk_size=64, cu_seqlens_cpu=None)
