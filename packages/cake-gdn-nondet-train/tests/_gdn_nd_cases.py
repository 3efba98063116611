"""Shared input factory of the cake-gdn-nondet-train tests (fresh random values)."""

import torch
import torch.nn.functional as F
from cake_core.testing import randn
from cake_core.triton_utils import default_device

DEV = default_device()


def make_inputs(B, T, H, HV, K, V, dtype=torch.float32, *, seed=0, n_states=None, h0=False):
    """q, k, v, g, beta and an initial state ``[n_states or B, HV, K, V]`` (or None);
    k L2-normalised, g = logsigmoid, beta = sigmoid (fp32)."""
    q = randn((B, T, H, K), torch.float64, "cpu", seed=seed)
    k = F.normalize(randn((B, T, H, K), torch.float64, "cpu", seed=seed + 1), dim=-1)
    v = randn((B, T, HV, V), torch.float64, "cpu", seed=seed + 2)
    g = F.logsigmoid(randn((B, T, HV), torch.float64, "cpu", seed=seed + 3))
    beta = torch.sigmoid(randn((B, T, HV), torch.float64, "cpu", seed=seed + 4))
    state = None
    if h0:
        state = 0.5 * randn((n_states or B, HV, K, V), torch.float64, "cpu", seed=seed + 5)
        state = state.to(DEV, torch.float32)
    q, k, v = (t.to(DEV, dtype) for t in (q, k, v))
    g, beta = (t.to(DEV, torch.float32) for t in (g, beta))
    return q, k, v, g, beta, state
