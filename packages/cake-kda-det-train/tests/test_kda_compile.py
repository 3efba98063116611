"""torch.compile (custom ops ``cake_kda_det_train::fwd`` / ``::bwd``, fullgraph) and
torch.utils.checkpoint: the same bits as the eager autograd entry."""

import dataclasses

import cake_kda_det_train.api as api
import pytest
import torch
import torch.utils.checkpoint
from cake_core.testing import (
    assert_bitwise_equal_named,
    assert_compile_same_bits,
    assert_compiles_to_op,
    leaf_grads,
)
from cake_core.triton_utils import default_device
from cake_kda_det_train import chunk_kda_det

DEV = default_device()
BACKEND = "aot_eager" if DEV.type == "cpu" else "inductor"
# packed: an empty document, one inside a 16-token sub-chunk, one across a sub-chunk
# boundary (compiled and eager run the same kernels: the lengths do not matter)
CU = (0, 0, 11, 30)
NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state", "dA_log",
         "ddt_bias")
T, H, HV, K, V = 30, 1, 2, 16, 16


def _inputs(kda, *, seed=0):
    """Leaves of every option: q, k (unnormalised: the in-kernel L2 norm), v, raw g,
    pre-sigmoid beta, initial state, A_log, dt_bias."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, T, H, HV, K, V, seed=seed, normalize_k=False,
                                               h0=True, n_states=len(CU) - 1, g_mode="raw",
                                               raw_beta=True)
    A_log, dt_bias = kda.make_gate_params(HV, K, seed=seed + 10)
    return q, k, v, g, beta, h0, A_log, dt_bias


def _step(q, k, v, g, beta, h0, A_log, dt_bias, cu):
    o, ht = chunk_kda_det(
        q, k, v, g, beta, 0.3, h0, True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
        use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, lower_bound=-1.0,
        use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    # a loss that reaches o and the final state with non-trivial upstream gradients
    return (o * o).sum() + 0.1 * (ht * ht.detach().sin()).sum(), o, ht


def test_compile_fullgraph_same_bits_as_eager(kda):
    leaves = _inputs(kda)
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV)
    compiled = assert_compiles_to_op(_step, leaves, (cu,), NAMES, backend=BACKEND,
                                     op="cake_kda_det_train.fwd")
    # cu_seqlens values are not read while tracing; the op checks them when it runs
    bad = torch.tensor((0, 20, 11, 30), dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="cu_seqlens"):
        compiled(*leaves, bad)


def test_compile_fullgraph_plain_call(kda):
    """Options off: fixed length (B = 2), no initial state, no final state (None); a plan
    given by the caller (a constant of the trace, passed to the ops by its fields)."""
    torch._dynamo.reset()
    q, k, v, g, beta, _ = kda.make_kda_inputs(2, 20, 1, 1, K, V, seed=3)
    plan = api.make_plan(K, V, torch.float32, DEV)

    def f(q, k, v, g, beta):
        o, ht = chunk_kda_det(q, k, v, g, beta, plan=plan)
        assert ht is None
        return o

    assert_compile_same_bits(f, (q, k, v, g, beta), BACKEND)


@pytest.mark.parametrize("keep_states", [0, 1])
def test_custom_ops_opcheck(kda, keep_states):
    """Schema, fake implementations and autograd registration (softplus gate: lower_bound
    None through the op's ``float?``); with the L2 norm the fwd op returns the normalised q
    and k, which the bwd op takes; with ``keep_states`` the fwd op also returns h (the
    most chunks the sequences can form), w, kg and v_new, and the bwd op takes them."""
    q, k, v, g, beta, h0, A_log, dt_bias = _inputs(kda)
    n = 20
    q, k, v, g, beta = (t[:, :n].contiguous().requires_grad_() for t in (q, k, v, g, beta))
    h0, A_log, dt_bias = (t.requires_grad_() for t in (h0[:2], A_log, dt_bias))
    cu = torch.tensor((0, 7, n), dtype=torch.int64, device=DEV)
    plan = dataclasses.replace(api.make_plan(K, V, torch.float32, DEV), keep_states=keep_states)
    fields = api.plan_to_op_fields(plan)
    args = (q, k, v, g, beta, h0, cu, A_log, dt_bias, 0.3, True, True, True, None, 1, fields)
    torch.library.opcheck(torch.ops.cake_kda_det_train.fwd, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))
    o, ht, qn, kn, q_rstd, k_rstd, g_cumsum, A, h, w, kg, v_new = \
        torch.ops.cake_kda_det_train.fwd(*args)
    assert ht.shape == (2, HV, K, V) and q_rstd.shape == (1, n, H)
    assert qn.shape == kn.shape == q.shape and qn.dtype == q.dtype
    assert g_cumsum.shape == (n, HV, K) and A.shape == (2, n, HV, 64)  # T, Aqk
    if keep_states:  # 2 chunks; two sequences of 20 tokens in all can form no more
        assert h.shape == (2, HV, K, V) and w.shape == kg.shape == (n, HV, K)
        assert v_new.shape == (n, HV, V)
    else:
        assert h.shape == w.shape == kg.shape == v_new.shape == (0,)
    with torch.no_grad():
        bwd_args = (torch.ones_like(o), torch.ones_like(ht), qn, kn, v, g, beta, g_cumsum, A, h0,
                    cu, q_rstd, k_rstd, A_log, dt_bias, h, w, kg, v_new, 0.3, True, True, None,
                    1, fields)
    torch.library.opcheck(torch.ops.cake_kda_det_train.bwd, bwd_args,
                          test_utils=("test_schema", "test_faketensor"))


def test_checkpoint_same_grads(kda):
    leaves = _inputs(kda, seed=5)
    cu = torch.tensor(CU, dtype=torch.int64, device=DEV)

    def ckpt(*args):
        return torch.utils.checkpoint.checkpoint(_step, *args, use_reentrant=False)

    assert_bitwise_equal_named(leaf_grads(ckpt, leaves, cu), leaf_grads(_step, leaves, cu),
                               NAMES, "checkpointed differs")
