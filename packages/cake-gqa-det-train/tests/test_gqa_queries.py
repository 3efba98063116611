"""is_supported, workspace_bytes and saved_bytes agree with what gqa_det checks, allocates
and keeps: the reason is the entry's ValueError message, the byte counts equal the
workspace's and the saved set's own storages, and nothing is launched or modified."""

import cake_gqa_det_train.launch as launch
import pytest
import torch
from _gqa_cases import DEV, make
from cake_core.support import Support, owned_nbytes
from cake_core.testing import no_kernel_launches
from cake_gqa_det_train import (
    HEAD_DIMS,
    GQADetWorkspace,
    gqa_det,
    gqa_det_fwd,
    is_supported,
    make_plan,
    saved_bytes,
    workspace_bytes,
)
from test_gqa_bad_inputs import GQA_DET, KERNELS, _batched, _packed

# (case maker's kwargs, extra entry options): packed with ragged offsets (empty and
# 1-token documents, more keys than queries and fewer), fixed-length batches
SHAPES = {
    "packed ragged D64": (dict(lens_q=[5, 0, 1, 17], lens_k=[3, 0, 1, 20]), {}),
    "packed 1-token docs D128": (dict(lens_q=[1, 1, 1], D=128, Hq=2, Hkv=1), {}),
    "packed empty tail D256": (dict(lens_q=[9, 0], lens_k=[4, 0], D=256, Hq=2, Hkv=2),
                               dict(causal=False)),
    "packed window softcap": (dict(lens_q=[12, 3], Hq=6, Hkv=2),
                              dict(window_size=(4, 1), softcap=5.0, causal=False)),
    "packed bf16 D128": (dict(lens_q=[7, 0, 11], D=128, dtype=torch.bfloat16), {}),
    "batch D64": (dict(B=2, Sq=7, Sk=9), {}),
    "batch D128 fp16": (dict(B=3, Sq=5, D=128, dtype=torch.float16, Hq=4, Hkv=4), {}),
    "batch D256": (dict(B=1, Sq=6, Sk=3, D=256, Hq=2, Hkv=1), dict(window_size=(2, -1))),
    "batch 1 token": (dict(B=4, Sq=1, Sk=1), {}),
}


def _args(name, strided=False):
    kw, opts = SHAPES[name]
    c = make(seed=3, **kw)
    a = {"q": c["q"], "k": c["k"], "v": c["v"], **opts}
    if c["cu_q"] is not None:
        a["cu_seqlens_q"], a["cu_seqlens_k"] = c["cu_q"], c["cu_k"]
    if strided:  # token-major storage: [B, S] do not merge, the packed view is a copy
        a = {n: t.transpose(0, 1).contiguous().transpose(0, 1) if n in "qkv" else t
             for n, t in a.items()}
    return a


def _inputs(a):
    return [t for t in a.values() if isinstance(t, torch.Tensor)]


# ----------------------------------------------------------------------------- workspace


@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_workspace_bytes_equals_for_plan(D, dtype):
    plan = make_plan(D, dtype, DEV)
    for heads, tokens in [(1, 0), (1, 1), (3, 7), (8, 33), (32, 4097), (65535, 3)]:
        ws = GQADetWorkspace.for_plan(plan, DEV, heads, tokens)
        assert workspace_bytes(plan, DEV, heads, tokens) == ws.nbytes
        assert workspace_bytes(plan, num_heads=heads, max_tokens=tokens) == ws.nbytes


@pytest.mark.parametrize("args", [
    (object(), "cpu", 4, 8), ("a str", "cpu", 4, 8), (None, "cpu", 4, 8),
    ("plan", "cpu", 0, 8), ("plan", "cpu", 4, -1), ("plan", "cpu", 4.0, 8),
    ("plan", "cpu", True, 8), ("plan", "nodevice", 4, 8), ("plan", "cpu", None, 8)])
def test_workspace_bytes_refuses_as_for_plan(args):
    args = tuple(make_plan(64, torch.float32, DEV) if a == "plan" else a for a in args)
    with pytest.raises(ValueError) as want:
        GQADetWorkspace.for_plan(*args)
    with pytest.raises(ValueError) as got:
        workspace_bytes(*args)
    assert str(got.value) == str(want.value)


# ----------------------------------------------------------------------------- saved set


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("name", list(SHAPES))
def test_saved_bytes_equals_saved_set(name, strided):
    """The low-level forward's saved set, less the caller's tensors, takes saved_bytes."""
    if strided and "lens_q" in SHAPES[name][0]:
        pytest.skip("packed input is never copied")
    a = _args(name, strided)
    want = saved_bytes(**a)
    _, _, saved = gqa_det_fwd(**a)
    assert owned_nbytes(saved.tensors(), exclude=_inputs(a)) == want
    q = a["q"]
    out_lse = q.numel() * q.element_size() + 4 * q.numel() // q.shape[-1]
    if not strided:
        assert want == out_lse
    elif q.shape[0] > 1 and q.shape[1] > 1:
        assert want > out_lse


@pytest.mark.parametrize("name", ["packed ragged D64", "batch D64", "batch D256"])
@pytest.mark.parametrize("strided", [False, True])
def test_saved_bytes_equals_autograd_saved(name, strided):
    """gqa_det's autograd node keeps the same bytes (saved-tensor hooks see them)."""
    if strided and "lens_q" in SHAPES[name][0]:
        pytest.skip("packed input is never copied")
    a = _args(name, strided)
    a = {n: t.requires_grad_() if n in "qkv" else t for n, t in a.items()}
    kept = []

    def pack(t):
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        gqa_det(**a)
    assert owned_nbytes(kept, exclude=_inputs(a)) == saved_bytes(**a)


def test_saved_bytes_k_is_v_and_q():
    """One tensor passed as q, k and v: a strided one is packed (copied) three times."""
    for strided in (False, True):
        a = _args("batch D64", strided)
        a["k"] = a["v"] = a["q"]
        _, _, saved = gqa_det_fwd(**a)
        assert owned_nbytes(saved.tensors(), exclude=_inputs(a)) == saved_bytes(**a)


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("strided", [False, True])
def test_saved_bytes_on_meta(name, strided):
    """Meta inputs (offsets too) give the bytes of the same call on real tensors."""
    a = _args(name, strided)
    m = {n: t.to("meta") if isinstance(t, torch.Tensor) else t for n, t in a.items()}
    if strided:
        m = {n: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
             if n in "qkv" else t for n, t in m.items()}
    assert saved_bytes(**m) == saved_bytes(**a)


@pytest.mark.parametrize("case", list(GQA_DET))
def test_saved_bytes_refuses_as_gqa_det(case):
    make_args, _ = GQA_DET[case]
    with no_kernel_launches(launch, *KERNELS):
        with pytest.raises(ValueError) as want:
            gqa_det(**make_args())
        with pytest.raises(ValueError) as got:
            saved_bytes(**make_args())
    assert str(got.value) == str(want.value)


# ----------------------------------------------------------------------------- is_supported


def _snapshot(a):
    return {n: t.clone() for n, t in a.items() if isinstance(t, torch.Tensor)}


def _unchanged(a, before):
    return all(torch.equal(a[n], t) and a[n].dtype == t.dtype for n, t in before.items())


@pytest.mark.parametrize("name", list(SHAPES))
def test_is_supported_true_launches_nothing(name):
    a = _args(name)
    a["plan"] = make_plan(a["q"].shape[-1], a["q"].dtype, DEV)
    heads, tokens = a["q"].shape[-2], a["q"].numel() // a["q"].shape[-1] // a["q"].shape[-2]
    a["workspace"] = GQADetWorkspace.for_plan(a["plan"], DEV, heads, tokens)
    before = _snapshot(a)
    with no_kernel_launches(launch, *KERNELS):
        s = is_supported(**a, return_lse=True)
    assert s == Support(True, "") and s and isinstance(s, Support)
    assert _unchanged(a, before)


@pytest.mark.parametrize("case", list(GQA_DET))
def test_is_supported_false_with_gqa_dets_message(case):
    """Every refusal of the bad-input table (windows, softcap, offsets, plans, ...): the
    reason is gqa_det's ValueError message, nothing launched, inputs unchanged."""
    make_args, _ = GQA_DET[case]
    with no_kernel_launches(launch, *KERNELS):
        with pytest.raises(ValueError) as want:
            gqa_det(**make_args())
        a = make_args()
        before = _snapshot({n: t for n, t in a.items()
                            if isinstance(t, torch.Tensor) and t.device.type != "meta"})
        s = is_supported(**a)
    assert not s and s.ok is False
    assert s.reason == str(want.value)
    assert _unchanged(a, before)


def test_is_supported_workspace_too_small_and_meta():
    a = _packed()
    plan = make_plan(64, torch.float32, DEV)
    small = GQADetWorkspace.for_plan(plan, DEV, 4, 31)
    s = is_supported(**a, plan=plan, workspace=small)
    assert not s and s.reason.startswith("workspace: 'delta' must be a contiguous 1-D fp32")
    assert is_supported(**a, plan=plan, workspace=GQADetWorkspace.for_plan(plan, DEV, 4, 32))
    if DEV.type == "cpu":  # the entry refuses meta inputs; so does is_supported
        m = {n: t.to("meta") for n, t in _batched().items()}
        s = is_supported(**m)
        assert not s and s.reason.startswith("q: on meta")
