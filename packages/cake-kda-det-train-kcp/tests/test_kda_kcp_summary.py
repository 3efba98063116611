"""The affine summary of a KDA fragment, checked against the float64 token recurrence
(cake_kda_det_train.kda_recurrence_ref):

    S_end = P S_start + Q,   P = M_n ... M_1,   M_t = (I - beta_t k_t k_t^T) diag(exp(g_t))
    dS_start = P^T dS_end + G

and the kernels' P (the all-gather forward's transition run, kept in the saved set)
against the float64 product, with strong per-channel decays and with the in-kernel gate,
L2 norm and beta sigmoid."""

import pytest
import torch
import torch.nn.functional as F
from _kda_kcp_helpers import CHAIN_CU, CHAIN_ROWS, DEV, global_inputs, shard
from cake_core.testing import rel_fro_error
from cake_kda_det_train import kda_gate_ref, kda_recurrence_ref
from cake_kda_det_train_kcp import (
    build_context_det_kcp,
    chunk_kda_det_fwd_kcp,
    partition_det_kcp,
)

F64 = torch.float64


def _inputs64(T, H, HV, K, V, seed, strong):
    gen = torch.Generator().manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, dtype=F64)

    q, k, v = rn(1, T, H, K), F.normalize(rn(1, T, H, K), dim=-1), rn(1, T, HV, V)
    x = rn(1, T, HV, K)
    g = -20.0 * torch.sigmoid(2.0 * x) if strong else F.logsigmoid(x)
    return q, k, v, g, torch.sigmoid(rn(1, T, HV))


def _transition64(k, g, beta, HV):
    """P by the reference: the final state of v = 0 (width K) from the identity."""
    T, H, K = k.shape[1:]
    eye = torch.eye(K, dtype=F64, device=k.device).expand(1, HV, K, K).contiguous()
    _, P = kda_recurrence_ref(k, k, k.new_zeros(1, T, HV, K), g, beta,
                              scale=1.0, initial_state=eye, output_final_state=True, dtype=F64)
    return P[0]


def _product64(k, g, beta, HV):
    """P as the explicit product of the token matrices M_t = (I - b k k^T) diag(exp(g)),
    on k's device (the kernel's inputs are on DEV)."""
    T, H, K = k.shape[1:]
    eye = torch.eye(K, dtype=F64, device=k.device)
    P = eye.repeat(HV, 1, 1)
    for t in range(T):
        for h in range(HV):
            kt = k[0, t, h // (HV // H)]
            M = (eye - beta[0, t, h] * torch.outer(kt, kt)) \
                @ torch.diag(torch.exp(g[0, t, h]))
            P[h] = M @ P[h]
    return P


@pytest.mark.parametrize("strong", [False, True], ids=["real", "strong"])
def test_affine_map_and_its_transpose(strong):
    """For any start state: S_end = P S_start + Q (Q: from zero), P the product of the
    per-channel-decay delta-rule factors (not symmetric, the decay does not commute with
    k k^T), and the start-state gradient is P^T dS_end + G (G: with dS_end = 0)."""
    T, H, HV, K, V = 13, 1, 2, 6, 5
    q, k, v, g, beta = _inputs64(T, H, HV, K, V, seed=3, strong=strong)
    S0 = torch.randn(1, HV, K, V, dtype=F64, generator=torch.Generator().manual_seed(4))
    P = _transition64(k, g, beta, HV)
    assert torch.allclose(P, _product64(k, g, beta, HV), rtol=1e-12, atol=1e-14)
    assert (P - P.transpose(-1, -2)).norm() > 1e-3 * P.norm()
    _, Q = kda_recurrence_ref(q, k, v, g, beta, output_final_state=True, dtype=F64)
    _, S_end = kda_recurrence_ref(q, k, v, g, beta, initial_state=S0, output_final_state=True,
                                  dtype=F64)
    assert torch.allclose(S_end[0], P @ S0[0] + Q[0], rtol=1e-12, atol=1e-14)

    gen = torch.Generator().manual_seed(5)
    do = torch.randn(1, T, HV, V, dtype=F64, generator=gen)
    dS_end = torch.randn(1, HV, K, V, dtype=F64, generator=gen)
    s0 = S0.clone().requires_grad_()
    o, ht = kda_recurrence_ref(q, k, v, g, beta, initial_state=s0, output_final_state=True,
                               dtype=F64)
    torch.autograd.backward([o, ht], [do, dS_end])
    z = torch.zeros_like(S0).requires_grad_()
    o0, _ = kda_recurrence_ref(q, k, v, g, beta, initial_state=z, output_final_state=True,
                               dtype=F64)
    o0.backward(do)
    G = z.grad
    assert torch.allclose(s0.grad[0], P.transpose(-1, -2) @ dS_end[0] + G[0], rtol=1e-12,
                          atol=1e-14)


def test_fold_of_a_chain_is_the_recurrence():
    """Three fragments folded S = Q_0; S = P_j S + Q_j give the state the recurrence
    reaches at each cut, and the reverse fold the start-state gradient of the later ones."""
    T, HV, K, V = 18, 1, 5, 4
    q, k, v, g, beta = _inputs64(T, 1, HV, K, V, seed=6, strong=False)
    cuts = [0, 4, 11, 18]
    S = None
    for a, b in zip(cuts, cuts[1:], strict=False):
        sl = (slice(None), slice(a, b))
        P = _transition64(k[sl], g[sl], beta[sl], HV)
        _, Q = kda_recurrence_ref(q[sl], k[sl], v[sl], g[sl], beta[sl],
                                  output_final_state=True, dtype=F64)
        S = Q[0] if S is None else P @ S + Q[0]
        _, want = kda_recurrence_ref(q[:, :b], k[:, :b], v[:, :b], g[:, :b], beta[:, :b],
                                     output_final_state=True, dtype=F64)
        assert torch.allclose(S, want[0], rtol=1e-12, atol=1e-14), (a, b)


def _kernel_P(kind, seed, HV):
    """The saved P of the middle fragment of CHAIN_ROWS (rank 0: first, middle, last),
    the fragment's global token range, the inputs and options."""
    xs, kw = global_inputs(CHAIN_CU[-1], HV=HV, seed=seed, kind=kind)
    p = partition_det_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    _, saved = chunk_kda_det_fwd_kcp(*shard(xs, p)[:5], ctx, **kw)
    (mid,) = [f for f in ctx.fragments if f.has_prev and f.has_next]
    return saved.P, (mid.global_offset, mid.global_offset + mid.length), xs, kw


@pytest.mark.parametrize("kind, HV", [("strong", 2), ("gate_lb", 1), ("gate", 1)])
def test_kernel_transition_matches_float64(kind, HV):
    """The transition run (single-rank forward with v = 0 from the identity) gives the
    float64 product within fp32 tolerance: strong per-channel decays down to -20; FLA's
    lower-bound gate with the L2 norm; the softplus gate with dt_bias and beta sigmoid
    (the run sees the same decay and beta as the fragment's own run); HV = 2: one P per
    value head."""
    P, (a, b), xs, kw = _kernel_P(kind, 7, HV)
    assert P.shape == (1, HV, 16, 16) and P.dtype == torch.float32
    k, g, beta = (t[:, a:b].double() for t in (xs[1], xs[3], xs[4]))
    if kw.get("use_qk_l2norm_in_kernel"):
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if kw.get("use_gate_in_kernel"):
        d = {n: kw[n].double() if kw.get(n) is not None else None for n in ("A_log", "dt_bias")}
        g = kda_gate_ref(g, d["A_log"], d["dt_bias"], kw.get("lower_bound"))
    if kw.get("use_beta_sigmoid_in_kernel"):
        beta = torch.sigmoid(beta)
    want = _product64(k, g, beta, HV)
    err = rel_fro_error(P[0], want)
    assert err < 2e-5, err
