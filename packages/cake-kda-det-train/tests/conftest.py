"""Shared helpers of the cake-kda-det-train tests, handed out by the ``kda`` fixture: input
factories (fresh random values, never zeros) and the comparison of o, final_state and every
gradient with float64 autograd through :func:`cake_kda_det_train.kda_recurrence_ref`."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from cake_core.testing import assert_close_to_reference, randn
from cake_core.triton_utils import default_device

DEV = default_device()
F64 = torch.float64
#: names of the leaves whose gradients are compared, in order
NAMES = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")
#: relative Frobenius tolerance of dA_log / ddt_bias in fp32: sums over every token of
#: terms of both signs, so the chunk's ~1e-6 relative error per term grows by the
#: cancellation (measured up to 1.5e-5 on these inputs)
PARAM_TOL_FP32 = 1e-4


def _g(shape, mode: str, seed: int) -> torch.Tensor:
    x = randn(shape, torch.float64, "cpu", seed=seed)
    if mode == "real":            # logsigmoid of randn: about -0.7 on average, in (-4, 0)
        return F.logsigmoid(x)
    if mode == "strong":          # strongly negative per channel, down to -20 per token
        return -20.0 * torch.sigmoid(2.0 * x)
    if mode == "near0":           # decay near 1: the state remembers the whole sequence
        return -1e-3 * torch.sigmoid(x)
    if mode == "raw":             # FLA's raw gate input (use_gate_in_kernel), N(0, 1.5^2)
        return 1.5 * x
    raise ValueError(mode)


def make_kda_inputs(B, T, H, HV, K, V, dtype=torch.float32, *, seed=0, g_mode="real",
                    n_states=None, normalize_k=True, gb_dtype=torch.float32, h0=False,
                    raw_beta=False):
    """q, k, v, g ``[B, T, HV, K]``, beta and an initial state ``[n_states or B, HV, K, V]``
    (or None). k is L2-normalised (the regime KDA runs in) unless ``normalize_k`` is False;
    beta is post-sigmoid unless ``raw_beta`` (then N(0, 2^2), for the in-kernel sigmoid)."""
    q = randn((B, T, H, K), torch.float64, "cpu", seed=seed)
    k = randn((B, T, H, K), torch.float64, "cpu", seed=seed + 1)
    k = F.normalize(k, dim=-1) if normalize_k else 2.0 * k
    v = randn((B, T, HV, V), torch.float64, "cpu", seed=seed + 2)
    g = _g((B, T, HV, K), g_mode, seed + 3)
    beta = 2.0 * randn((B, T, HV), torch.float64, "cpu", seed=seed + 4)
    if not raw_beta:
        beta = torch.sigmoid(beta)
    state = None
    if h0:
        state = 0.5 * randn((n_states or B, HV, K, V), torch.float64, "cpu", seed=seed + 5)
        state = state.to(DEV, torch.float32)
    q, k, v = (t.to(DEV, dtype) for t in (q, k, v))
    g, beta = (t.to(DEV, gb_dtype) for t in (g, beta))
    return q, k, v, g, beta, state


def make_gate_params(HV, K, *, seed, dtype=torch.float32, bias=True):
    """Raw-gate parameters: A_log ``[HV]`` around -0.5, dt_bias ``[HV * K]`` (or None)."""
    A_log = (0.5 * randn((HV,), torch.float32, DEV, seed=seed) - 0.5).to(dtype)
    dt_bias = (0.5 * randn((HV * K,), torch.float32, DEV, seed=seed + 1)).to(dtype) \
        if bias else None
    return A_log, dt_bias


def cu_of(lens, dtype=torch.int32):
    """``cu_seqlens`` on the test device for documents of ``lens`` tokens."""
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=dtype, device=DEV)


def run_autograd(fn, inputs, extra, do, dht, **kw):
    """``fn(q, k, v, g, beta, initial_state=, output_final_state=, A_log=, dt_bias=, **kw)``
    on fresh leaves; backward of (o, final_state) with (do, dht). ``extra`` = (h0, A_log,
    dt_bias), each may be None. Returns ``(o, final_state, grads of NAMES)``."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    ex = [t.detach().clone().requires_grad_() if t is not None else None for t in extra]
    o, ht = fn(*leaves, initial_state=ex[0], output_final_state=dht is not None,
               A_log=ex[1], dt_bias=ex[2], **kw)
    outs, gs = [o], [do.to(o.dtype)]
    if dht is not None:
        outs.append(ht)
        gs.append(dht.to(ht.dtype))
    torch.autograd.backward(outs, gs)
    return o, ht, [t.grad for t in leaves] + [t.grad if t is not None else None for t in ex]


def reference64(*a, **k):
    from cake_kda_det_train import kda_recurrence_ref

    return kda_recurrence_ref(*a, **k, dtype=F64)


def check_vs_reference(inputs, h0=None, A_log=None, dt_bias=None, *, dtype=torch.float32,
                       seed=0, with_dht=True, fn=None, grad_tol=None, outputs=False, **kw):
    """o, final_state and every gradient of ``fn`` (default :func:`chunk_kda_det`) against
    float64 autograd through the reference (:func:`assert_matches_reference`) for upstream
    gradients drawn from ``seed``. Returns the cake gradients (with ``outputs``: ``(o,
    final_state, gradients)``, for further checks on the same call)."""
    from cake_kda_det_train import chunk_kda_det

    fn = fn or chunk_kda_det
    q, k, v, g, beta = inputs
    cu = kw.get("cu_seqlens")
    N = q.shape[0] if cu is None else cu.numel() - 1
    do = randn(v.shape, dtype, DEV, seed=seed + 100)
    dht = randn((N, v.shape[2], q.shape[3], v.shape[3]), torch.float32, DEV,
                seed=seed + 101) if with_dht else None
    o, ht, got = run_autograd(fn, inputs, (h0, A_log, dt_bias), do, dht, **kw)
    assert_matches_reference(inputs, (h0, A_log, dt_bias), do, dht, (o, ht, got),
                             dtype=dtype, grad_tol=grad_tol, **kw)
    return (o, ht, got) if outputs else got


def assert_matches_reference(inputs, extra, do, dht, result, *, dtype=torch.float32,
                             grad_tol=None, **kw):
    """``result`` = ``(o, final_state, gradients)`` of one cake call (:func:`run_autograd`
    with ``extra`` = (h0, A_log, dt_bias), upstream ``do`` and ``dht``, keywords ``kw``)
    against float64 autograd through the reference on the same values, within
    ``cake_core.testing.TOLERANCES[dtype]`` (the final state at 1e-5 for fp32 inputs;
    dA_log / ddt_bias in fp32 at :data:`PARAM_TOL_FP32`; ``grad_tol`` overrides the other
    gradients' tolerance). Gradients of absent (or ignored) inputs must be None, the others
    of their input's dtype and shape and finite."""
    o, ht, got = result
    h0, A_log, dt_bias = extra
    v = inputs[2]
    ref_kw = {n: x for n, x in kw.items() if n not in ("safe_gate", "plan", "workspace")}
    d64 = [t.double() if t is not None else None for t in extra]
    o_r, ht_r, want = run_autograd(reference64, [t.double() for t in inputs], d64,
                                   do.double(), dht.double() if dht is not None else None,
                                   **ref_kw)
    assert o.shape == v.shape and o.dtype == v.dtype
    assert_close_to_reference(o, o_r, dtype, "o")
    if dht is not None:
        assert ht.dtype == torch.float32
        assert_close_to_reference(ht, ht_r, dtype, "final_state",
                                  tol=1e-5 if dtype == torch.float32 else None)
    gate = kw.get("use_gate_in_kernel", False)
    params = (*inputs, h0, A_log if gate else None, dt_bias if gate else None)
    for name, a, b, t in zip(NAMES, got, want, params, strict=True):
        if t is None:
            assert a is None, name
            continue
        assert a is not None and a.dtype == t.dtype and a.shape == t.shape, name
        tol = PARAM_TOL_FP32 if name in ("A_log", "dt_bias") and dtype == torch.float32 \
            else grad_tol
        assert_close_to_reference(a, b, dtype, f"d{name}", tol=tol)


def check_plan_on_docs(plan, lens, K, V, dtype, *, seed, H=1, HV=2, g_mode="strong",
                       fp32_grad_tol=3e-5):
    """A plan variant against the float64 reference on packed documents of ``lens`` tokens
    (with an initial state per document and ``dht``): :func:`make_kda_inputs` then
    :func:`check_vs_reference` (fp32 gradients at ``fp32_grad_tol``; None = the default),
    and every gradient finite."""
    q, k, v, g, beta, h0 = make_kda_inputs(1, sum(lens), H, HV, K, V, dtype, seed=seed,
                                           g_mode=g_mode, n_states=len(lens), h0=True)
    got = check_vs_reference((q, k, v, g, beta), h0, dtype=dtype, seed=seed,
                             cu_seqlens=cu_of(lens), plan=plan,
                             grad_tol=fp32_grad_tol if dtype == torch.float32 else None)
    assert all(bool(torch.isfinite(t).all()) for t in got if t is not None)


def fwd_bwd_saved(inputs, h0, cu, do, dht, plan):
    """One forward and backward with ``plan``: ``(o, ht, g_cumsum, A, *grads)`` (the saved
    G and T too, so that plan variants can be compared on them)."""
    from cake_kda_det_train import chunk_kda_det_bwd, chunk_kda_det_fwd

    o, ht, saved = chunk_kda_det_fwd(*inputs, initial_state=h0, output_final_state=True,
                                     cu_seqlens=cu, plan=plan)
    return (o, ht, saved.g_cumsum, saved.A, *chunk_kda_det_bwd(do, dht, saved))


def assert_repeats_and_close(inputs, h0, cu, do, dht, new, base, rtol=1e-4, atol=1e-5):
    """``plan`` variant ``new``: the same bits twice, and close to ``base`` (same math, other
    sum order) in every output of :func:`fwd_bwd_saved`."""
    from cake_core.testing import assert_bitwise_repeat

    want = fwd_bwd_saved(inputs, h0, cu, do, dht, base)
    got = assert_bitwise_repeat(lambda: fwd_bwd_saved(inputs, h0, cu, do, dht, new), repeats=2)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a is None) == (b is None), i
        if a is not None:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def variant_plan(plan_of, K, V, dtype, over):
    """``plan_of(K, V, dtype, **over)`` for a float64 test of a plan variant: on CUDA without
    an overridden ``block_k_inner`` or ``block_k_bwd`` (the CUDA rule's key blocks: 16 is
    refused for fp32 there), skipped when :func:`cake_kda_det_train.plan.cuda_plan_problem`
    refuses it."""
    from cake_kda_det_train.plan import cuda_plan_problem

    if DEV.type == "cuda":
        over = {n: x for n, x in over.items() if n not in ("block_k_inner", "block_k_bwd")}
    plan = plan_of(K, V, dtype, **over)
    why = cuda_plan_problem(plan, dtype) if DEV.type == "cuda" else None
    if why:
        pytest.skip(why)
    return plan


def spy_launches(monkeypatch, name: str) -> list:
    """Replace the kernel ``cake_kda_det_train.chunk.<name>`` by a spy that still launches
    it: returns the list that gets ``(grid, kwargs)`` of every launch."""
    import cake_kda_det_train.chunk as chunk

    calls = []
    real = getattr(chunk, name)

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append((grid, kwargs))
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(chunk, name, Spy())
    return calls


@pytest.fixture
def kda():
    """This module: ``kda.make_kda_inputs(...)``, ``kda.check_vs_reference(...)``, ..."""
    return sys.modules[__name__]
