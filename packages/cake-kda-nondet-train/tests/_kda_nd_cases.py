"""Inputs and the float64 reference of the cake-kda-nondet-train tests (tiny shapes: the
kernels run through Triton's interpreter on the CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from cake_core.testing import assert_close_to_reference, randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import kda_recurrence_ref

DEV = default_device()
#: fp32 tolerance of dA_log / ddt_bias: sums over every token of terms of both signs
PARAM_TOL_FP32 = 1e-4
NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state", "dA_log",
         "ddt_bias")


def cu_of(lens, dtype=torch.int32):
    """``cu_seqlens`` on the test device for documents of ``lens`` tokens."""
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=dtype, device=DEV)


def make(B, T, H, HV, K, V, *, seed, raw=False, n_states=None, h0=True):
    """fp32 leaves ``(q, k, v, g, beta, h0, A_log, dt_bias)``: with ``raw`` FLA's raw gate,
    pre-sigmoid beta, unnormalised q / k and gate parameters (Kimi Linear's call), else a
    log-sigmoid decay, beta in (0, 1), L2-normalised k and no gate parameters."""
    q = randn((B, T, H, K), torch.float32, DEV, seed=seed)
    k = randn((B, T, H, K), torch.float32, DEV, seed=seed + 1)
    v = randn((B, T, HV, V), torch.float32, DEV, seed=seed + 2)
    g = randn((B, T, HV, K), torch.float32, DEV, seed=seed + 3)
    beta = 2.0 * randn((B, T, HV), torch.float32, DEV, seed=seed + 4)
    A_log = dt_bias = None
    if raw:
        g = 1.5 * g
        A_log = 0.5 * randn((HV,), torch.float32, DEV, seed=seed + 5) - 0.5
        dt_bias = 0.5 * randn((HV * K,), torch.float32, DEV, seed=seed + 6)
    else:
        k = F.normalize(k, dim=-1)
        g = F.logsigmoid(g)
        beta = beta.sigmoid()
    state = 0.5 * randn((n_states or B, HV, K, V), torch.float32, DEV, seed=seed + 7) \
        if h0 else None
    return q, k, v, g, beta, state, A_log, dt_bias


def run(fn, leaves, do, dht, **kw):
    """``fn(q, k, v, g, beta, initial_state=, output_final_state=True, A_log=, dt_bias=,
    **kw)`` on fresh leaves, backward of (o, final_state) with (do, dht); returns ``[o,
    final_state, grads...]`` in :data:`NAMES` order (None where a leaf is None)."""
    ls = [t.detach().clone().requires_grad_() if t is not None else None for t in leaves]
    o, ht = fn(*ls[:5], initial_state=ls[5], output_final_state=True, A_log=ls[6],
               dt_bias=ls[7], **kw)
    torch.autograd.backward([o, ht], [do.to(o.dtype), dht.to(ht.dtype)])
    return [o.detach(), ht.detach()] + [t.grad if t is not None else None for t in ls]


def reference(leaves, do, dht, **kw):
    """:func:`run` through ``kda_recurrence_ref`` in float64."""
    kw = {n: x for n, x in kw.items() if n not in ("plan", "workspace", "safe_gate")}
    f64 = [t.double() if t is not None else None for t in leaves]
    return run(lambda *a, **k2: kda_recurrence_ref(*a, **k2, dtype=torch.float64), f64,
               do.double(), dht.double(), **kw)


def check(fn, leaves, *, seed, n_states, **kw):
    """o, final_state and every gradient of ``fn`` against the float64 reference (fp32
    tolerances of cake_core.testing; the final state at 1e-5, dA_log / ddt_bias at
    :data:`PARAM_TOL_FP32`); returns the gradients."""
    q, v = leaves[0], leaves[2]
    do = randn(v.shape, torch.float32, DEV, seed=seed + 100)
    dht = randn((n_states, v.shape[2], q.shape[3], v.shape[3]), torch.float32, DEV,
                seed=seed + 101)
    got = run(fn, leaves, do, dht, **kw)
    want = reference(leaves, do, dht, **kw)
    for name, a, b in zip(NAMES, got, want, strict=True):
        if b is None:
            assert a is None, name
            continue
        tol = {"final_state": 1e-5, "dA_log": PARAM_TOL_FP32,
               "ddt_bias": PARAM_TOL_FP32}.get(name)
        assert_close_to_reference(a, b, torch.float32, name, tol=tol)
    return got
