"""is_supported, workspace_bytes and saved_bytes of cake-gqa-train agree with what gqa
checks, allocates and keeps: the reason is the entry's ValueError message, the byte counts
equal the workspace's and the saved set's own storages, nothing launched or modified."""

import contextlib

import cake_gqa_det_train as det
import cake_gqa_det_train.launch as det_launch
import cake_gqa_train.api as nd_api
import pytest
import torch
from _gqa_nd_cases import DEV, DTYPE, make
from cake_core.support import Support, owned_nbytes
from cake_core.testing import no_kernel_launches
from cake_gqa_train import (
    GQAWorkspace,
    gqa,
    gqa_fwd,
    is_supported,
    make_plan,
    saved_bytes,
    workspace_bytes,
)
from test_gqa_nondet_bad_inputs import CASES, _base

DET_KERNELS = ("gqa_fwd_kernel", "gqa_bwd_delta_kernel", "gqa_bwd_dkdv_kernel",
               "gqa_bwd_dq_kernel")


@contextlib.contextmanager
def _no_launch():
    with no_kernel_launches(det_launch, *DET_KERNELS), \
            no_kernel_launches(nd_api, "gqa_bwd_dkdv_atomic_kernel"):
        yield


def _packed(lens_q, lens_k=None, Hq=4, Hkv=2, D=64, **opts):
    q, k, v, _, cq, ck = make(lens_q, lens_k, Hq=Hq, Hkv=Hkv, D=D, seed=5)
    return {"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck, **opts}


def _batched(B, Sq, Sk=None, Hq=4, Hkv=2, D=64, strided=False, **opts):
    Sk = Sq if Sk is None else Sk
    t = [torch.randn(s, dtype=DTYPE, device=DEV)
         for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D))]
    if strided:  # token-major storage: [B, S] do not merge, the packed view is a copy
        t = [x.transpose(0, 1).contiguous().transpose(0, 1) for x in t]
    return {"q": t[0], "k": t[1], "v": t[2], **opts}


CALLS = {
    "packed ragged D64": lambda: _packed([5, 0, 1, 17], [3, 0, 1, 20]),
    "packed 1-token docs D128": lambda: _packed([1, 1, 1], D=128, Hq=2, Hkv=1),
    "packed D256 window": lambda: _packed([9, 0], [4, 0], D=256, Hq=2, Hkv=2,
                                          window_size=(3, 2), causal=False),
    "packed softcap": lambda: _packed([12, 3], Hq=6, Hkv=2, softcap=5.0),
    "batch D64": lambda: _batched(2, 7, 9),
    "batch D128 strided": lambda: _batched(3, 5, D=128, strided=True),
    "batch D256 strided": lambda: _batched(2, 6, 3, D=256, Hq=2, Hkv=1, strided=True),
    "batch 1 token": lambda: _batched(4, 1, 1),
}


def _inputs(a):
    return [t for t in a.values() if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("D", [64, 128, 256])
def test_workspace_bytes_equals_for_plan(D):
    plan = make_plan(D, DTYPE, DEV)
    for sizes in [(1, 0, 1, 0), (1, 1, 1, 1), (3, 7, 1, 9), (8, 33, 2, 17), (32, 4097, 8, 4097)]:
        ws = GQAWorkspace.for_plan(plan, DEV, *sizes)
        assert workspace_bytes(plan, DEV, *sizes) == ws.nbytes
        assert workspace_bytes(plan, None, *sizes) == ws.nbytes


@pytest.mark.parametrize("args", [
    ("det plan", "cpu", 4, 8, 2, 8), ("plan", "cpu", 4, 8, 0, 8), ("plan", "cpu", 4, 8, 2, -1),
    ("plan", "cpu", 0, 8, 2, 8), ("plan", "cpu", 4, None, 2, 8), ("plan", "x", 4, 8, 2, 8)])
def test_workspace_bytes_refuses_as_for_plan(args):
    plans = {"plan": make_plan(64, DTYPE, DEV),
             "det plan": det.make_plan(64, DTYPE, DEV)}
    args = tuple(plans.get(a, a) if isinstance(a, str) else a for a in args)
    with pytest.raises(ValueError) as want:
        GQAWorkspace.for_plan(*args)
    with pytest.raises(ValueError) as got:
        workspace_bytes(*args)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("name", list(CALLS))
def test_saved_bytes_equals_saved_set_and_autograd(name):
    a = CALLS[name]()
    want = saved_bytes(**a)
    _, _, saved = gqa_fwd(**a)
    assert owned_nbytes(saved.tensors(), exclude=_inputs(a)) == want
    q = a["q"]
    if "strided" in name:  # the packed copies of q, k and v are kept
        assert want == sum(a[n].numel() * a[n].element_size() for n in "qkv") + \
            q.numel() * q.element_size() + 4 * q.numel() // q.shape[-1]
    a = {n: t.requires_grad_() if n in "qkv" else t for n, t in a.items()}
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        gqa(**a)
    assert owned_nbytes(kept, exclude=_inputs(a)) == want


@pytest.mark.parametrize("name", list(CALLS))
def test_saved_bytes_on_meta(name):
    a = CALLS[name]()
    m = {n: t.to("meta") if isinstance(t, torch.Tensor) else t for n, t in a.items()}
    assert [t.stride() for t in _inputs(m)] == [t.stride() for t in _inputs(a)]
    assert saved_bytes(**m) == saved_bytes(**a)


@pytest.mark.parametrize("name", list(CALLS))
def test_is_supported_true_launches_nothing(name):
    a = CALLS[name]()
    q, k = a["q"], a["k"]
    plan = make_plan(q.shape[-1], q.dtype, DEV)
    tq, tk = q.numel() // q.shape[-1] // q.shape[-2], k.numel() // k.shape[-1] // k.shape[-2]
    a.update(plan=plan, workspace=GQAWorkspace.for_plan(plan, DEV, q.shape[-2], tq,
                                                         k.shape[-2], tk))
    before = {n: t.clone() for n, t in a.items() if isinstance(t, torch.Tensor)}
    with _no_launch():
        s = is_supported(**a, return_lse=True)
    assert s == Support(True, "") and s
    assert all(torch.equal(a[n], t) for n, t in before.items())


BAD = {
    **{n: (lambda c=c: c(_base())) for n, (c, _) in CASES.items()},
    "window not a pair": lambda: {**_base(), "window_size": (1, 2, 3)},
    "window bool": lambda: {**_base(), "window_size": (True, 0)},
    "softcap negative": lambda: {**_base(), "softcap": -1.0},
    "softcap nan": lambda: {**_base(), "softcap": float("nan")},
    "softmax_scale 0": lambda: {**_base(), "softmax_scale": 0.0},
    "causal int": lambda: {**_base(), "causal": 1},
    "return_lse str": lambda: {**_base(), "return_lse": "yes"},
    "max_seqlen_q below": lambda: {**_base(), "max_seqlen_q": 3},
    "head dim 96": lambda: {n: t[..., :96] if n in "qkv" else t
                            for n, t in _packed([3, 4], D=128).items()},
    "batched with offsets": lambda: {**_batched(2, 4),
                                     "cu_seqlens_q": _base()["cu_seqlens_q"]},
    "meta inputs": lambda: {n: t.to("meta") for n, t in _batched(2, 4).items()},
    "det workspace": lambda: {**_base(), "workspace": det.GQADetWorkspace.for_plan(
        det.make_plan(64, DTYPE, DEV), DEV, 4, 65)},
}


@pytest.mark.parametrize("case", list(BAD))
def test_is_supported_false_with_gqas_message_and_saved_bytes_raises_it(case):
    """The reason is gqa's ValueError message (windows, softcap, offsets, plans,
    workspaces, ...); nothing launched, inputs unchanged; saved_bytes raises the same
    (but for meta inputs, which it takes)."""
    make_args = BAD[case]
    with _no_launch():
        with pytest.raises(ValueError) as want:
            gqa(**make_args())
        a = make_args()
        before = {n: t.clone() for n, t in a.items()
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        s = is_supported(**a)
        assert not s and s.reason == str(want.value)
        assert all(torch.equal(a[n], t) for n, t in before.items())
        if case != "meta inputs":
            with pytest.raises(ValueError) as got:
                saved_bytes(**make_args())
            assert str(got.value) == str(want.value)
