"""torch.compile (custom ops ``cake_gdn_det_train::fwd`` / ``::bwd``, fullgraph) and
torch.utils.checkpoint: the same bits as the eager autograd entry (the same ops)."""

import dataclasses

import cake_gdn_det_train.api as api
import pytest
import torch
import torch.utils.checkpoint
from cake_core.testing import (
    assert_bitwise_equal_named,
    assert_compile_same_bits,
    assert_compiles_to_op,
    leaf_grads,
    randn,
)
from cake_core.triton_utils import default_device
from cake_gdn_det_train import chunk_gated_delta_rule_det
from cake_gdn_det_train.saved import max_chunks

DEV = default_device()
BACKEND = "aot_eager" if DEV.type == "cpu" else "inductor"
# packed: an empty document, one inside a chunk, one across the 64-token chunk boundary
CU = (0, 0, 11, 80)
NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state", "dA_log",
         "ddt_bias")
T, H, HV, K, V = 80, 1, 2, 16, 16


def _inputs(gdn_inputs, *, seed=0):
    """Leaves of every option: q, k (unnormalised: the in-kernel L2 norm), v, raw g,
    pre-sigmoid beta, initial state, A_log, dt_bias."""
    q, k, v, _, _, h0 = gdn_inputs(1, T, H, HV, K, V, seed=seed, normalize_k=False, h0=True,
                                   n_states=len(CU) - 1)
    g = 1.5 * randn((1, T, HV), torch.float32, DEV, seed=seed + 10)
    beta = 2.0 * randn((1, T, HV), torch.float32, DEV, seed=seed + 11)
    A_log = 0.5 * randn((HV,), torch.float32, DEV, seed=seed + 12) - 0.5
    dt_bias = 0.5 * randn((HV,), torch.float32, DEV, seed=seed + 13)
    return q, k, v, g, beta, h0, A_log, dt_bias


def _step(q, k, v, g, beta, h0, A_log, dt_bias, cu):
    o, ht = chunk_gated_delta_rule_det(
        q, k, v, g, beta, 0.3, h0, True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
        use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
        use_beta_sigmoid_in_kernel=True)
    # a loss that reaches o and the final state with non-trivial upstream gradients
    return (o * o).sum() + 0.1 * (ht * ht.detach().sin()).sum(), o, ht


def test_compile_fullgraph_same_bits_as_eager(gdn_inputs):
    leaves = _inputs(gdn_inputs)
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV)
    compiled = assert_compiles_to_op(_step, leaves, (cu,), NAMES, backend=BACKEND,
                                     op="cake_gdn_det_train.fwd")
    # cu_seqlens values are not read while tracing; the op checks them when it runs
    bad = torch.tensor((0, 30, 11, 80), dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="cu_seqlens"):
        compiled(*leaves, bad)


def test_compile_fullgraph_plain_call(gdn_inputs):
    """Options off: fixed length (B = 2), no initial state, no final state (None)."""
    torch._dynamo.reset()
    q, k, v, g, beta, _ = gdn_inputs(2, 70, 1, 1, K, V, seed=3)

    def f(q, k, v, g, beta):
        o, ht = chunk_gated_delta_rule_det(q, k, v, g, beta)
        assert ht is None
        return o

    assert_compile_same_bits(f, (q, k, v, g, beta), BACKEND)


@pytest.mark.parametrize("keep_states", [0, 1])
def test_custom_ops_opcheck(gdn_inputs, keep_states):
    """Schema, fake implementations (incl. dynamic shapes) and autograd registration; with
    plan.keep_states the fwd op also returns g_cumsum, h (max_chunks rows), w and v_new."""
    q, k, v, g, beta, h0, A_log, dt_bias = (t.requires_grad_() for t in _inputs(gdn_inputs))
    cu = torch.tensor(CU, dtype=torch.int64, device=DEV)
    plan = dataclasses.replace(api.make_plan(K, V, torch.float32, DEV), keep_states=keep_states)
    fields = api.plan_to_op_fields(plan)
    args = (q, k, v, g, beta, h0, cu, A_log, dt_bias, 0.3, True, True, True, True, fields)
    torch.library.opcheck(torch.ops.cake_gdn_det_train.fwd, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))
    o, ht, qn, kn, q_rstd, k_rstd, g_cumsum, A, h, w, v_new = \
        torch.ops.cake_gdn_det_train.fwd(*args)
    assert ht.shape == (len(CU) - 1, HV, K, V) and q_rstd.shape == (1, T, H)
    assert qn.shape == kn.shape == q.shape and qn.dtype == q.dtype  # the L2 norm's outputs
    assert A.shape == (T, HV, 64)
    if keep_states:
        assert h.shape == (max_chunks(T, len(CU) - 1), HV, K, V) and w.shape == (T, HV, K)
    else:
        assert [t.shape for t in (g_cumsum, h, w, v_new)] == [(0,)] * 4
    with torch.no_grad():
        bwd_args = (torch.ones_like(o), torch.ones_like(ht), qn, kn, v, g, beta, h0, cu, q_rstd,
                    k_rstd, A_log, dt_bias, g_cumsum, A, h, w, v_new, 0.3, True, True, True,
                    fields)
    torch.library.opcheck(torch.ops.cake_gdn_det_train.bwd, bwd_args,
                          test_utils=("test_schema", "test_faketensor"))


def test_checkpoint_same_grads(gdn_inputs):
    leaves = _inputs(gdn_inputs, seed=5)
    cu = torch.tensor(CU, dtype=torch.int64, device=DEV)

    def ckpt(*args):
        return torch.utils.checkpoint.checkpoint(_step, *args, use_reentrant=False)

    assert_bitwise_equal_named(leaf_grads(ckpt, leaves, cu), leaf_grads(_step, leaves, cu),
                               NAMES, "checkpointed differs")
