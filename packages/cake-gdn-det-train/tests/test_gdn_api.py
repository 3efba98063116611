"""Package surface: lazy imports, manifest, plans, saved set, reference self-consistency."""

import dataclasses

import pytest
import torch
from cake_core import Mode
from cake_core.testing import assert_close_to_reference, assert_imports_without_triton
from cake_core.triton_utils import default_device
from cake_gdn_det_train import (
    GDNDetPlan,
    GDNDetSavedSet,
    chunk_gated_delta_rule_det,
    chunk_gdn_det_fwd,
    gdn_reference,
    make_plan,
)

DEV = default_device()


def test_import_is_lazy():
    assert_imports_without_triton("cake_gdn_det_train", "cake_gdn_det_train.cake_build")


def test_public_names():
    import cake_gdn_det_train as pkg

    for name in pkg.__all__:
        assert getattr(pkg, name) is not None
    assert callable(pkg.chunk_gated_delta_rule_det) and callable(pkg.chunk_gdn_det_bwd)


def test_manifest():
    from cake_core.build import validate_manifest
    from cake_gdn_det_train.cake_build import FAMILY, manifest

    m = manifest()
    assert validate_manifest(m) == []
    assert m["source_digest"].startswith("sha256:") and FAMILY["name"] == "cake-gdn-det-train"
    import importlib

    for k in m["kernels"]:
        assert hasattr(importlib.import_module(k["module"]), k["function"])


def test_shared_helpers_from_cake_core():
    """The reference's eps is the kernels' (cake-core's), and the workspace's chunk bound is
    cake-core's with GDN's chunk size."""
    from cake_core import l2norm, varlen
    from cake_gdn_det_train.plan import CHUNK_SIZE
    from cake_gdn_det_train.reference import L2NORM_EPS
    from cake_gdn_det_train.saved import max_chunks

    assert L2NORM_EPS == l2norm.L2NORM_EPS == 1e-6
    for n, s in ((0, 1), (63, 1), (64, 1), (65, 2), (200, 5)):
        assert max_chunks(n, s) == varlen.max_chunks(n, s, CHUNK_SIZE)
    assert max_chunks(65, 2) == 2 and max_chunks(200, 5) == 8


@pytest.mark.parametrize("K,V", [(16, 16), (64, 64), (128, 128), (100, 48), (256, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_plan_rule_and_roundtrip(K, V, dtype):
    if DEV.type == "cuda" and (max(K, V) > 128 or (dtype == torch.float32 and K > 64)):
        with pytest.raises(ValueError, match="on CUDA"):
            make_plan(K, V, dtype, DEV)
        return
    plan = make_plan(K, V, dtype, DEV)
    assert plan.block_k >= max(K, 16) and plan.mode == Mode.DET
    assert plan.store_16bit == int(plan.block_k >= 32 and V > 16)
    if DEV.type == "cuda":  # ieee spills registers; tf32x3 is close to fp32; with 16-bit
        # intermediates only the chunk solve is an fp32 dot, and tf32 is enough there
        wide = dtype != torch.float32 and plan.store_16bit
        assert plan.dot_precision == ("tf32" if wide else "tf32x3")
    else:                   # the interpreter computes fp32 whatever the field says
        assert plan.fp32_dots == 1 and plan.dot_precision == "ieee"
    assert GDNDetPlan.from_dict(plan.to_dict()) == plan
    assert make_plan(K, V, dtype, DEV) is plan  # cached: a pure function of its key
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.block_k = 32


def test_plan_refuses_16bit_dots_on_16_wide_tiles():
    d = make_plan(32, 32, torch.bfloat16, DEV).to_dict()
    GDNDetPlan.from_dict({**d, "store_16bit": 0})
    with pytest.raises(ValueError, match="store_16bit=1 needs"):
        GDNDetPlan.from_dict({**d, "head_v_dim": 16, "block_v": 16, "block_v_h": 16,
                              "block_v_local": 16})


def test_saved_set_contents(gdn_inputs):
    q, k, v, g, beta, h0 = gdn_inputs(1, 70, 1, 2, 16, 16, seed=3, h0=True)
    _, _, saved = chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0, scale=0.5)
    assert isinstance(saved, GDNDetSavedSet) and saved.mode == Mode.DET
    assert saved.q is q and saved.initial_state is h0 and saved.q_rstd is None
    assert saved.scale == 0.5 and not saved.use_qk_l2norm and not saved.varlen
    assert saved.cu_seqlens.tolist() == [0, 70]
    assert saved.A.shape == (70, 2, 64) and saved.g_cumsum.shape == (70, 2)
    assert saved.A_log is None and saved.dt_bias is None
    assert not saved.use_gate_in_kernel and not saved.use_beta_sigmoid_in_kernel
    # with the L2 norm the set keeps its outputs (the norm's backward needs no more)
    _, _, saved = chunk_gdn_det_fwd(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    for name, x in (("q", q), ("k", k)):
        y = getattr(saved, name)
        want = x.double() * torch.rsqrt(x.double().pow(2).sum(-1, keepdim=True) + 1e-6)
        assert y.dtype == x.dtype and y.data_ptr() != x.data_ptr()
        assert_close_to_reference(y, want, x.dtype, name)


def test_inputs_not_modified_and_noncontiguous_ok(gdn_inputs):
    q, k, v, g, beta, h0 = gdn_inputs(1, 40, 2, 2, 16, 16, seed=5, h0=True)
    qt = q.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    before = [t.clone() for t in (q, k, v, g, beta, h0)]
    o, ht, _ = chunk_gdn_det_fwd(qt, k, v, g, beta, initial_state=h0, output_final_state=True)
    o2, ht2, _ = chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    for a, b in zip(before, (q, k, v, g, beta, h0), strict=True):
        assert torch.equal(a, b)


def test_reference_fixed_equals_packed_and_is_differentiable(gdn_inputs):
    q, k, v, g, beta, h0 = gdn_inputs(2, 9, 1, 2, 16, 8, seed=9, h0=True)
    o, ht = gdn_reference(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                          dtype=torch.float64)
    flat = [t.reshape(1, 18, *t.shape[2:]) for t in (q, k, v, g, beta)]
    cu = torch.tensor([0, 9, 18])
    o2, ht2 = gdn_reference(*flat, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                            dtype=torch.float64)
    assert_close_to_reference(o2, o.reshape(1, 18, 2, 8), torch.float64, "o")
    assert_close_to_reference(ht2, ht, torch.float64, "final_state")
    args = [t.detach().double()[:1, :3].requires_grad_() for t in (q, k, v, g, beta)]
    h064 = h0.double()[:1].requires_grad_()

    def f(*a):
        out, fin = gdn_reference(*a[:5], initial_state=a[5], output_final_state=True,
                                 use_qk_l2norm_in_kernel=True)
        return out, fin

    assert torch.autograd.gradcheck(f, (*args, h064), eps=1e-6, atol=1e-5)


def test_fla_keywords_and_positional_order(gdn_inputs):
    """FLA's chunk_gated_delta_rule keywords: the speed hints are taken (same bits), its
    defaults taken, other values refused with the reason; an unknown keyword is a
    TypeError; a bool as the 10th positional argument (FLA's use_beta_sigmoid_in_kernel)
    is refused; a bf16 initial_state is taken as FLA does (upcast, gradient in bf16)."""
    q, k, v, g, beta, h0 = gdn_inputs(1, 40, 1, 2, 16, 16, seed=7, h0=True)
    cu = torch.tensor([0, 0, 1, 40], dtype=torch.int32, device=q.device)
    h0 = torch.cat([h0, h0, h0])[:3].contiguous()
    want = chunk_gated_delta_rule_det(q, k, v, g, beta, initial_state=h0,
                                      output_final_state=True, cu_seqlens=cu)
    got = chunk_gated_delta_rule_det(q, k, v, g, beta, initial_state=h0,
                                     output_final_state=True, cu_seqlens=cu,
                                     cu_seqlens_cpu=cu.cpu(), chunk_indices=object(),
                                     chunk_size=64, state_v_first=False, head_first=False,
                                     transpose_state_layout=False, cp_context=None)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    for kw, match in ((dict(chunk_size=32), "chunk_size=32 is not supported"),
                      (dict(state_v_first=True), "state_v_first=True"),
                      (dict(head_first=True), "head_first"),
                      (dict(cp_context=object()), "kcp"),
                      (dict(state_v_first=1), "state_v_first=1")):
        with pytest.raises(ValueError, match=match):
            chunk_gated_delta_rule_det(q, k, v, g, beta, **kw)
    for kw in (dict(use_graph=True), dict(return_intermediate_states=False), dict(nope=1)):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            chunk_gated_delta_rule_det(q, k, v, g, beta, **kw)
    with pytest.raises(ValueError, match="10th positional argument is cu_seqlens"):
        chunk_gated_delta_rule_det(q, k, v, g, beta, None, None, False, False, True)
    hb = h0.to(torch.bfloat16).requires_grad_()
    o, ht = chunk_gated_delta_rule_det(q, k, v, g, beta, initial_state=hb,
                                       output_final_state=True, cu_seqlens=cu)
    o2, ht2 = chunk_gated_delta_rule_det(q, k, v, g, beta, initial_state=hb.detach().float(),
                                         output_final_state=True, cu_seqlens=cu)
    assert torch.equal(o, o2) and torch.equal(ht, ht2) and ht.dtype == torch.float32
    (o.sum() + ht.sum()).backward()
    assert hb.grad.dtype == torch.bfloat16 and torch.isfinite(hb.grad.float()).all()
