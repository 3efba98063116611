"""moe_feed_forward_is_supported / moe_feed_forward_saved_bytes (issue 45): the layer's
checks (its messages, no launch) and the bytes its autograd graph keeps, against what the
forward really saves (collected with saved-tensor hooks)."""

import cake_moe_grouped_det_gemm.api as api
import pytest
import torch
from _moe_cases import DEV
from cake_core.support import Support, owned_nbytes
from cake_core.testing import no_kernel_launches, randn
from cake_moe_grouped_det_gemm import (
    make_moe_plans,
    moe_feed_forward_det,
    moe_feed_forward_is_supported,
    moe_feed_forward_saved_bytes,
)
from test_moe_ffn import BAD, D, E, F, _base, params

LAUNCHES = ("_launch_fwd", "_launch_bwd", "_grouped_mm", "_launch_wgrad")


def saved_by_forward(x, weights, top_k, **kw):
    """Bytes of the distinct storages the forward's graph saves, less the caller's."""
    leaves = [t.detach().clone().requires_grad_() for t in weights]
    got = []

    def pack(t):
        got.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y, aux = moe_feed_forward_det(x, *leaves, top_k, **kw)
    return owned_nbytes(got, exclude=(x, *leaves)), leaves


@pytest.mark.parametrize("T, shape, dtype, rdtype, k, normalize, coef, strided", [
    (6, None, torch.float32, torch.float32, 2, True, 0.01, False),
    (7, None, torch.bfloat16, torch.bfloat16, 1, False, 0.0, False),
    (12, (3, 4), torch.float16, torch.float32, 3, True, 0.5, False),
    (5, None, torch.float32, torch.bfloat16, E, False, 0.01, True),   # reshape copies x
    (0, None, torch.float32, torch.float32, 2, True, 0.01, False),
])
def test_saved_bytes_is_what_the_forward_keeps(T, shape, dtype, rdtype, k, normalize, coef,
                                               strided):
    r, wgu, wd = params(dtype=dtype)
    r = r.to(rdtype)
    x = randn((T, 2 * D) if strided else (T, D), dtype, DEV, seed=9)
    x = x[:, ::2] if strided else x.reshape(*(shape or (T,)), D)
    kw = dict(normalize_topk=normalize, aux_loss_coef=coef)
    want, leaves = saved_by_forward(x, (r, wgu, wd), k, **kw)
    assert moe_feed_forward_saved_bytes(x, *leaves, k, **kw) == want
    meta = [t.to("meta") for t in (x, *leaves)]
    assert moe_feed_forward_saved_bytes(*meta, k, **kw) == want


def test_is_supported():
    base = _base()
    plans = make_moe_plans(6, D, F, E, 2, torch.float32, DEV)
    with no_kernel_launches(api, *LAUNCHES):
        assert moe_feed_forward_is_supported(**base) == Support(True, "")
        assert moe_feed_forward_is_supported(**base, plans=plans, normalize_topk=False,
                                             aux_loss_coef=0.0)
    for case, (change, _) in BAD.items():
        args = {**base, **change}
        with pytest.raises(ValueError) as e:
            moe_feed_forward_det(**args)
        with no_kernel_launches(api, *LAUNCHES):
            assert moe_feed_forward_is_supported(**args) == Support(False, str(e.value)), case
        if case != "device":  # saved_bytes serves meta tensors
            with pytest.raises(ValueError) as e2:
                moe_feed_forward_saved_bytes(**args)
            assert str(e2.value) == str(e.value), case
