"""The CUDA rule's speed paths (docs/benchmarks/gdn.md): ``plan.rec_form = 1``
(FLA's operand form of the two chunk-recurrence kernels: block pointers, the transposed
k / q / w tiles loaded straight into the dots, the decays on the ``[64, block_v]`` tiles),
``plan.local_form = 2`` (the backward chunk-local gradients with K-block programs, K in
blocks of ``block_k_local``) and ``plan.block_v_h``: o, final_state and every gradient
against the float64 token recurrence (packed 1/70/0/65-token documents: an empty and a
length-1 document, lengths off the chunk size; HV = 2H, an initial state and a
final-state gradient; K and V off the block sizes: partly masked column blocks, V in two
blocks); bitwise repeatable; close to the CPU rule's plan; the fields are part of the
plan's serialised form and checked."""

import dataclasses
import json

import pytest
import torch
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_close_to_reference,
    bitwise_equal,
    poisoned_empty,
    randn,
    record_launches,
)
from cake_core.triton_utils import default_device
from cake_gdn_det_train import (
    GDNDetGrads,
    GDNDetPlan,
    chunk_gated_delta_rule_det,
    chunk_gdn_det_bwd,
    chunk_gdn_det_fwd,
    gdn_reference,
    make_plan,
)
from cake_gdn_det_train.plan import cuda_plan_problem

DEV = default_device()
BF16 = torch.bfloat16
LENS = [1, 70, 0, 65]
NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                        device=DEV)


def _grads(fn, inputs, h0, do, dht, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    s = h0.detach().clone().requires_grad_()
    o, ht = fn(*leaves, initial_state=s, output_final_state=True, **kw)
    torch.autograd.backward([o, ht], [do.to(o.dtype), dht.to(ht.dtype)])
    return [o, ht] + [t.grad for t in leaves] + [s.grad]


def _assert_vs_float64(got, inputs, h0, do, dht, dtype, **kw):
    """Assert ``got`` (o, final_state and the six gradients from :func:`_grads`) within
    ``dtype``'s tolerance of the float64 reference on the same inputs and options."""
    want = _grads(lambda *a, **k: gdn_reference(*a, **k, dtype=torch.float64),
                  [t.double() for t in inputs], h0.double(), do.double(), dht.double(), **kw)
    for name, a, b in zip(("o", "final_state") + tuple("d" + n for n in NAMES), got, want,
                          strict=True):
        assert_close_to_reference(a, b, dtype, name)


@pytest.mark.parametrize("K, V, dtype, over", [
    (48, 40, torch.float32, dict(block_v=32, rec_form=1)),
    (32, 64, torch.bfloat16, dict(block_v=32, num_stages_h=2, rec_form=1)),
    # local_form = 2: K-block programs; three K blocks, the last partly masked; one K block
    # (8 warps at block_k_local 16 are refused on CUDA: an illegal access on an H200;
    # 16-column V blocks of fp32 intermediates are refused on CUDA: cuda_plan_problem)
    (56, 40, torch.float32, dict(local_form=2, block_k_local=16, num_warps_local=4,
                                 block_v_local=16 if DEV.type == "cpu" else 32)),
    (64, 48, torch.bfloat16, dict(local_form=2, block_k_local=32, block_v_local=32)),
    (40, 40, torch.float32, dict(local_form=2, block_k_local=16, num_warps_local=4,
                                 block_v_local=16 if DEV.type == "cpu" else 32)),
    (128, 48, torch.bfloat16, dict(local_form=2, block_k_local=64, block_v_local=32)),
    (64, 64, torch.bfloat16, dict(local_form=2, block_k_local=64)),
    # the CUDA rule's one 128-column K block (8 warps) at K = V = 128
    (128, 128, torch.bfloat16, dict(local_form=2, block_k_local=128, num_warps_local=8,
                                    block_v_local=64)),
    # block_v_h: the state kernels' V blocks apart from the output kernel's
    (48, 40, torch.float32, dict(block_v_h=32)),  # two V blocks, the second partly masked
    (128, 64, torch.bfloat16, dict(block_v_h=32, rec_form=1, num_warps_h=4)),
    (64, 48, torch.bfloat16, dict(block_v=32, block_v_h=64)),
], ids=["fp32-K48-V40-bv32-form1", "bf16-K32-V64-bv32-16bit-form1",
        "fp32-K56-V40-kblock-bk16-bv16",
        "bf16-K64-V48-kblock-bk32-16bit", "fp32-K40-V40-kblock-bk16",
        "bf16-K128-V48-kblock-bk64", "bf16-K64-V64-kblock-one-block",
        "bf16-K128-V128-kblock-one-block-8-warps",
        "fp32-K48-V40-bvh32", "bf16-K128-V64-bvh32-form1", "bf16-K64-V48-bv32-bvh64"])
def test_speed_paths_vs_reference(K, V, dtype, over, gdn_inputs):
    plan = dataclasses.replace(make_plan(K, V, dtype, DEV), **over)
    if dtype == torch.bfloat16:
        assert plan.store_16bit == 1
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(LENS), 1, 2, K, V, dtype, seed=71,
                                      n_states=len(LENS), h0=True)
    cu = _cu(LENS)
    do = randn(v.shape, dtype, DEV, seed=72)
    dht = randn(h0.shape, torch.float32, DEV, seed=73)
    got = _grads(chunk_gated_delta_rule_det, (q, k, v, g, beta), h0, do, dht,
                 cu_seqlens=cu, plan=plan)
    want = _grads(lambda *a, **kw: gdn_reference(*a, **kw, dtype=torch.float64),
                  [t.double() for t in (q, k, v, g, beta)], h0.double(), do.double(),
                  dht.double(), cu_seqlens=cu)
    for name, a, b in zip(("o", "final_state") + tuple("d" + n for n in NAMES), got, want,
                          strict=True):
        assert_close_to_reference(a, b, dtype, name)


def _packed_case(gdn_inputs, K, V, seed):
    """fp32 inputs (seed), packed ``LENS`` with HV = 2H, strong decays, an initial state;
    do and dht (seeds + 1, + 2): ``(inputs, h0, cu, do, dht)``."""
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(LENS), 1, 2, K, V, seed=seed, g_mode="strong",
                                      n_states=len(LENS), h0=True)
    do = randn(v.shape, torch.float32, DEV, seed=seed + 1)
    dht = randn(h0.shape, torch.float32, DEV, seed=seed + 2)
    return (q, k, v, g, beta), h0, _cu(LENS), do, dht


def _fwd_bwd(inputs, h0, cu, do, dht, plan):
    o, ht, saved = chunk_gdn_det_fwd(*inputs, initial_state=h0, output_final_state=True,
                                     cu_seqlens=cu, plan=plan)
    return (o, ht, *chunk_gdn_det_bwd(do, dht, saved))


@pytest.mark.parametrize("over, K", [(dict(rec_form=1), 16),
                                     (dict(local_form=2, block_k_local=16), 40),
                                     (dict(block_v_h=16), 16)],
                         ids=["rec_form", "local_form2-K40-bk16", "block_v_h"])
def test_speed_paths_repeat_and_are_close_to_default(over, K, gdn_inputs):
    """fp32, packed 1/70/0/65, HV = 2H: twice the same bits; the default plan's values to
    fp32 rounding (the same math, other rounding; local_form: K in 3 blocks, one partly
    masked)."""
    V = 32
    (q, k, v, g, beta), h0, cu, do, dht = _packed_case(gdn_inputs, K, V, seed=74)
    # block_v = 16 (two V blocks) where store_16bit allows it (block_k 16)
    base = dataclasses.replace(make_plan(K, V, torch.float32, DEV), block_v=16 if K <= 16 else 32,
                               rec_form=0)
    new = dataclasses.replace(base, **over)
    got = assert_bitwise_repeat(lambda: _fwd_bwd((q, k, v, g, beta), h0, cu, do, dht, new),
                                repeats=2)
    want = _fwd_bwd((q, k, v, g, beta), h0, cu, do, dht, base)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a is None) == (b is None), i
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"output {i}")


def test_fields_serialised_and_checked(monkeypatch):
    import cake_core.linear_attention as la
    from cake_core.triton_utils import CPU_SHARED_MEMORY

    # Hopper's rule on any GPU (under A100's shared memory the state kernels take 2 stages:
    # test_cuda_rule_fits_the_devices_shared_memory)
    monkeypatch.setattr(la, "rule_shared_memory", lambda device: CPU_SHARED_MEMORY)
    # the rule: rec_form = 1 (3 stages) only on CUDA at 16-bit K = 128
    cpu = make_plan(128, 128, torch.bfloat16, "cpu")
    assert cpu.rec_form == 0
    gpu = make_plan(128, 128, torch.bfloat16, "cuda")
    assert (gpu.rec_form, gpu.num_stages_h, gpu.local_form) == (1, 3, 2)
    # local_form 2's K-block kernel: one 128-column block of 8 warps at K = V = 128
    assert (gpu.block_k_local, gpu.num_warps_local) == (128, 8)
    assert cpu.local_form == 0
    for K, V, dt in ((64, 64, torch.bfloat16), (64, 64, torch.float32), (32, 16, torch.bfloat16)):
        p = make_plan(K, V, dt, "cuda")
        assert p.rec_form == 0 and p.local_form == 0, (K, V, dt)
    plan = dataclasses.replace(make_plan(128, 128, torch.bfloat16, DEV), rec_form=0)
    on = dataclasses.replace(plan, rec_form=1)
    d = on.to_dict()
    assert d["rec_form"] == 1 and d["version"] == 1
    assert GDNDetPlan.from_dict(d) == on and on.key != plan.key
    for version in (0, 2):  # no other format exists: refused, with no upgrade to offer
        with pytest.raises(ValueError, match=f"format version {version} is not 1$"):
            GDNDetPlan.from_dict({**d, "version": version})
    for bad in (2, 3, -1, True):
        with pytest.raises(ValueError, match="rec_form"):
            dataclasses.replace(plan, rec_form=bad)
    for K, V in ((16, 16), (48, 40), (64, 64), (100, 48), (128, 128), (200, 24), (256, 256)):
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            for dev in ("cpu", "cuda"):
                try:
                    p = make_plan(K, V, dt, dev)
                except ValueError:  # refused on CUDA (K > 128, fp32 K > 64)
                    assert dev == "cuda", (K, V, dt)
                    continue
                assert p.rec_form in (0, 1), (K, V, dt, dev)
    # local_form: the rule takes 2 where it takes rec_form = 1 (CUDA, 16-bit K = 128), else 0;
    # block_k_local = block_k at CUDA's 16-bit K = V = 128 (with 8 warps), else
    # min(64, block_k) (4 warps with local_form 2)
    for K, V, dt in ((128, 128, torch.bfloat16), (64, 64, torch.float32), (16, 16, torch.float32),
                     (100, 48, torch.bfloat16), (128, 64, torch.float16)):
        for dev in ("cpu", "cuda"):
            p = make_plan(K, V, dt, dev)
            one = dev == "cuda" and (K, V, dt) == (128, 128, torch.bfloat16)
            assert p.local_form == 2 * p.rec_form, (K, V, dt, dev)
            assert p.block_k_local == (128 if one else min(64, p.block_k)), (K, V, dt, dev)
            if p.local_form == 2:
                assert p.num_warps_local == (8 if one else 4), (K, V, dt, dev)
            bvf = 1 << (max(V, 16) - 1).bit_length()  # V rounded up to a power of two
            want_bvl = (64 if p.rec_form else min(32, bvf)) if dev == "cuda" else bvf
            assert p.block_v_local == want_bvl, (K, V, dt, dev)
    loc = dataclasses.replace(plan, local_form=2, block_k_local=32, block_v_local=32)
    d = loc.to_dict()
    assert (d["local_form"], d["block_k_local"]) == (2, 32)
    assert GDNDetPlan.from_dict(d) == loc and loc.key != plan.key
    assert cuda_plan_problem(loc, torch.bfloat16) is None
    # K blocks of 32 with 64-wide V blocks: wrong dk / dg / dbeta on an H200 (Triton 3.6)
    for dt in (torch.bfloat16, torch.float16):
        wide_v = dataclasses.replace(loc, block_v_local=64)
        assert "needs block_k_local >= min(64, block_k)" in cuda_plan_problem(wide_v, dt)
        assert cuda_plan_problem(dataclasses.replace(wide_v, block_k_local=64), dt) is None
    assert "block_k_local >= 32" in cuda_plan_problem(
        dataclasses.replace(loc, block_k_local=16), torch.bfloat16)
    fp32 = make_plan(56, 40, torch.float32, "cuda")
    assert fp32.block_v_local == 32 and cuda_plan_problem(fp32, torch.float32) is None
    for lf in (0, 2):  # illegal memory accesses / wrong dk on an H200 (Triton 3.6)
        bad = dataclasses.replace(fp32, local_form=lf, block_k_local=16, block_v_local=16)
        assert "block_v_local >= 32" in cuda_plan_problem(bad, torch.float32)
    assert cuda_plan_problem(dataclasses.replace(loc, block_k_local=16), torch.float32) is not \
        None  # K = 128 fp32 is refused on CUDA anyway
    # local_form = 2 at 8 warps with 16-column K blocks: an illegal access on an H200
    k40 = make_plan(40, 40, torch.float32, "cuda")
    assert k40.num_warps_local == 8
    kb16 = dataclasses.replace(k40, local_form=2, block_k_local=16, block_v_local=32)
    assert "block_k_local >= 32" in cuda_plan_problem(kb16, torch.float32)
    for ok in (dataclasses.replace(kb16, num_warps_local=4),
               dataclasses.replace(kb16, block_k_local=32)):
        assert cuda_plan_problem(ok, torch.float32) is None, ok
    for bad in (1, 3, -1, True):
        with pytest.raises(ValueError, match="local_form"):
            dataclasses.replace(plan, local_form=bad)
    for bad in (8, 24, 256, 0):
        with pytest.raises(ValueError, match="block_k_local"):
            dataclasses.replace(plan, block_k_local=bad)


def test_block_v_h_field_format_and_checks():
    """block_v_h: the rule takes block_v except on CUDA at K = V = 128 with 16-bit inputs
    (block_v = 128 there, block_v_h = 64); serialised; the field is checked like block_v."""
    for dev in ("cpu", "cuda"):
        for K, V, dt in ((16, 16, torch.float32), (128, 128, torch.bfloat16), (64, 40, BF16),
                         (128, 128, torch.float16), (128, 100, BF16), (100, 128, BF16)):
            p = make_plan(K, V, dt, dev)
            wide = dev == "cuda" and (K, V) == (128, 128)
            assert (p.block_v, p.block_v_h) == ((128, 64) if wide else (p.block_v,) * 2), \
                (dev, K, V, dt)
    plan = make_plan(128, 128, torch.bfloat16, DEV)
    new = dataclasses.replace(plan, block_v_h=32)
    d = new.to_dict()
    assert d["block_v_h"] == 32 and d["version"] == 1
    assert GDNDetPlan.from_dict(json.loads(new.to_json())) == new and new.key != plan.key
    with pytest.raises(ValueError, match="missing .*block_v_h"):
        GDNDetPlan.from_dict({n: x for n, x in d.items() if n != "block_v_h"})
    for bad, match in ((24, "power of two"), (256, "block_v_h must be <="), (16, "store_16bit")):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(plan, block_v_h=bad)


def _grids(launches: dict, name: str) -> list:
    """The grids of ``name``'s launches in a ``cake_core.testing.record_launches`` record."""
    return [grid for grid, _ in launches.get(name, [])]


def test_block_v_h_sets_the_state_kernels_grid(gdn_inputs):
    """The state kernels launch ceil(V / block_v_h) column blocks, the output kernel
    ceil(V / block_v) (a field the launches ignored would pass the value tests)."""
    from cake_core import chunk_output, chunk_state

    plan = dataclasses.replace(make_plan(32, 64, torch.float32, DEV), block_v=64, block_v_h=32,
                               rec_form=0)
    q, k, v, g, beta, h0 = gdn_inputs(1, 70, 1, 2, 32, 64, seed=81, h0=True)
    states = ("chunk_state_fwd_kernel", "chunk_state_bwd_kernel")
    with record_launches(chunk_output, "chunk_output_kernel") as launches, \
            record_launches(chunk_state, *states) as state_launches:
        o, _ = chunk_gated_delta_rule_det(q.requires_grad_(), k, v, g, beta, plan=plan)
        o.sum().backward()
    fwd_h, fwd_o = _grids(state_launches, states[0]), _grids(launches, "chunk_output_kernel")
    assert fwd_h and all(gr[2] == 2 for gr in fwd_h)
    assert _grids(state_launches, states[1]) == [(1, 2, 2)]
    # rec_form = 0: the scalar decay on the [64, K] tiles
    assert all(not kw["GK"] and not kw["V_DECAY"] and not kw["FLAT"]
               for name in states for _, kw in state_launches[name])
    assert fwd_o and all(gr[2] == 1 for gr in fwd_o)


def test_rec_form_1_state_grid_is_one_axis(gdn_inputs):
    """rec_form = 1 launches its state kernels on one axis of N * HV * ceil(V / block_v_h)
    programs, V blocks fastest (cake_core.chunk_state's ``FLAT``, with the decays on the
    ``[64, block_v_h]`` tiles), with every (sequence, value head, V block) once: right
    against float64 with three ragged sequences and two V blocks."""
    from cake_core import chunk_state

    plan = dataclasses.replace(make_plan(32, 64, torch.float32, DEV), block_v=64, block_v_h=32,
                               rec_form=1)
    lens = [70, 1, 65]
    cu = torch.tensor([0, 70, 71, 136], dtype=torch.int32, device=DEV)
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(lens), 1, 2, 32, 64, seed=83, h0=True,
                                      n_states=len(lens))
    do = randn(v.shape, torch.float32, DEV, seed=84)
    dht = randn(h0.shape, torch.float32, DEV, seed=85)
    states = ("chunk_state_fwd_kernel", "chunk_state_bwd_kernel")
    with record_launches(chunk_state, *states) as launches:
        got = _grads(chunk_gated_delta_rule_det, (q, k, v, g, beta), h0, do, dht,
                     cu_seqlens=cu, plan=plan)
    # the forward state kernel twice: the forward and the backward's recompute
    assert _grids(launches, states[0]) == [(3 * 2 * 2,)] * 2
    assert _grids(launches, states[1]) == [(3 * 2 * 2,)]
    assert all(not kw["GK"] and kw["V_DECAY"] and kw["FLAT"]
               for name in states for _, kw in launches[name])
    want = _grads(lambda *a, **kw: gdn_reference(*a, **kw, dtype=torch.float64),
                  [t.double() for t in (q, k, v, g, beta)], h0.double(), do.double(),
                  dht.double(), cu_seqlens=cu)
    for name, a, b in zip(("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"), got,
                          want, strict=True):
        assert_close_to_reference(a, b, torch.float32, name)


def test_state_programs_rule():
    """make_plan's state_programs rule (an H200, 2026-12-01 / 12-03): block_v_h = 32 and
    num_warps_h = 4 where the
    state kernels would fill at most half the SMs at block_v = 64, 16-bit intermediates and
    K = 128 only (timed there; K = 100 faulted); nowhere else, never on the CPU; the argument is
    checked."""
    from cake_gdn_det_train.plan import _rule, narrow_states_pay

    cuda = torch.device("cuda")
    p128 = _rule(128, 128, BF16, cuda)
    assert narrow_states_pay(p128, BF16, 32, 132)        # case a: 32 x 2 = 64 programs
    assert not narrow_states_pay(p128, BF16, 64, 132)    # case d: 128 programs
    assert not narrow_states_pay(p128, BF16, 0, 132)     # no sequences
    assert narrow_states_pay(_rule(128, 100, BF16, cuda), torch.float16, 33, 132)
    assert not narrow_states_pay(_rule(64, 64, BF16, cuda), BF16, 2, 132)   # K != 128
    assert not narrow_states_pay(_rule(100, 48, BF16, cuda), BF16, 2, 132)   # K != block_k
    assert not narrow_states_pay(_rule(128, 32, BF16, cuda), BF16, 2, 132)   # block_v 32
    assert not narrow_states_pay(_rule(64, 64, torch.float32, cuda), torch.float32, 2, 132)
    for dev in ("cpu",) + (("cuda",) if torch.cuda.is_available() else ()):
        plain = make_plan(128, 128, BF16, dev)
        narrow = make_plan(128, 128, BF16, dev, state_programs=1)
        assert (narrow.block_v_h, narrow.num_warps_h) == \
            ((32, 4) if dev == "cuda" else (plain.block_v_h, plain.num_warps_h))
        assert dataclasses.replace(narrow, block_v_h=plain.block_v_h,
                                   num_warps_h=plain.num_warps_h) == plain
        assert make_plan(128, 128, BF16, dev, state_programs=10 ** 6) == plain
    for bad in (-1, 1.5, True, "4"):
        with pytest.raises(ValueError, match="state_programs"):
            make_plan(128, 128, BF16, "cpu", state_programs=bad)
    if not torch.cuda.is_available():  # the SM count cannot be read: a ValueError, not a crash
        with pytest.raises(ValueError, match="state_programs: .*no CUDA"):
            make_plan(128, 128, BF16, "cuda", state_programs=1)
        assert make_plan(128, 128, BF16, "cuda").block_v_h == 64


def test_block_v_h_fault_fenced_on_cuda():
    """The K = 100 / block_v_h = 32 fault of an H200 run (2026-12-01) is refused on CUDA
    with 16-bit intermediates; K = block_k and fp32 intermediates stay allowed."""
    cuda = torch.device("cuda")
    bad = dataclasses.replace(make_plan(100, 48, BF16, "cpu"), block_v=64, block_v_h=32)
    assert "block_v_h" in (cuda_plan_problem(bad, BF16) or "")
    assert "block_v_h" in (cuda_plan_problem(bad, torch.float16) or "")
    from cake_gdn_det_train.plan import _rule

    for K, V, dt in ((128, 48, BF16), (128, 128, BF16)):
        ok = dataclasses.replace(_rule(K, V, dt, cuda), block_v_h=32)
        assert cuda_plan_problem(ok, dt) is None, (K, V)
    f32 = dataclasses.replace(_rule(48, 40, torch.float32, cuda), block_v_h=32)
    assert cuda_plan_problem(f32, torch.float32) is None


def test_workspace_serves_plans_differing_in_narrowed_fields(gdn_inputs):
    """A workspace made for one plan serves a call whose plan differs in block_v_h /
    num_warps_h only (the buffers are the same; the state_programs rule may narrow the
    default plan), with the same bits as without a workspace; a plan that differs elsewhere
    is still refused."""
    from cake_gdn_det_train import GDNDetWorkspace, chunk_gdn_det_fwd

    base = make_plan(32, 64, torch.float32, DEV)
    other = dataclasses.replace(base, block_v_h=32, num_warps_h=2)
    q, k, v, g, beta, h0 = gdn_inputs(1, 70, 1, 2, 32, 64, seed=83, h0=True)

    def run(plan, ws=None):
        return chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                 plan=plan, workspace=ws)[:2]

    # (the bits of two block_v_h may differ under the interpreter, whose dots are numpy
    # products of the tile widths; on an H200 they were equal: docs/benchmarks/gdn.md)
    for ws_plan, call_plan in ((base, other), (other, base), (other, None)):
        ws = GDNDetWorkspace.for_plan(ws_plan, DEV, num_v_heads=2, max_tokens=70)
        for a, b in zip(run(call_plan, ws), run(call_plan), strict=True):
            assert torch.equal(a, b)
    ws = GDNDetWorkspace.for_plan(dataclasses.replace(base, num_warps_local=2), DEV,
                                  num_v_heads=2, max_tokens=70)
    with pytest.raises(ValueError, match="workspace"):
        chunk_gdn_det_fwd(q, k, v, g, beta, plan=base, workspace=ws)
    # a workspace of other head dims: the workspace message (not a plan-field error)
    ws = GDNDetWorkspace.for_plan(make_plan(32, 16, torch.float32, DEV), DEV, num_v_heads=2,
                                  max_tokens=70)
    with pytest.raises(ValueError, match="workspace"):
        chunk_gdn_det_fwd(q, k, v, g, beta, plan=base, workspace=ws)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("H, HV, l2", [(2, 2, False), (2, 2, True), (1, 2, False),
                                       (1, 3, True), (2, 4, False)],
                         ids=["hv1-plain", "hv1-l2norm", "hv2-plain", "hv3-l2norm",
                              "two-heads-hv2"])
def test_local_dk_kernel_sums_value_heads(dtype, H, HV, l2, gdn_inputs, monkeypatch):
    """``local_form = 2``: the dk kernel adds each q/k head's value heads' dk and dq in
    index order and stores them in the gradients' dtype (fp32 before the L2 norm's
    backward; bf16 stays fp32 under the interpreter and torch casts), and with one value
    head per q/k head the first kernel stores dq as it is: no ``group_sum_cast`` pass;
    float64 parity."""
    from cake_gdn_det_train import api

    K, V = 64, 48
    plan = dataclasses.replace(make_plan(K, V, dtype, DEV), local_form=2, block_k_local=32,
                               block_v_local=32)
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(LENS), H, HV, K, V, dtype, seed=77,
                                      n_states=len(LENS), h0=True, normalize_k=not l2)
    cu = _cu(LENS)
    do = randn(v.shape, dtype, DEV, seed=78)
    dht = randn(h0.shape, torch.float32, DEV, seed=79)
    kw = dict(cu_seqlens=cu, plan=plan, use_qk_l2norm_in_kernel=l2)
    sums = []
    real_sum = api.group_sum_cast
    monkeypatch.setattr(api, "group_sum_cast", lambda *a, **k: sums.append(1) or real_sum(*a, **k))
    got = _grads(chunk_gated_delta_rule_det, (q, k, v, g, beta), h0, do, dht, **kw)
    assert not sums
    assert got[2].dtype == got[3].dtype == dtype
    _assert_vs_float64(got, (q, k, v, g, beta), h0, do, dht, dtype, cu_seqlens=cu,
                       use_qk_l2norm_in_kernel=l2)


def test_local_form_2_launches_k_block_programs(gdn_inputs):
    """``local_form = 2`` launches the K-block kernel on (chunks, HV, ceil(K /
    block_k_local)) with ``num_warps_local`` warps and its WY kernel on (chunks, HV) with
    4 warps; right against float64 at two warp counts
    (four packed sequences, one empty: 5 chunks; K in three blocks, the last partly
    masked)."""
    from cake_gdn_det_train import api

    K, V, lens = 40, 32, [1, 70, 0, 65]
    rule = dataclasses.replace(make_plan(K, V, torch.float32, DEV), local_form=2,
                               block_k_local=16)
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(lens), 1, 2, K, V, seed=94, h0=True,
                                      n_states=len(lens))
    cu = _cu(lens)
    do = randn(v.shape, torch.float32, DEV, seed=95)
    dht = randn(h0.shape, torch.float32, DEV, seed=96)
    want = _grads(lambda *a, **kw: gdn_reference(*a, **kw, dtype=torch.float64),
                  [t.double() for t in (q, k, v, g, beta)], h0.double(), do.double(),
                  dht.double(), cu_seqlens=cu)
    names = ("gdn_bwd_local_kblock_kernel", "gdn_bwd_local_wy_kb_kernel")
    for plan in (rule, dataclasses.replace(rule, num_warps_local=2)):
        with record_launches(api, *names) as launches:
            got = _grads(chunk_gated_delta_rule_det, (q, k, v, g, beta), h0, do, dht,
                         cu_seqlens=cu, plan=plan)
        assert _grids(launches, names[0]) == [(5, 2, 3)]
        assert _grids(launches, names[1]) == [(5, 2)]
        assert [kw["num_warps"] for _, kw in launches[names[0]]] == [plan.num_warps_local]
        assert [kw["num_warps"] for _, kw in launches[names[1]]] == [4]
        for name, a, b in zip(("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"),
                              got, want, strict=True):
            assert_close_to_reference(a, b, torch.float32, name)


@pytest.mark.parametrize("over, K", [(dict(), 40), (dict(local_form=2, block_k_local=16), 40)],
                         ids=["local_form0", "local_form2-K40-bk16"])
def test_per_call_buffers_poisoned_same_bits(over, K, gdn_inputs):
    """Every tensor the package allocates with ``torch.empty`` in a call (outputs, the
    backward's dh / dv_new / per-value-head dq, dk, ``local_form = 2``'s z rows, partial
    dT and row sums, which GDNDetWorkspace does not own) filled with NaN (integers: their
    max) before the kernels see it: the same bits as a plain call, packed 1/70/0/65, HV =
    2H, fp32 (no element read before it is written, so no earlier contents reach a result;
    the test fails if one is: a NaN or a changed bit)."""
    V = 32
    (q, k, v, g, beta), h0, cu, do, dht = _packed_case(gdn_inputs, K, V, seed=78)
    plan = dataclasses.replace(make_plan(K, V, torch.float32, DEV), rec_form=0, **over)
    want = _fwd_bwd((q, k, v, g, beta), h0, cu, do, dht, plan)
    with poisoned_empty() as calls:
        got = _fwd_bwd((q, k, v, g, beta), h0, cu, do, dht, plan)
    assert len(calls) > 10  # the package's allocations went through the poisoned empty
    names = ("o", "final_state") + GDNDetGrads._fields
    for name, a, b in zip(names, got, want, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            assert bitwise_equal(a, b), name


def test_cuda_rule_fits_the_devices_shared_memory(monkeypatch):
    """The CUDA rule reads the device's shared memory per block: under Hopper's the K-block
    kernel keeps two 64-column blocks of 4 warps (one 128-column block takes 112 KiB on
    sm_80 / sm_120: over consumer GPUs' 99 KiB; on A100 it spills and is untimed);
    at A100's or more the state kernels keep 3 stages; under it (consumer GPUs' 99 KiB) at
    most 2 (compiled under 99 KiB offline: gdn.md); the narrowed state plan keeps the cap; a
    plan per class."""
    import dataclasses

    import cake_core.linear_attention as la
    import torch
    from cake_gdn_det_train import make_plan

    cuda = torch.device("cuda", 0)
    got = {}
    for smem in (232448, 166912, 101376):
        monkeypatch.setattr(la, "rule_shared_memory", lambda d, s=smem: s)
        got[smem] = make_plan(128, 128, torch.bfloat16, cuda)
    hopper = got[232448]
    assert hopper.num_stages_h == 3 and (hopper.block_k_local, hopper.num_warps_local) == (128, 8)
    two_blocks = dataclasses.replace(hopper, block_k_local=64, num_warps_local=4, l2norm_local=0)
    assert got[166912] == two_blocks
    assert got[101376] == dataclasses.replace(two_blocks, num_stages_h=2)


@pytest.mark.parametrize("HV, dtype", [(2, torch.float32), (1, BF16), (2, BF16)],
                         ids=["fp32-HV2", "bf16-HV1", "bf16-HV2"])
def test_l2norm_local_vs_reference_and_unfused(HV, dtype, gdn_inputs):
    """``l2norm_local = 1`` (the q/k L2 norm's backward inside the local kernels; one K
    block): against float64 with ``use_qk_l2norm_in_kernel`` (unnormalised q and k, packed
    1/70/0/65, an initial state and a final-state gradient), with one value head per q/k
    head (dq finished in the K-block kernel) and two (in the dk kernel); no L2-norm
    backward launch, and the norm's forward only in the forward (the backward reads the
    normalised q and k it kept); bitwise repeatable; close to ``l2norm_local = 0`` (other
    bits)."""
    import cake_core.l2norm as l2mod

    K = V = 32
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(LENS), 1, HV, K, V, dtype, seed=91,
                                      n_states=len(LENS), h0=True, normalize_k=False)
    cu = _cu(LENS)
    do = randn(v.shape, dtype, DEV, seed=92)
    dht = randn(h0.shape, torch.float32, DEV, seed=93)
    base = dataclasses.replace(make_plan(K, V, dtype, DEV), local_form=2, block_k_local=32,
                               block_v_local=32)
    plan = dataclasses.replace(base, l2norm_local=1)
    run = lambda p: _grads(chunk_gated_delta_rule_det, (q, k, v, g, beta), h0, do, dht,
                           cu_seqlens=cu, plan=p, use_qk_l2norm_in_kernel=True)
    with record_launches(l2mod, "l2norm_bwd_kernel", "l2norm_fwd_kernel") as launches:
        got = run(plan)
    assert launches.get("l2norm_bwd_kernel", []) == []
    assert len(launches["l2norm_fwd_kernel"]) == 2  # q and k, in the forward
    again = run(plan)
    assert all(bitwise_equal(a, b) for a, b in zip(got, again, strict=True))
    with record_launches(l2mod, "l2norm_bwd_kernel") as launches:
        unfused = run(base)
    assert len(launches["l2norm_bwd_kernel"]) == 2
    _assert_vs_float64(got, (q, k, v, g, beta), h0, do, dht, dtype, cu_seqlens=cu,
                       use_qk_l2norm_in_kernel=True)
    for name, a, c in zip(("o", "final_state") + tuple("d" + n for n in NAMES), got,
                          unfused, strict=True):
        assert_close_to_reference(a, c.double(), dtype, f"{name} vs l2norm_local=0")


def test_l2norm_local_rule_and_old_dicts(monkeypatch):
    """The rule takes ``l2norm_local = 1`` where it takes one K block (CUDA, 16-bit
    K = V = 128), else 0; a plan dict from before the field loads it as 0."""
    import cake_core.linear_attention as la
    from cake_core.triton_utils import CPU_SHARED_MEMORY

    monkeypatch.setattr(la, "rule_shared_memory", lambda device: CPU_SHARED_MEMORY)
    gpu = make_plan(128, 128, BF16, "cuda")
    assert (gpu.l2norm_local, gpu.block_k_local) == (1, 128)
    assert make_plan(128, 128, BF16, "cpu").l2norm_local == 0
    assert make_plan(64, 64, BF16, "cuda").l2norm_local == 0
    d = gpu.to_dict()
    del d["l2norm_local"]
    assert GDNDetPlan.from_dict(d).l2norm_local == 0



@pytest.mark.parametrize("value", [2, -1])
def test_l2norm_local_bad_value_refused(value):
    """``l2norm_local`` other than 0 or 1 is refused when the plan is built or loaded."""
    plan = make_plan(32, 32, torch.float32, DEV)
    with pytest.raises(ValueError, match="l2norm_local"):
        dataclasses.replace(plan, l2norm_local=value)
    d = plan.to_dict()
    d["l2norm_local"] = value
    with pytest.raises(ValueError, match="l2norm_local"):
        GDNDetPlan.from_dict(d)


@pytest.mark.skipif(DEV.type != "cpu", reason="exact float ops of the interpreter: a GPU "
                    "compile contracts the fused and unfused kernels' products differently")
def test_l2norm_local_row_sum_order_is_fixed_and_matters(gdn_inputs, monkeypatch):
    """In fp32 under the interpreter the fused L2-norm backward (``l2norm_local = 1``, three
    value heads per q/k head) gives the unfused path's bits: the same value-head sum in
    index order, then cake_core's row function with one in-register row sum. Other orders
    of that row sum (what a split reduction with atomics would give) change the bits on
    this input, so the repeat assertions of the L2-norm tests can fail."""
    import cake_gdn_det_train.api as api

    K = V = 32
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(LENS), 1, 3, K, V, torch.float32, seed=98,
                                      n_states=len(LENS), h0=True, normalize_k=False)
    cu = _cu(LENS)
    do = randn(v.shape, torch.float32, DEV, seed=99)
    dht = randn(h0.shape, torch.float32, DEV, seed=100)
    base = dataclasses.replace(make_plan(K, V, torch.float32, DEV), local_form=2,
                               block_k_local=32, block_v_local=32)
    seen = []
    real = api._l2norm_bwd
    monkeypatch.setattr(api, "_l2norm_bwd",
                        lambda x, r, dy, p: seen.append((x, r, dy.clone())) or real(x, r, dy, p))
    run = lambda p: _grads(chunk_gated_delta_rule_det, (q, k, v, g, beta), h0, do, dht,
                           cu_seqlens=cu, plan=p, use_qk_l2norm_in_kernel=True)
    unfused = run(base)
    fused = run(dataclasses.replace(base, l2norm_local=1))
    assert len(seen) == 2  # dq and dk of the unfused call only
    for a, b in zip(fused, unfused, strict=True):
        assert bitwise_equal(a, b)
    x, rstd, dy = seen[0]
    x, dy = x.reshape(-1, K).float(), dy.reshape(-1, K).float()
    y = x * rstd.reshape(-1, 1)
    gen = torch.Generator().manual_seed(1)
    differs = 0
    for _ in range(20):
        perm = torch.randperm(K, generator=gen)
        s = torch.zeros(y.shape[0], dtype=torch.float32, device=y.device)
        for j in perm.tolist():  # one column after another in the permuted order
            s = s + dy[:, j] * y[:, j]
        dx = rstd.reshape(-1, 1) * (dy - y * s[:, None])
        differs += not bitwise_equal(dx.reshape(fused[2].shape), fused[2])
    assert differs > 0, "no row-sum order changed the bits: this input cannot detect it"


@pytest.mark.skipif(DEV.type != "cuda", reason="the CUDA rule's one K block at K = V = 128")
@pytest.mark.parametrize("HV", [1, 2])
def test_l2norm_local_cuda_rule_vs_reference(HV, gdn_inputs):
    """The CUDA rule's plan at 16-bit K = V = 128 (``l2norm_local = 1``) with the in-kernel
    q/k L2 norm against float64, packed documents of 0, 1, 63, 64, 65 and 130 tokens."""
    lens = [0, 1, 63, 64, 65, 130]
    cu = _cu(lens)
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(lens), 1, HV, 128, 128, BF16, seed=95,
                                      n_states=len(lens), h0=True, normalize_k=False)
    plan = make_plan(128, 128, BF16, DEV)
    assert plan.l2norm_local == 1
    do = randn(v.shape, BF16, DEV, seed=96)
    dht = randn(h0.shape, torch.float32, DEV, seed=97)
    got = _grads(chunk_gated_delta_rule_det, (q, k, v, g, beta), h0, do, dht, cu_seqlens=cu,
                 plan=plan, use_qk_l2norm_in_kernel=True)
    _assert_vs_float64(got, (q, k, v, g, beta), h0, do, dht, BF16, cu_seqlens=cu,
                       use_qk_l2norm_in_kernel=True)
