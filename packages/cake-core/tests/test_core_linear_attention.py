"""cake_core.linear_attention: the chunked linear-attention families' checks, plan and
workspace resolution, beta mode, saved metadata and the call's resolved sequences."""

import dataclasses
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
from cake_core import Mode, Plan, Workspace
from cake_core import linear_attention as la
from cake_core.testing import assert_imports_without_triton, randn
from cake_core.triton_utils import default_device

DEV = default_device()
# what tensors report as their device (cuda:0 for a tensor made on cuda)
DEVT = torch.empty(0, device=DEV).device


@dataclasses.dataclass(frozen=True)
class HeadPlan(Plan):
    family: ClassVar[str] = "cake-toy-det-train"
    head_k_dim: int
    head_v_dim: int
    store_16bit: int = 1


class HeadWorkspace(Workspace):
    pass


def _inputs(B=1, T=10, H=2, HV=4, K=16, V=8, per_channel=False, dtype=torch.float32):
    g_shape = (B, T, HV, K) if per_channel else (B, T, HV)
    return (randn((B, T, H, K), dtype, DEV, seed=1), randn((B, T, H, K), dtype, DEV, seed=2),
            randn((B, T, HV, V), dtype, DEV, seed=3), randn(g_shape, torch.float32, DEV, seed=4),
            randn((B, T, HV), torch.float32, DEV, seed=5))


def test_import_does_not_import_triton():
    assert_imports_without_triton("cake_core.linear_attention")


@pytest.mark.parametrize("per_channel", [False, True])
def test_check_qkv_g_beta_accepts(per_channel):
    q, k, v, g, beta = _inputs(per_channel=per_channel)
    assert la.check_qkv_g_beta(q, k, v, g, beta, max_head_dim=256,
                               per_channel_decay=per_channel) == (1, 10, 2, 16, 4, 8)


@pytest.mark.parametrize("i, bad, msg", [
    (0, lambda t: t[0], "q: expected 4-D"),
    (0, lambda t: t.double(), r"q: expected dtype in \(float32, bfloat16, float16\)"),
    (0, lambda t: t[:, :, :0], "q: expected at least one head"),
    (0, lambda t: torch.zeros(1, 10, 2, 300), r"q: head dim K must be in \[1, 64\], got 300"),
    (1, lambda t: t.half(), "k: expected dtype"),
    (2, lambda t: t[:, :, :3], "v: value heads HV = 3 must be a positive multiple"),
    (2, lambda t: torch.zeros(1, 10, 4, 65), r"v: head dim V must be in \[1, 64\]"),
    (3, lambda t: t[..., None], r"g: expected shape \[1, 10, 4\]"),
    (4, lambda t: t.half(), "beta: expected dtype"),
    (4, lambda t: t.tolist(), "beta: expected a torch.Tensor"),
])
def test_check_qkv_g_beta_refuses(i, bad, msg):
    args = list(_inputs())
    args[i] = bad(args[i])
    with pytest.raises(ValueError, match=msg):
        la.check_qkv_g_beta(*args, max_head_dim=64, per_channel_decay=False)


def test_scale_options_gate_params():
    assert la.resolve_scale(None, 16) == 0.25 and la.resolve_scale(2, 16) == 2.0
    with pytest.raises(ValueError, match="scale"):
        la.resolve_scale(0.0, 16)
    la.check_options(True, False, False, True, True, safe_gate=False)
    with pytest.raises(ValueError, match="^use_gate_in_kernel: expected a bool"):
        la.check_options(True, False, 1, True, True)
    with pytest.raises(ValueError, match="^safe_gate: expected a bool"):
        la.check_options(True, False, False, False, False, safe_gate=None)
    with pytest.raises(ValueError, match="allow_neg_eigval=True requires"):
        la.check_options(True, False, False, False, True)
    la.check_gate_params(torch.bfloat16, (None, "A_log", [4]),
                         (torch.zeros(4, dtype=torch.bfloat16), "dt_bias", [4]))
    with pytest.raises(ValueError, match=r"dt_bias: expected shape \[8\]"):
        la.check_gate_params(torch.float32, (torch.zeros(4), "dt_bias", [8]))
    with pytest.raises(ValueError, match="A_log: expected dtype"):
        la.check_gate_params(torch.float32, (torch.zeros(4, dtype=torch.float16), "A_log", [4]))


def test_check_device_and_state():
    q, k, v, g, beta = _inputs()
    h0 = torch.zeros(3, 4, 16, 8, device=DEV)
    cu = torch.tensor([0, 2, 2, 10], dtype=torch.int32, device=DEV)
    assert la.check_device_and_state(q, k, v, g, beta, h0, cu, chunk_size=64)[:2] == (DEVT, 3)
    assert la.check_device_and_state(q, k, v, g, beta, None, None,
                                     chunk_size=64)[:2] == (DEVT, 1)
    with pytest.raises(ValueError, match=r"initial_state: expected shape \[1, 4, 16, 8\]"):
        la.check_device_and_state(q, k, v, g, beta, h0, None, chunk_size=64)
    with pytest.raises(ValueError, match="initial_state: expected dtype"):
        la.check_device_and_state(q, k, v, g, beta, h0.double(), cu, chunk_size=64)
    with pytest.raises(ValueError, match="cu_seqlens: must end at the token count 10"):
        la.check_device_and_state(q, k, v, g, beta, None, cu[:3], chunk_size=64)
    with pytest.raises(ValueError, match="dt_bias: on meta"):
        la.check_device_and_state(q, k, v, g, beta, None, None, None,
                                  torch.zeros(4, device="meta"), chunk_size=64)
    q2, k2, v2, g2, b2 = _inputs(B=2, T=5)
    with pytest.raises(ValueError, match="cu_seqlens: packed sequences need B == 1, got B = 2"):
        la.check_device_and_state(q2, k2, v2, g2, b2, None, cu[:2], chunk_size=64)


def test_check_device_and_state_resolves_once(monkeypatch):
    """The call's SeqChunks, resolved once per cu_seqlens version (read back and built
    once); [0, T, ..., BT] without cu_seqlens, kept per row shape."""
    import cake_core.varlen as varlen

    varlen.clear_offsets_cache()
    reads = []
    real = varlen.check_cu_seqlens
    monkeypatch.setattr(varlen, "check_cu_seqlens",
                        lambda *a, **kw: reads.append(kw.get("read_values", True)) or
                        real(*a, **kw))
    q, k, v, g, beta = _inputs()
    cu = torch.tensor([0, 2, 2, 10], dtype=torch.int32, device=DEV)
    dev, n, seqs = la.check_device_and_state(q, k, v, g, beta, None, cu, chunk_size=4)
    assert (dev, n) == (DEVT, 3) and seqs.offsets.dtype == torch.int64
    assert seqs.offsets.tolist() == [0, 2, 2, 10] and seqs.num_chunks == 3
    assert la.check_device_and_state(q, k, v, g, beta, None, cu, chunk_size=4)[2] is seqs
    assert reads.count(True) == 1
    cu[1] = 3  # in-place edits: read (and checked) again
    with pytest.raises(ValueError, match="cu_seqlens: must be non-decreasing"):
        la.check_device_and_state(q, k, v, g, beta, None, cu, chunk_size=4)
    cu[1] = 1
    again = la.check_device_and_state(q, k, v, g, beta, None, cu, chunk_size=4)[2]
    assert again.offsets.tolist() == [0, 1, 2, 10] and reads.count(True) == 3
    q2, k2, v2, g2, b2 = _inputs(B=2, T=5)
    rows = la.check_device_and_state(q2, k2, v2, g2, b2, None, None, chunk_size=4)[2]
    assert rows.offsets.tolist() == [0, 5, 10] and rows.num_chunks == 4
    assert la.check_device_and_state(q2, k2, v2, g2, b2, None, None, chunk_size=4)[2] is rows
    varlen.clear_offsets_cache()


def test_saved_chunks(monkeypatch):
    """A backward's sequences: the saved set's SeqChunks when made for the chunk size, else
    resolved from its saved device offsets (the forward's object when cached)."""
    import cake_core.varlen as varlen

    varlen.clear_offsets_cache()
    cu = torch.tensor([0, 0, 1, 70, 75], dtype=torch.int64, device=DEV)
    seqs = varlen.resolve_chunks(cu, 1, 75, DEVT, 64)
    q = torch.zeros(1, 75, 1, 4, device=DEV)
    saved = SimpleNamespace(meta={"seqs": seqs}, cu_seqlens=seqs.cu, q=q)
    assert la.saved_chunks(saved, 64, DEVT) is seqs
    other = la.saved_chunks(saved, 32, DEVT)  # made for another chunk size
    assert other is not seqs and other.num_chunks == 5 and other.chunk_size == 32
    saved.meta["seqs"] = None  # resolved from the saved device offsets: the forward's
    assert la.saved_chunks(saved, 64, DEVT) is seqs
    varlen.clear_offsets_cache()
    rebuilt = la.saved_chunks(saved, 64, DEVT)
    assert rebuilt is not seqs and rebuilt.offsets.tolist() == seqs.offsets.tolist()
    assert [t.tolist() for t in rebuilt.tables[:4]] == [t.tolist() for t in seqs.tables[:4]]
    varlen.clear_offsets_cache()


def test_check_grad_outputs():
    saved = SimpleNamespace(q=torch.zeros(1, 10, 2, 16, device=DEV),
                            v=torch.zeros(1, 10, 4, 8, device=DEV),
                            cu_seqlens=torch.tensor([0, 4, 10], device=DEV))
    assert la.check_grad_outputs(torch.zeros(1, 10, 4, 8, device=DEV),
                                 torch.zeros(2, 4, 16, 8, device=DEV), saved) == DEVT
    for do, dht, msg in ((torch.zeros(1, 10, 4, 4), None, "do: expected shape"),
                         (torch.zeros(1, 10, 4, 8).long(), None, "do: expected dtype"),
                         (torch.zeros(1, 10, 4, 8), torch.zeros(1, 4, 16, 8),
                          r"dht: expected shape \[2, 4, 16, 8\]"),
                         (torch.zeros(1, 10, 4, 8, device="meta"), None, "do: on meta")):
        with pytest.raises(ValueError, match=msg):
            la.check_grad_outputs(do, dht, saved)


def test_make_head_plan():
    calls, cache = [], {}

    def rule(K, V, dtype, device):
        calls.append((K, V))
        return HeadPlan(head_k_dim=K, head_v_dim=V)

    def problem(plan, dtype):
        return "too big" if plan.head_k_dim > 32 else None

    kw = dict(max_head_dim=64, rule=rule, cuda_plan_problem=problem, cache=cache)
    p = la.make_head_plan(16, 8, torch.float32, "cpu", **kw)
    assert (p.head_k_dim, p.head_v_dim) == (16, 8)
    assert la.make_head_plan(16, 8, torch.float32, torch.device("cpu"), **kw) is p
    assert calls == [(16, 8)]
    assert la.make_head_plan(48, 8, torch.float32, "cpu", **kw).head_k_dim == 48
    with pytest.raises(ValueError, match=r"make_plan\(K=48, V=8, torch.float32\): too big"):
        la.make_head_plan(48, 8, torch.float32, "cuda", **kw)
    for args, msg in (((16, 8, torch.float32, "bogus"), "^device: "),
                      ((0, 8, torch.float32, "cpu"), r"^head_k_dim: must be an int in \[1, 64\]"),
                      ((16, 65, torch.float32, "cpu"), "^head_v_dim: "),
                      ((16, True, torch.float32, "cpu"), "^head_v_dim: "),
                      ((16, 8, torch.float64, "cpu"), "^dtype: expected float32")):
        with pytest.raises(ValueError, match=msg):
            la.make_head_plan(*args, **kw)


def test_resolve_plan():
    made, cache = [], {}

    def make(K, V, dtype, device):
        made.append((K, V))
        return HeadPlan(head_k_dim=K, head_v_dim=V)

    def problem(plan, dtype):
        return "no fp32" if dtype == torch.float32 else None

    kw = dict(plan_type=HeadPlan, make_plan=make, cuda_plan_problem=problem, cache=cache)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    p = la.resolve_plan(None, 16, 8, torch.float32, cpu, **kw)
    assert la.resolve_plan(None, 16, 8, torch.float32, cpu, **kw) is p and made == [(16, 8)]
    mine = HeadPlan(head_k_dim=16, head_v_dim=8, store_16bit=0)
    assert la.resolve_plan(mine, 16, 8, torch.float32, cpu, **kw) is mine
    assert la.resolve_plan(mine, 16, 8, torch.bfloat16, cuda, **kw) is mine
    with pytest.raises(ValueError, match="plan: no fp32"):
        la.resolve_plan(mine, 16, 8, torch.float32, cuda, **kw)
    with pytest.raises(ValueError, match="plan: made for K=16, V=8; inputs have K=32, V=8"):
        la.resolve_plan(mine, 32, 8, torch.float32, cpu, **kw)
    with pytest.raises(ValueError, match="plan: got dict"):
        la.resolve_plan(mine.to_dict(), 16, 8, torch.float32, cpu, **kw)
    nondet = HeadPlan(head_k_dim=16, head_v_dim=8, mode=Mode.NONDET)
    with pytest.raises(ValueError, match="mode=nondet"):
        la.resolve_plan(nondet, 16, 8, torch.float32, cpu, **kw)


@dataclasses.dataclass(frozen=True)
class KeepPlan(Plan):
    family: ClassVar[str] = "cake-toy-det-train"
    head_k_dim: int
    keep_states: int = 0


def test_disable_recompute_plan():
    """FLA's disable_recompute=True: the rule's plan (none given) with keep_states = 1,
    made once per plan in the entry's cache; a plan given that keeps the states as it is;
    one that does not: ValueError saying what to pass."""
    cache = {}
    rule = KeepPlan(head_k_dim=16)
    kept = la.disable_recompute_plan(rule, None, cache)
    assert kept == dataclasses.replace(rule, keep_states=1) and rule.keep_states == 0
    assert la.disable_recompute_plan(rule, None, cache) is kept and len(cache) == 1
    other = la.disable_recompute_plan(KeepPlan(head_k_dim=32), None, cache)
    assert other.head_k_dim == 32 and other.keep_states == 1 and len(cache) == 2
    mine = KeepPlan(head_k_dim=16, keep_states=1)
    assert la.disable_recompute_plan(mine, mine, cache) is mine
    with pytest.raises(ValueError, match=r"disable_recompute=True: the plan given has "
                       r"keep_states=0 .*pass a plan with keep_states=1 "
                       r"\(dataclasses.replace\(plan, keep_states=1\)\) or drop "
                       r"disable_recompute"):
        la.disable_recompute_plan(rule, rule, cache)
    assert len(cache) == 2


def test_inter_dtype_and_beta_code():
    p16, p32 = HeadPlan(head_k_dim=16, head_v_dim=8), HeadPlan(head_k_dim=16, head_v_dim=8,
                                                              store_16bit=0)
    assert la.inter_dtype(p16, torch.bfloat16) == torch.bfloat16
    assert la.inter_dtype(p16, torch.float32) == torch.float32
    assert la.inter_dtype(p32, torch.float16) == torch.float32
    assert [la.beta_code(s, n) for s, n in ((False, False), (True, False), (True, True),
                                            (False, True))] == [0, 1, 2, 0]


def test_resolve_workspace():
    plan = HeadPlan(head_k_dim=16, head_v_dim=8)
    shapes = {"w": (4, 16), "h": (4, 16, 8)}

    def ws(tokens=10, chunks=2, dtype=torch.float32, plan=plan, w_shape=(4, 16)):
        return HeadWorkspace(plan, "cpu", {"w": torch.zeros(tokens, *w_shape, dtype=dtype),
                                           "h": torch.zeros(chunks, 4, 16, 8, dtype=dtype)})

    def resolve(w, tokens=10, chunks=2):
        return la.resolve_workspace(w, plan, torch.device("cpu"), workspace_type=HeadWorkspace,
                                    buffer_shapes=shapes, buffer_dtype=torch.float32,
                                    tokens=tokens, chunks=chunks)

    assert resolve(None) is None
    w = ws()
    assert resolve(w) is w
    with pytest.raises(ValueError, match="workspace: holds 10 tokens and 2 chunks, the call "
                                         "needs 11 and 2"):
        resolve(w, tokens=11)
    with pytest.raises(ValueError, match="needs 10 and 3"):
        resolve(w, chunks=3)
    with pytest.raises(ValueError, match=r"workspace: buffer 'w' must be a contiguous "
                                         r"torch.float32 tensor of shape \[\*, 4, 16\]; build "
                                         r"it with HeadWorkspace.for_plan\(plan, device"):
        resolve(ws(w_shape=(2, 16)))
    with pytest.raises(ValueError, match="buffer 'w'"):
        resolve(ws(dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="was made for plan"):
        resolve(ws(plan=HeadPlan(head_k_dim=16, head_v_dim=16)))
    with pytest.raises(ValueError, match="workspace: got Tensor"):
        resolve(torch.zeros(3))


def test_saved_meta():
    plan = HeadPlan(head_k_dim=16, head_v_dim=8)
    seqs = object()
    m = la.saved_meta(scale=0.5, use_qk_l2norm=True, plan=plan, varlen=False,
                      use_gate_in_kernel=True, beta=2, seqs=seqs, lower_bound=-1.0)
    assert m == {"scale": 0.5, "use_qk_l2norm": True, "plan": plan, "varlen": False,
                 "use_gate_in_kernel": True, "use_beta_sigmoid_in_kernel": True,
                 "allow_neg_eigval": True, "seqs": seqs, "lower_bound": -1.0}
    m0 = la.saved_meta(scale=1.0, use_qk_l2norm=False, plan=plan, varlen=True,
                       use_gate_in_kernel=False, beta=0, seqs=None)
    assert not m0["use_beta_sigmoid_in_kernel"] and not m0["allow_neg_eigval"]


def test_check_fla_compat_values():
    """FLA's extra keywords: hints at any value; flags off by truthiness (None, 0, False,
    numpy False); disable_recompute any value with a truth value; chunk_size an int-valued
    64; anything else a ValueError saying why; a keyword outside ``accepted`` a TypeError; a
    bool where cu_seqlens goes refused."""
    import numpy as np
    from cake_core.linear_attention import check_cu_seqlens_position, check_fla_compat

    for kw in (dict(cu_seqlens_cpu=object(), chunk_indices=None, use_graph=True),
               dict(chunk_size=64), dict(chunk_size=64.0), dict(chunk_size=torch.tensor(64)),
               dict(state_v_first=None), dict(state_v_first=0), dict(head_first=np.False_),
               dict(transpose_state_layout=False), dict(cp_context=None),
               dict(return_intermediate_states=False), dict(disable_recompute=True),
               dict(disable_recompute=None), dict(disable_recompute=np.True_),
               dict(disable_recompute="yes"), dict(disable_recompute=torch.tensor(0))):
        check_fla_compat(kw, "f")
    for kw, match in ((dict(chunk_size=True), "chunk_size=True"),
                      (dict(chunk_size=np.array([64, 64])), "chunk_size="),
                      (dict(chunk_size=32), "fixed at 64"), (dict(chunk_size=64.5), "64.5"),
                      (dict(state_v_first=1), "state_v_first=1"),
                      (dict(head_first=True), "refuses head_first"),
                      (dict(cp_context=0), "kcp"),
                      (dict(return_intermediate_states=True), "final_state"),
                      (dict(disable_recompute=np.array([1, 0])),
                       r"disable_recompute=.*expected a flag \(FLA tests it by truthiness\)"),
                      (dict(disable_recompute=torch.ones(2)), "expected a flag")):
        with pytest.raises(ValueError, match=match):
            check_fla_compat(kw, "f")
    with pytest.raises(TypeError, match="f\\(\\) got an unexpected keyword argument 'use_graph'"):
        check_fla_compat(dict(use_graph=True), "f", ("cu_seqlens_cpu",))
    check_cu_seqlens_position(None)
    with pytest.raises(ValueError, match="10th positional argument is cu_seqlens"):
        check_cu_seqlens_position(True)
