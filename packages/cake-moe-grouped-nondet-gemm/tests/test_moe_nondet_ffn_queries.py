"""moe_feed_forward_is_supported_nondet / moe_feed_forward_saved_bytes_nondet (issue 45):
the det layer queries with this package's plans (det plans refused, no launch), and the
bytes equal what the nondet layer's autograd graph saves."""

import cake_moe_grouped_nondet_gemm.api as api
import pytest
import torch
from _moe_nd_cases import DEV
from cake_core.support import Support, owned_nbytes
from cake_core.testing import no_kernel_launches, randn
from cake_moe_grouped_det_gemm import make_moe_plans
from cake_moe_grouped_nondet_gemm import (
    make_nondet_moe_plans,
    moe_feed_forward_is_supported_nondet,
    moe_feed_forward_nondet,
    moe_feed_forward_saved_bytes_nondet,
)

D, F, E = 16, 12, 4
LAUNCHES = ("_launch_fwd", "_launch_bwd")


def _args(T=6, dtype=torch.float32):
    return dict(x=randn((T, D), dtype, DEV, seed=1),
                router_weight=randn((E, D), dtype, DEV, seed=2, scale=D ** -0.5),
                w_gate_up=randn((E, 2 * F, D), dtype, DEV, seed=3, scale=D ** -0.5),
                w_down=randn((E, D, F), dtype, DEV, seed=4, scale=F ** -0.5), top_k=2)


def test_is_supported_nondet():
    a = _args()
    nd_plans = make_nondet_moe_plans(6, D, F, E, 2, torch.float32, DEV)
    det_plans = make_moe_plans(6, D, F, E, 2, torch.float32, DEV)
    with no_kernel_launches(api, *LAUNCHES):
        assert moe_feed_forward_is_supported_nondet(**a) == Support(True, "")
        assert moe_feed_forward_is_supported_nondet(**a, plans=nd_plans)
    for over in (dict(plans=det_plans), dict(top_k=0), dict(x=a["x"][:, :-1]),
                 dict(w_down=a["w_down"].double()), dict(aux_loss_coef=-1.0)):
        args = {**a, **over}
        with pytest.raises(ValueError) as e:
            moe_feed_forward_nondet(**args)
        with no_kernel_launches(api, *LAUNCHES):
            assert moe_feed_forward_is_supported_nondet(**args) == \
                Support(False, str(e.value)), over
        with pytest.raises(ValueError) as e2:
            moe_feed_forward_saved_bytes_nondet(**args)
        assert str(e2.value) == str(e.value)


@pytest.mark.parametrize("T, dtype, normalize, coef", [
    (6, torch.float32, True, 0.01), (5, torch.bfloat16, False, 0.0),
])
def test_saved_bytes_nondet_is_what_the_forward_keeps(T, dtype, normalize, coef):
    a = _args(T, dtype)
    x, k = a.pop("x"), a.pop("top_k")
    leaves = [t.requires_grad_() for t in a.values()]
    got = []

    def pack(t):
        got.append(t)
        return t

    kw = dict(normalize_topk=normalize, aux_loss_coef=coef)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        moe_feed_forward_nondet(x, *leaves, k, **kw)
    want = owned_nbytes(got, exclude=(x, *leaves))
    assert moe_feed_forward_saved_bytes_nondet(x, *leaves, k, **kw) == want
    meta = [t.to("meta") for t in (x, *leaves)]
    assert moe_feed_forward_saved_bytes_nondet(*meta, k, **kw) == want
