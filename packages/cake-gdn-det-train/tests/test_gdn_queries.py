"""is_supported / workspace_bytes / saved_bytes against what the entry checks, allocates and
keeps (issue 45)."""

import dataclasses
import importlib.util
from pathlib import Path

import cake_gdn_det_train.api as api
import pytest
import torch
from cake_core.support import owned_nbytes
from cake_core.triton_utils import default_device
from cake_gdn_det_train import (
    GDNDetWorkspace,
    chunk_gated_delta_rule_det,
    is_supported,
    make_plan,
    saved_bytes,
    workspace_bytes,
)


def _sibling(name):
    """A module of this folder (the tests import in importlib mode: no sys.path entry)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_gdn_q_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


make_gdn_inputs = _sibling("conftest").make_gdn_inputs
CASES = _sibling("test_gdn_bad_inputs").CASES
DEV = default_device()
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_workspace_bytes_is_what_for_plan_allocates(dtype):
    for K, V in ((16, 16), (32, 128), (100, 7), (256, 64)):
        try:
            base = make_plan(K, V, dtype, DEV)
        except ValueError:  # a head size this device refuses (CUDA: fp32 needs K <= 64)
            assert str(DEV).startswith("cuda") and K > 64
            continue
        for plan in (base, dataclasses.replace(base, store_16bit=0),
                     dataclasses.replace(base, keep_states=1)):
            for HV in (1, 3, 8):
                for tokens in (0, 1, 63, 64, 65, 257):
                    for seqs in (1, 2, 17):
                        kw = dict(num_v_heads=HV, max_tokens=tokens, max_seqs=seqs, dtype=dtype)
                        try:
                            ws = GDNDetWorkspace.for_plan(plan, DEV, **kw)
                        except ValueError as e:  # a plan this device refuses: the same words
                            with pytest.raises(ValueError) as got:
                                workspace_bytes(plan, **kw)
                            assert str(got.value) == str(e)
                            continue
                        assert workspace_bytes(plan, **kw) == ws.nbytes, (K, V, HV, tokens)
                        assert workspace_bytes(plan, DEV, **kw) == ws.nbytes


def test_workspace_bytes_refuses_as_for_plan():
    plan = make_plan(16, 16, torch.float32, DEV)
    for kw, msg in ((dict(num_v_heads=0, max_tokens=4), "num_v_heads"),
                    (dict(num_v_heads=2, max_tokens=-1), "max_tokens"),
                    (dict(num_v_heads=2, max_tokens=4, max_seqs=0), "max_seqs"),
                    (dict(num_v_heads=2, max_tokens=4, dtype=torch.float64), "dtype")):
        with pytest.raises(ValueError, match=msg) as want:
            GDNDetWorkspace.for_plan(plan, DEV, **kw)
        with pytest.raises(ValueError) as got:
            workspace_bytes(plan, **kw)
        assert str(got.value) == str(want.value)
    with pytest.raises(ValueError, match="plan: expected GDNDetPlan"):
        workspace_bytes(plan.to_dict(), num_v_heads=2, max_tokens=4)


def _kept_by_autograd(kwargs):
    """owned_nbytes of what the autograd entry saves for the backward, less the inputs."""
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunk_gated_delta_rule_det(**kwargs)
    inputs = [t for t in kwargs.values() if isinstance(t, torch.Tensor)]
    return owned_nbytes(packed, exclude=inputs), packed


# (B, T, H, HV, K, V, dtype, cu_seqlens, options)
SAVED_CASES = [
    (2, 20, 2, 4, 16, 16, torch.float32, None, {}),
    (2, 20, 2, 4, 16, 16, torch.float32, None, {"keep": 1, "h0": True}),
    (1, 100, 2, 4, 32, 16, torch.bfloat16, [0, 37, 100],
     {"keep": 1, "l2": True, "h0": torch.bfloat16}),
    (1, 70, 1, 2, 16, 32, torch.float16, [0, 0, 5, 70],
     {"gate": True, "cu64": True, "l2": True}),
    (1, 0, 1, 1, 16, 16, torch.float32, None, {"keep": 1, "final": True}),
]


@pytest.mark.parametrize("case", range(len(SAVED_CASES)))
def test_saved_bytes_is_what_the_entry_keeps(case):
    B, T, H, HV, K, V, dtype, cu, opt = SAVED_CASES[case]
    N = len(cu) - 1 if cu else B
    q, k, v, g, beta, h0 = make_gdn_inputs(B, T, H, HV, K, V, dtype, n_states=N,
                                           h0=bool(opt.get("h0")))
    if h0 is not None and opt["h0"] is not True:
        h0 = h0.to(opt["h0"])
    kw = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
              output_final_state=bool(opt.get("final")),
              use_qk_l2norm_in_kernel=bool(opt.get("l2")))
    if cu is not None:
        kw["cu_seqlens"] = torch.tensor(cu, device=DEV,
                                        dtype=torch.int64 if opt.get("cu64") else torch.int32)
    plan = make_plan(K, V, dtype, DEV)
    if opt.get("keep"):
        kw["plan"] = dataclasses.replace(plan, keep_states=1)
    if opt.get("gate"):
        kw.update(use_gate_in_kernel=True, A_log=torch.rand(HV, device=DEV),
                  dt_bias=torch.rand(HV, device=DEV))
    for t in (q, k, v, g, beta):
        t.requires_grad_(True)
    want = saved_bytes(**kw)
    got, packed = _kept_by_autograd(kw)
    assert want == got, (want, got, [(tuple(t.shape), t.dtype) for t in packed])
    if opt.get("keep") and T:
        assert want > saved_bytes(**{**kw, "plan": plan})  # keep_states keeps more


def test_saved_bytes_refuses_as_the_entry():
    make, msg = CASES["q int"]
    with pytest.raises(ValueError, match=msg):
        saved_bytes(**make())
    q, k, v, g, beta, _ = make_gdn_inputs(1, 8, 1, 1, 16, 16)
    meta = [t.to("meta") for t in (q, k, v, g, beta)]
    with pytest.raises(ValueError, match="q: on meta") as got:  # the entry refuses meta
        saved_bytes(*meta)
    with pytest.raises(ValueError) as want:
        chunk_gated_delta_rule_det(*meta)
    assert str(got.value) == str(want.value)


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr(api, "_launch_fwd", boom)
    monkeypatch.setattr(api, "_l2norm", boom)


_LOW_LEVEL_ONLY = {"initial_state bf16"}  # the autograd entry takes a 16-bit state


@pytest.mark.parametrize("case", [c for c in CASES if "workspace" not in c
                                  and c not in _LOW_LEVEL_ONLY])
def test_is_supported_false_with_the_entry_message(case, no_launch):
    kwargs = CASES[case][0]()
    before = {n: t.clone() for n, t in kwargs.items()
              if isinstance(t, torch.Tensor) and t.device.type != "meta"}
    s = is_supported(**kwargs)
    assert not s and s.ok is False
    for n, t in before.items():
        assert torch.equal(kwargs[n], t), n
    with pytest.raises(ValueError) as want:
        chunk_gated_delta_rule_det(**kwargs)
    assert s.reason == str(want.value)


@pytest.mark.parametrize("fla_kw", [dict(chunk_size=32), dict(cp_context=object()),
                                    dict(cu_seqlens=True)])
def test_is_supported_fla_keywords(fla_kw, no_launch):
    q, k, v, g, beta, _ = make_gdn_inputs(1, 8, 1, 1, 16, 16)
    s = is_supported(q, k, v, g, beta, **fla_kw)
    with pytest.raises(ValueError) as want:
        chunk_gated_delta_rule_det(q, k, v, g, beta, **fla_kw)
    assert not s and s.reason == str(want.value)


def test_is_supported_true_launches_nothing(no_launch):
    q, k, v, g, beta, h0 = make_gdn_inputs(1, 70, 2, 4, 16, 16, torch.bfloat16, n_states=2,
                                           h0=True)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=DEV)
    assert is_supported(q, k, v, g, beta, cu_seqlens=cu)
    assert is_supported(q, k, v, g, beta, initial_state=h0.bfloat16(), cu_seqlens=cu,
                        use_qk_l2norm_in_kernel=True, output_final_state=True,
                        plan=dataclasses.replace(make_plan(16, 16, torch.bfloat16, DEV),
                                                 keep_states=1))
    assert is_supported(q, k, v, g, beta, cu_seqlens=cu, use_gate_in_kernel=True,
                        A_log=torch.zeros(4, device=DEV), use_beta_sigmoid_in_kernel=True,
                        allow_neg_eigval=True, chunk_size=64, cu_seqlens_cpu=None)
