"""``plan.rec_form = 1 / 2``: the two state-recurrence kernels (the forward's, also run by
the backward's recompute, and the backward's dS kernel) in FLA's operand form: block
pointers, the transposed operands formed from ``[K, 64]`` tiles loaded transposed; with 2
kg = k exp(G_last - G) stored by the chunk prep and loaded by both state kernels
(docs/benchmarks/kda_fwd_plan.md, rank 4). o, final state and every gradient against the
float64 reference (packed documents with an empty, a 1-token and a > 64-token one, HV = 2H,
strong decays, an initial state and dht, K and V off the block sizes with partial V blocks,
fp32 and bf16); close to ``rec_form = 0``; bitwise repeatable; the field is serialised
(format version 5), checked, and a format-4 dict is refused."""

import dataclasses

import pytest
import torch
from cake_core.testing import assert_bitwise_repeat, randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import KDADetPlan, make_plan

DEV = default_device()
LENS = [1, 37, 0, 20, 70]


def _plan(K, V, dtype, **over):
    return dataclasses.replace(make_plan(K, V, dtype, DEV), **{"rec_form": 1, **over})


@pytest.mark.parametrize("rec_form", [1, 2])
@pytest.mark.parametrize("K, V, dtype, over", [
    (24, 40, torch.float32, dict(block_v=16, block_v_h=16, store_16bit=0)),
    (24, 40, torch.float32, dict(block_v=32, block_v_h=32, keep_a=0, keep_aqk=0)),
    (32, 32, torch.bfloat16, dict()),
], ids=["fp32-K24-V40-bv16", "fp32-K24-V40-bv32-recompute", "bf16-K32-V32"])
def test_rec_form_vs_reference(K, V, dtype, over, rec_form, kda):
    """Documents of 1, 37, 0, 20 and 70 tokens (chunks ending inside the chunk, an empty
    document, a 1-token one, one over two chunks); V = 40 in blocks of 16 / 32 ends in a
    partly masked V block, K = 24 in a block of 32; bf16 at K = V = 32 stores 16-bit
    intermediates under the interpreter."""
    plan = _plan(K, V, dtype, rec_form=rec_form, **over)
    kda.check_plan_on_docs(plan, LENS, K, V, dtype, seed=91)


@pytest.mark.parametrize("rec_form", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rec_form_close_to_0_and_repeats(dtype, rec_form, kda):
    """Against ``rec_form = 0`` (the same products; v_new's and kg's rounding may differ
    with 16-bit intermediates): close; and the same bits twice."""
    K, V = (24, 40) if dtype == torch.float32 else (32, 48)
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(LENS), 1, 2, K, V, dtype, seed=93,
                                               g_mode="strong", n_states=len(LENS), h0=True)
    cu = kda.cu_of(LENS)
    do = randn(v.shape, dtype, DEV, seed=94)
    dht = randn(h0.shape, torch.float32, DEV, seed=95)
    new = _plan(K, V, dtype, block_v=32, block_v_h=32, rec_form=rec_form)
    base = dataclasses.replace(new, rec_form=0)
    want = kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, dht, base)
    got = assert_bitwise_repeat(
        lambda: kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, dht, new), repeats=2)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a is None) == (b is None), i
        if a is not None:
            torch.testing.assert_close(a.float(), b.float(), **tol)


def test_rec_form_field_serialised_and_checked():
    on = make_plan(128, 128, torch.bfloat16, DEV)
    assert on.rec_form == 2  # the rule's form since session 20 (H200: same bits, faster)
    assert make_plan(24, 40, torch.float32, DEV).rec_form == 2
    plan = dataclasses.replace(on, rec_form=0)
    d = on.to_dict()
    assert d["rec_form"] == 2 and d["version"] == KDADetPlan.format_version == 1
    assert KDADetPlan.from_dict(d) == on and on.key != plan.key
    assert dataclasses.replace(plan, rec_form=1).key not in (plan.key, on.key)
    for bad in (3, -1, True):
        with pytest.raises(ValueError, match="rec_form"):
            dataclasses.replace(plan, rec_form=bad)


def test_rec_form_launches_its_kernels(kda, monkeypatch):
    """``rec_form`` picks the state kernels: 1 and 2 launch the operand-form pair (forward,
    recompute and dS), 0 never does; 2 has the prep store kg and the state kernels read it
    (a kg made wrong on purpose changes o, the final state and the gradients)."""
    import cake_kda_det_train.chunk as chunk

    seen = []

    class _Spy:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            seen.append(self.name)
            return self.kernel[grid]

    for name in ("kda_fwd_h_op_kernel", "kda_bwd_dh_op_kernel"):
        monkeypatch.setattr(chunk, name, _Spy(getattr(chunk, name), name))
    lens = [5, 0, 70]
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 1, 1, 16, 16, seed=97,
                                               n_states=len(lens), h0=True)
    cu = kda.cu_of(lens)
    do = randn(v.shape, torch.float32, DEV, seed=98)
    dht = randn(h0.shape, torch.float32, DEV, seed=99)
    base = dataclasses.replace(make_plan(16, 16, torch.float32, DEV), rec_form=0)
    kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, dht, base)
    assert seen == []
    one = kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, dht,
                            dataclasses.replace(base, rec_form=1))
    assert seen == ["kda_fwd_h_op_kernel", "kda_fwd_h_op_kernel", "kda_bwd_dh_op_kernel"]
    two_plan = dataclasses.replace(base, rec_form=2)
    two = kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, dht, two_plan)
    for a, b in zip(one, two, strict=True):  # fp32: same values, kg formed elsewhere
        assert (a is None and b is None) or torch.equal(a, b)
    real = chunk.kda_fwd_prep_kernel

    class _DoubleKG:  # the prep stores 2 kg: the rec_form = 2 state kernels must see it
        def __getitem__(self, grid):
            def launch(*args, **kw):
                real[grid](*args, **kw)
                if kw.get("STORE_KG"):
                    args[13].mul_(2.0)
            return launch

    monkeypatch.setattr(chunk, "kda_fwd_prep_kernel", _DoubleKG())
    bad = kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, dht, two_plan)
    assert not torch.allclose(bad[1], two[1])  # final state
    assert not torch.allclose(bad[0], two[0])  # o (through the chunk states)
    assert not torch.allclose(bad[6], two[6])  # dv (through du = ... + kd dS)
