"""Package surface: lazy imports, manifest, plans, saved set, workspace use, inputs left
alone, and the reference's own consistency (fixed vs packed, one token by hand, gradcheck)."""


import pytest
import torch
from cake_core import Mode
from cake_core.testing import (
    assert_close_to_reference,
    assert_imports_without_triton,
    bitwise_equal,
    randn,
)
from cake_core.triton_utils import default_device
from cake_kda_det_train import (
    KDADetPlan,
    KDADetSavedSet,
    chunk_kda_det,
    chunk_kda_det_bwd,
    chunk_kda_det_fwd,
    kda_recurrence_ref,
    make_plan,
)

DEV = default_device()
F64 = torch.float64


def test_import_is_lazy():
    assert_imports_without_triton("cake_kda_det_train", "cake_kda_det_train.cake_build")


def test_public_names():
    import cake_kda_det_train as pkg

    assert pkg.__version__ == "0.1.0"
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None
    assert not hasattr(pkg, "chunk_kda")  # cake names only
    assert callable(pkg.chunk_kda_det) and callable(pkg.chunk_kda_det_bwd)


def test_manifest_and_naming():
    import importlib

    from cake_core.build import validate_manifest
    from cake_core.naming import check_name
    from cake_kda_det_train.cake_build import FAMILY, manifest

    m = manifest()
    assert validate_manifest(m) == []
    assert m["source_digest"].startswith("sha256:") and FAMILY["name"] == "cake-kda-det-train"
    assert check_name(FAMILY["name"]) == []
    for k in m["kernels"]:
        assert hasattr(importlib.import_module(k["module"]), k["function"])


@pytest.mark.parametrize("K,V", [(16, 16), (64, 32), (128, 128)])
def test_plan_roundtrip(K, V):
    plan = make_plan(K, V, torch.bfloat16, DEV)
    assert plan.mode == Mode.DET and plan.block_k >= K
    assert KDADetPlan.from_dict(plan.to_dict()) == plan
    assert make_plan(K, V, torch.bfloat16, DEV) is plan


def test_saved_set_contents(kda):
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 70, 1, 2, 16, 16, seed=3, h0=True,
                                               normalize_k=False, g_mode="raw", raw_beta=True)
    A_log, dt_bias = kda.make_gate_params(2, 16, seed=4)
    _, _, saved = chunk_kda_det_fwd(q, k, v, g, beta, initial_state=h0, scale=0.5,
                                    use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                    A_log=A_log, dt_bias=dt_bias, lower_bound=-2.0,
                                    use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    assert isinstance(saved, KDADetSavedSet) and saved.mode == Mode.DET
    assert saved.v is v and saved.g is g and saved.beta is beta and saved.initial_state is h0
    # with the L2 norm the set keeps its outputs (the norm's backward needs no more)
    for name, x in (("q", q), ("k", k)):
        y = getattr(saved, name)
        want = x.double() * torch.rsqrt(x.double().pow(2).sum(-1, keepdim=True) + 1e-6)
        assert y.dtype == x.dtype and y.data_ptr() != x.data_ptr()
        assert_close_to_reference(y, want, x.dtype, name)
    # a set of the format before (raw q, k with the L2 norm), as unpickled: refused
    assert saved.version == KDADetSavedSet.format_version == 2
    saved.version = 1
    with pytest.raises(ValueError, match="saved: a KDADetSavedSet of format version 1"):
        chunk_kda_det_bwd(torch.ones_like(v), None, saved)
    assert saved.A_log is A_log and saved.dt_bias is dt_bias
    assert saved.scale == 0.5 and saved.use_qk_l2norm and not saved.varlen
    assert saved.use_gate_in_kernel and saved.lower_bound == -2.0
    assert saved.use_beta_sigmoid_in_kernel and saved.allow_neg_eigval
    assert saved.cu_seqlens.tolist() == [0, 70] and saved.seqs.offsets.tolist() == [0, 70]
    assert saved.cu_seqlens is saved.seqs.cu and saved.seqs.offsets.device.type == "cpu"
    # T and Aqk stacked
    assert saved.A.shape == (2, 70, 2, 64) and saved.g_cumsum.shape == (70, 2, 16)
    assert saved.g_cumsum.dtype == torch.float32
    assert saved.q_rstd.shape == (1, 70, 1) and saved.k_rstd.dtype == torch.float32
    want = torch.rsqrt(k.double().pow(2).sum(-1) + 1e-6)
    assert_close_to_reference(saved.k_rstd, want, torch.float32, "k_rstd")
    # g_cumsum is the within-chunk cumulative sum of the computed gate
    from cake_kda_det_train import kda_gate_ref

    gate = kda_gate_ref(g.double(), A_log.double(), dt_bias.double(), -2.0)[0]
    want = torch.cat([gate[:64].cumsum(0), gate[64:].cumsum(0)])
    assert_close_to_reference(saved.g_cumsum, want, torch.float32, "g_cumsum")


def test_inputs_not_modified_and_noncontiguous_ok(kda):
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 20, 2, 2, 16, 16, seed=5, h0=True)
    qt = q.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    gt = g.transpose(1, 2).contiguous().transpose(1, 2)
    before = [t.clone() for t in (q, k, v, g, beta, h0)]
    leaves = [t.clone().requires_grad_() for t in (qt, k, v, gt, beta)]
    o, ht = chunk_kda_det(*leaves, initial_state=h0, output_final_state=True)
    (o.sum() + ht.sum()).backward()
    o2, ht2, _ = chunk_kda_det_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert bitwise_equal(o, o2) and bitwise_equal(ht, ht2)
    for a, b in zip(before, (q, k, v, g, beta, h0), strict=True):
        assert bitwise_equal(a, b)
    assert leaves[0].grad.shape == q.shape and leaves[3].grad.shape == g.shape


def test_reference_one_token_by_hand():
    """S1 = diag(exp(g)) S0 + k beta (v - (diag(exp(g)) S0)^T k)^T, o = scale S1^T q."""
    K, V = 3, 2
    q, k = randn((1, 1, 1, K), F64, seed=1), randn((1, 1, 1, K), F64, seed=2)
    v, g = randn((1, 1, 1, V), F64, seed=3), -randn((1, 1, 1, K), F64, seed=4).abs()
    beta, S0 = torch.tensor([[[0.7]]], dtype=F64), randn((1, 1, K, V), F64, seed=5)
    o, S1 = kda_recurrence_ref(q, k, v, g, beta, 0.4, S0, True)
    Sd = torch.exp(g[0, 0, 0])[:, None] * S0[0, 0]
    kk = k[0, 0, 0]
    want_S = Sd + 0.7 * torch.outer(kk, v[0, 0, 0] - Sd.T @ kk)
    assert torch.allclose(S1[0, 0], want_S, rtol=1e-12, atol=1e-12)
    assert torch.allclose(o[0, 0, 0], 0.4 * want_S.T @ q[0, 0, 0], rtol=1e-12, atol=1e-12)


def test_reference_fixed_equals_packed_and_is_differentiable():
    q, k, v = (randn(s, F64, seed=i) for i, s in enumerate(
        [(2, 9, 1, 4), (2, 9, 1, 4), (2, 9, 2, 3)]))
    g = -randn((2, 9, 2, 4), F64, seed=7).abs()
    beta = randn((2, 9, 2), F64, seed=8).sigmoid()
    h0 = randn((2, 2, 4, 3), F64, seed=9)
    o, ht = kda_recurrence_ref(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    flat = [t.reshape(1, 18, *t.shape[2:]) for t in (q, k, v, g, beta)]
    o2, ht2 = kda_recurrence_ref(*flat, initial_state=h0, output_final_state=True,
                                 cu_seqlens=torch.tensor([0, 9, 18]))
    assert torch.allclose(o2, o.reshape(1, 18, 2, 3), rtol=1e-12, atol=1e-12)
    assert torch.allclose(ht2, ht, rtol=1e-12, atol=1e-12)
    args = [t[:1, :3].clone().requires_grad_() for t in (q, k, v, g, beta)]
    A_log = randn((2,), F64, seed=10).requires_grad_()
    dt = randn((8,), F64, seed=11).requires_grad_()
    h = h0[:1].clone().requires_grad_()

    def f(q, k, v, g, beta, h, A_log, dt):
        return kda_recurrence_ref(q, k, v, g, beta, initial_state=h, output_final_state=True,
                                  use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                  A_log=A_log, dt_bias=dt, use_beta_sigmoid_in_kernel=True)

    assert torch.autograd.gradcheck(f, (*args, h, A_log, dt), eps=1e-6, atol=1e-5)


def test_fla_keywords_and_positional_order(kda):
    """FLA's chunk_kda keywords: the hints are taken (same bits), its defaults taken, other
    values refused with the reason; an unknown keyword is a TypeError; a bool as the 10th
    positional argument (FLA's use_gate_in_kernel) is refused."""
    q, k, v, g, beta, _ = kda.make_kda_inputs(1, 20, 1, 2, 16, 16, seed=7)
    cu = torch.tensor([0, 0, 1, 20], dtype=torch.int32, device=q.device)
    want = chunk_kda_det(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu)
    got = chunk_kda_det(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu,
                        cu_seqlens_cpu=cu.cpu(), chunk_indices=None, use_graph=True,
                        max_num_seqs=8, disable_recompute=True, chunk_size=64,
                        state_v_first=False, transpose_state_layout=False, head_first=False,
                        cp_context=None, return_intermediate_states=False)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    for kw, match in ((dict(chunk_size=16), "chunk_size=16 is not supported"),
                      (dict(return_intermediate_states=True), "returns \\(o, final_state\\)"),
                      (dict(state_v_first=True), "state_v_first=True"),
                      (dict(cp_context=object()), "kcp")):
        with pytest.raises(ValueError, match=match):
            chunk_kda_det(q, k, v, g, beta, **kw)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        chunk_kda_det(q, k, v, g, beta, nope=1)
    with pytest.raises(ValueError, match="10th positional argument is cu_seqlens"):
        chunk_kda_det(q, k, v, g, beta, None, None, False, False, True)
