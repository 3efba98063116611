"""Integration: cake-kda-det-train refuses cake-gdn-det-train's saved sets, plans and
workspaces (and GDN refuses KDA's), with ValueError before any launch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_gdn_det_train import GDNDetWorkspace, chunk_gdn_det_bwd, chunk_gdn_det_fwd
from cake_gdn_det_train import make_plan as make_gdn_plan
from cake_kda_det_train import KDADetWorkspace, chunk_kda_det_bwd, chunk_kda_det_fwd
from cake_kda_det_train import make_plan as make_kda_plan

DEV = default_device()
T, H, HV, K, V = 20, 1, 2, 16, 16


def _qkv():
    q = randn((1, T, H, K), torch.float32, DEV, seed=1)
    k = F.normalize(randn((1, T, H, K), torch.float32, DEV, seed=2), dim=-1)
    v = randn((1, T, HV, V), torch.float32, DEV, seed=3)
    beta = randn((1, T, HV), torch.float32, DEV, seed=4).sigmoid()
    return q, k, v, beta


def test_gdn_saved_set_refused_by_kda_backward_and_back():
    q, k, v, beta = _qkv()
    g_head = F.logsigmoid(randn((1, T, HV), torch.float32, DEV, seed=5))
    g_chan = F.logsigmoid(randn((1, T, HV, K), torch.float32, DEV, seed=6))
    _, _, gdn_saved = chunk_gdn_det_fwd(q, k, v, g_head, beta)
    _, _, kda_saved = chunk_kda_det_fwd(q, k, v, g_chan, beta)
    do = torch.ones_like(v)
    with pytest.raises(ValueError, match="saved: got GDNDetSavedSet .* expected KDADetSavedSet"):
        chunk_kda_det_bwd(do, None, gdn_saved)
    with pytest.raises(ValueError, match="saved: got KDADetSavedSet .* expected GDNDetSavedSet"):
        chunk_gdn_det_bwd(do, None, kda_saved)


def test_gdn_plan_and_workspace_refused_by_kda():
    q, k, v, beta = _qkv()
    g_chan = F.logsigmoid(randn((1, T, HV, K), torch.float32, DEV, seed=6))
    gdn_plan = make_gdn_plan(K, V, torch.float32, DEV)
    with pytest.raises(ValueError, match="plan: got GDNDetPlan"):
        chunk_kda_det_fwd(q, k, v, g_chan, beta, plan=gdn_plan)
    gdn_ws = GDNDetWorkspace.for_plan(gdn_plan, DEV, num_v_heads=HV, max_tokens=T)
    with pytest.raises(ValueError, match="workspace: got GDNDetWorkspace"):
        chunk_kda_det_fwd(q, k, v, g_chan, beta, workspace=gdn_ws)
    with pytest.raises(ValueError, match="plan"):
        KDADetWorkspace.for_plan(gdn_plan, DEV, num_v_heads=HV, max_tokens=T)
    kda_plan = make_kda_plan(K, V, torch.float32, DEV)
    with pytest.raises(ValueError, match="plan: got KDADetPlan"):
        chunk_gdn_det_fwd(q, k, v, g_chan[..., 0], beta, plan=kda_plan)


def test_every_workspace_for_plan_refuses_cuda_without_cuda():
    """Workspace.for_plan(..., "cuda") on a machine without CUDA is a ValueError, as
    make_plan's is (torch's own error was a RuntimeError or an AssertionError)."""
    import importlib
    import inspect

    from cake_core.names import REGISTRY

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    seen = 0
    for e in REGISTRY:
        if e.planned or e.mode not in ("det", "exception") or e.kind != "local":
            continue
        mod = importlib.import_module(e.import_name)
        for name in dir(mod):
            obj = getattr(mod, name)
            if not (isinstance(obj, type) and name.endswith("Workspace")
                    and hasattr(obj, "for_plan")):
                continue
            params = list(inspect.signature(obj.for_plan).parameters.values())[2:]
            args = [1 for p in params if p.default is p.empty and p.kind != p.KEYWORD_ONLY]
            kw = {p.name: 1 for p in params if p.default is p.empty
                  and p.kind == p.KEYWORD_ONLY}
            with pytest.raises(ValueError, match="CUDA is not available here"):
                obj.for_plan(None, "cuda", *args, **kw)
            seen += 1
    assert seen >= 10, seen
