"""Shared input factory of the cake-gdn-det-train tests (fresh random values, never zeros)."""

import pytest
import torch
import torch.nn.functional as F
from cake_core.testing import randn
from cake_core.triton_utils import default_device

DEV = default_device()


def _g(shape, mode: str, seed: int) -> torch.Tensor:
    x = randn(shape, torch.float64, "cpu", seed=seed)
    if mode == "real":            # logsigmoid of randn: about -0.7 on average, in (-4, 0)
        return F.logsigmoid(x)
    if mode == "strong":          # strongly negative, down to -20 (the state nearly resets)
        return -20.0 * torch.sigmoid(2.0 * x)
    if mode == "near0":           # decay near 1: the state remembers the whole sequence
        return -1e-3 * torch.sigmoid(x)
    raise ValueError(mode)


def make_gdn_inputs(B, T, H, HV, K, V, dtype=torch.float32, *, seed=0, g_mode="real",
                    n_states=None, normalize_k=True, gb_dtype=torch.float32, h0=False):
    """q, k, v, g, beta (and an initial state ``[n_states or B, HV, K, V]`` or None).

    k is L2-normalised (the regime GDN runs in; unnormalised keys make the delta rule
    unstable) unless ``normalize_k`` is False (for the in-kernel L2-norm tests)."""
    q = randn((B, T, H, K), torch.float64, "cpu", seed=seed)
    k = randn((B, T, H, K), torch.float64, "cpu", seed=seed + 1)
    if normalize_k:
        k = F.normalize(k, dim=-1)
    else:
        k = 2.0 * k
    v = randn((B, T, HV, V), torch.float64, "cpu", seed=seed + 2)
    g = _g((B, T, HV), g_mode, seed + 3)
    beta = torch.sigmoid(randn((B, T, HV), torch.float64, "cpu", seed=seed + 4))
    state = None
    if h0:
        state = 0.5 * randn((n_states or B, HV, K, V), torch.float64, "cpu", seed=seed + 5)
        state = state.to(DEV, torch.float32)
    q, k, v = (t.to(DEV, dtype) for t in (q, k, v))
    g, beta = (t.to(DEV, gb_dtype) for t in (g, beta))
    return q, k, v, g, beta, state


@pytest.fixture
def gdn_inputs():
    return make_gdn_inputs
