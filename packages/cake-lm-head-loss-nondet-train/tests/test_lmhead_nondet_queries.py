"""is_supported_nondet / workspace_bytes_nondet / saved_bytes_nondet agree with the entry's
checks and with what for_plan and the forward allocate."""

import dataclasses

import cake_lm_head_loss_det_train.api as det_api
import pytest
import torch
from cake_core.support import owned_nbytes
from cake_core.testing import no_kernel_launches, randn
from cake_core.triton_utils import default_device
from cake_lm_head_loss_det_train import make_plan
from cake_lm_head_loss_nondet_train import (
    LMHeadLossNondetWorkspace,
    is_supported_nondet,
    lm_head_loss_nondet,
    lm_head_loss_nondet_fwd,
    make_nondet_plan,
    saved_bytes_nondet,
    workspace_bytes_nondet,
)

DEV = default_device()


@pytest.mark.parametrize("H,V", [(1, 1), (33, 1000), (4096, 128256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dh_split", [None, 3])
def test_workspace_bytes_nondet_matches_for_plan(H, V, dtype, dh_split):
    plan = make_nondet_plan(H, V, dtype, DEV)
    if dh_split is not None:
        plan = dataclasses.replace(plan, dh_split=dh_split)
    assert workspace_bytes_nondet(plan, DEV, dtype) == \
        LMHeadLossNondetWorkspace.for_plan(plan, DEV, dtype).nbytes


def test_workspace_bytes_nondet_refuses_a_det_plan():
    det = make_plan(16, 10, torch.float32, DEV)
    with pytest.raises(ValueError) as e:
        LMHeadLossNondetWorkspace.for_plan(det, DEV)
    with pytest.raises(ValueError) as e2:
        workspace_bytes_nondet(det)
    assert str(e.value) == str(e2.value)


@pytest.mark.parametrize("lead", [(6,), (2, 3), (0,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_saved_bytes_nondet_matches_forward(lead, dtype, reduction):
    H, V = 16, 10
    h = randn((*lead, H), dtype, DEV, seed=1)
    w = randn((V, H), dtype, DEV, seed=2)
    y = (torch.arange(h.numel() // H, device=DEV) % V).reshape(lead)
    b = randn((V,), torch.float32, DEV, seed=3)
    for hh in [h] + ([h.transpose(0, 1)] if len(lead) == 2 else []):
        yy = y.transpose(0, 1) if hh is not h else y
        _, saved = lm_head_loss_nondet_fwd(hh, w, yy, bias=b, reduction=reduction)
        want = owned_nbytes(saved.tensors(), exclude=[hh, w, yy, b])
        assert saved_bytes_nondet(hh, w, yy, bias=b, reduction=reduction) == want
        meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                for t in (hh, w, yy)]
        assert saved_bytes_nondet(*meta, bias=b.to("meta"), reduction=reduction) == want


def test_is_supported_nondet():
    h, w = randn((6, 16), torch.float32, DEV), randn((10, 16), torch.float32, DEV)
    y = torch.arange(6, device=DEV)
    bad = {"hidden int": ((h.int(), w, y), {}),
           **({"label too large": ((h, w, y + 10), {})} if DEV.type == "cpu" else {}),
           "reduction": ((h, w, y), {"reduction": "avg"}),
           "det plan": ((h, w, y), {"plan": make_plan(16, 10, torch.float32, DEV)}),
           "plan of another H": ((h, w, y), {"plan": make_nondet_plan(8, 10, torch.float32,
                                                                       DEV)})}
    with no_kernel_launches(det_api, "_forward_impl", "_backward_impl", "_run_chunks"):
        assert is_supported_nondet(h, w, y)
        for name, (args, kw) in bad.items():
            s = is_supported_nondet(*args, **kw)
            with pytest.raises(ValueError) as e:
                lm_head_loss_nondet(*args, **kw)
            assert not s and s.reason == str(e.value), name
            if name != "label too large":
                with pytest.raises(ValueError) as e2:
                    saved_bytes_nondet(*args, **kw)
                assert str(e2.value) == s.reason
