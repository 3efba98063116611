"""o, final_state and every gradient are bitwise repeatable: call after call with other work
in between, with a reused (poisoned) workspace, kept or recomputed T, and process after
process. And the repeat tests can fail: reordering a fixed-order sum changes the bits."""


import cake_kda_det_train.api as api
import cake_kda_det_train.chunk as chunk
import pytest
import torch
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_same_output_across_processes,
    bitwise_equal,
    poison_,
    randn,
)
from cake_core.triton_utils import default_device
from cake_kda_det_train import (
    KDADetWorkspace,
    chunk_kda_det_bwd,
    chunk_kda_det_fwd,
    make_plan,
)

DEV = default_device()


def _fwd_bwd(inputs, h0, cu, do, dht, **kw):
    o, ht, saved = chunk_kda_det_fwd(*inputs, initial_state=h0, output_final_state=True,
                                     cu_seqlens=cu, **kw)
    return (o, ht, saved.g_cumsum, saved.A, *chunk_kda_det_bwd(do, dht, saved))


def test_repeat_bitwise_with_other_kernels_between(kda):
    """bf16, packed (1 and 20 tokens), every in-kernel option: o, final state, the saved
    chunk quantities and all eight gradients, three times, other launches between."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 21, 1, 2, 32, 32, torch.bfloat16, seed=41,
                                               n_states=2, h0=True, g_mode="raw",
                                               raw_beta=True, normalize_k=False)
    A_log, dt_bias = kda.make_gate_params(2, 32, seed=42)
    cu = kda.cu_of([1, 20])
    do = randn(v.shape, torch.bfloat16, DEV, seed=43)
    dht = randn(h0.shape, torch.float32, DEV, seed=44)
    opts = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log,
                dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)

    def noise():  # other launches between repeats
        a, b, c, d, e, _ = kda.make_kda_inputs(1, 20, 1, 1, 16, 16, seed=45)
        chunk_kda_det_fwd(a, b, c, d, e)

    first = assert_bitwise_repeat(lambda: _fwd_bwd((q, k, v, g, beta), h0, cu, do, dht, **opts),
                                  repeats=3, between=noise)
    assert all(t is not None for t in first)


def test_workspace_reuse_poison_same_bits(kda):
    """A reused workspace poisoned with NaN between calls: the bits of the low-level path
    without a workspace (o, final state, the saved chunk quantities, every gradient; two
    chunks, so the chunk states pass through the workspace). The autograd path's bits equal
    the low-level path's: test_kda_parity.py::test_low_level_equals_autograd_bitwise."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 70, 1, 2, 32, 32, seed=47, h0=True)
    do = randn(v.shape, torch.float32, DEV, seed=48)
    dht = randn(h0.shape, torch.float32, DEV, seed=49)
    want = _fwd_bwd((q, k, v, g, beta), h0, None, do, dht)
    plan = make_plan(32, 32, torch.float32, DEV)
    ws = KDADetWorkspace.for_plan(plan, DEV, num_v_heads=2, max_tokens=200, max_seqs=2)
    for name in ws.names:
        poison_(ws[name])
    o, ht, saved = chunk_kda_det_fwd(q, k, v, g, beta, initial_state=h0,
                                     output_final_state=True, plan=plan, workspace=ws)
    for name in ws.names:
        poison_(ws[name])
    got = (o, ht, saved.g_cumsum, saved.A, *chunk_kda_det_bwd(do, dht, saved, workspace=ws))
    for a, b in zip(want, got, strict=True):
        assert bitwise_equal(a, b)


def test_value_head_sum_order_matters_and_is_fixed(kda, monkeypatch):
    """dq/dk of a q/k head add its 4 value heads' partials in index order
    (cake_core.gemm.group_sum_cast). Other orders (what atomics would give) change the bits on
    this input, so the repeat tests can fail; the det path equals the documented order."""
    q, k, v, g, beta, _ = kda.make_kda_inputs(1, 30, 1, 4, 16, 16, seed=61)
    do = randn(v.shape, torch.float32, DEV, seed=62)
    seen = []
    real = chunk.group_sum_cast

    def spy(x, H, dtype):
        seen.append(x.clone())
        return real(x, H, dtype)

    monkeypatch.setattr(chunk, "group_sum_cast", spy)
    _, _, saved = chunk_kda_det_fwd(q, k, v, g, beta)
    grads = chunk_kda_det_bwd(do, None, saved)
    parts = seen[0]  # dq per value head, [NT, HV, K]
    NT, HV, K = parts.shape
    ordered = parts[:, 0].clone()
    for j in range(1, HV):
        ordered = ordered + parts[:, j]
    assert bitwise_equal(ordered.view(grads.dq.shape), grads.dq)
    gen = torch.Generator().manual_seed(0)
    differs = 0
    for _ in range(20):
        perm = torch.randperm(HV, generator=gen).tolist()
        s = parts[:, perm[0]].clone()
        for j in perm[1:]:
            s = s + parts[:, j]
        differs += not bitwise_equal(s, ordered)
    assert differs > 0, "no reordering changed the bits: this input cannot detect atomics"
    again = chunk_kda_det_bwd(do, None, saved)
    assert bitwise_equal(again.dq, grads.dq) and bitwise_equal(again.dk, grads.dk)


def test_perturbed_gate_sum_order_changes_bits(kda, monkeypatch):
    """The dA_log / ddt_bias partials summed in reverse chunk order (a perturbed summation
    order) give other bits than cake's chunk order on this input (4 chunks: packed documents
    of 5, 7, 3 and 9 tokens): the repeat tests can fail."""
    lens = [5, 7, 3, 9]
    q, k, v, g, beta, _ = kda.make_kda_inputs(1, sum(lens), 1, 2, 16, 16, seed=65,
                                              g_mode="raw")
    A_log, dt_bias = kda.make_gate_params(2, 16, seed=66)
    plan = make_plan(16, 16, torch.float32, DEV)
    do = randn(v.shape, torch.float32, DEV, seed=67)
    _, _, saved = chunk_kda_det_fwd(q, k, v, g, beta, use_gate_in_kernel=True, A_log=A_log,
                                    dt_bias=dt_bias, plan=plan, cu_seqlens=kda.cu_of(lens))
    want = chunk_kda_det_bwd(do, None, saved)
    real = api.ordered_sum
    monkeypatch.setattr(api, "ordered_sum",
                        lambda p, **kw: real(p.flip(0).contiguous(), **kw))
    flipped = chunk_kda_det_bwd(do, None, saved)
    assert bitwise_equal(want.dg, flipped.dg)  # elementwise: unaffected
    assert not (bitwise_equal(want.dA_log, flipped.dA_log)
                and bitwise_equal(want.ddt_bias, flipped.ddt_bias))
    monkeypatch.setattr(api, "ordered_sum", real)
    again = chunk_kda_det_bwd(do, None, saved)
    assert bitwise_equal(again.dA_log, want.dA_log) and bitwise_equal(again.ddt_bias,
                                                                      want.ddt_bias)


def test_same_bits_across_processes():
    code = """
import hashlib, torch
import torch.nn.functional as F
from cake_kda_det_train import chunk_kda_det_bwd, chunk_kda_det_fwd
from cake_core.testing import bits, randn
from cake_core.triton_utils import default_device
dev = default_device()
q = randn((1, 20, 1, 16), torch.bfloat16, dev, seed=1)
k = F.normalize(randn((1, 20, 1, 16), torch.float32, dev, seed=2), dim=-1).bfloat16()
v = randn((1, 20, 2, 16), torch.bfloat16, dev, seed=3)
g = F.logsigmoid(randn((1, 20, 2, 16), torch.float32, dev, seed=4))
beta = randn((1, 20, 2), torch.float32, dev, seed=5).sigmoid()
o, ht, saved = chunk_kda_det_fwd(q, k, v, g, beta, output_final_state=True)
gr = chunk_kda_det_bwd(torch.ones_like(o), torch.ones_like(ht), saved)
h = hashlib.sha256()
for t in (o, ht, *gr[:5]):
    h.update(bits(t).cpu().numpy().tobytes())
print(h.hexdigest())
"""
    assert_same_output_across_processes(code, processes=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU-sized repeat: CUDA only")
def test_repeat_bitwise_at_benchmark_shape_on_cuda(kda):
    """The benchmark's shape (B = 4, T = 4096, H = 16, K = V = 128, bf16) with twice as many
    value heads as q/k heads, five calls: o, final state and every gradient bitwise equal.
    The small-shape tests above passed on an H200 while the CUDA rule's former
    block_k_inner = 64 made dk, dg and dbeta differ between calls at this shape."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(4, 4096, 16, 32, 128, 128, torch.bfloat16,
                                               seed=51, n_states=4, h0=True)
    do = randn(v.shape, torch.bfloat16, DEV, seed=52)
    dht = randn(h0.shape, torch.float32, DEV, seed=53)
    assert_bitwise_repeat(lambda: _fwd_bwd((q, k, v, g, beta), h0, None, do, dht), repeats=5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU time-slicing: CUDA only")
def test_repeat_bitwise_while_the_gpu_is_time_shared(kda):
    """The benchmark's shape, 20 calls while two other processes multiply matrices on the
    same GPU (the GPU then switches between processes mid-kernel): every output bitwise
    equal. Without the barriers in the backward chunk kernel's loops over V its builds of
    more than 2 warps gave dk, dg and dbeta that changed between calls under such load
    (docs/determinism.md)."""
    from cake_core.testing import gpu_time_sharers

    q, k, v, g, beta, h0 = kda.make_kda_inputs(4, 4096, 16, 16, 128, 128, torch.bfloat16,
                                               seed=54, n_states=4, h0=True)
    do = randn(v.shape, torch.bfloat16, DEV, seed=55)
    dht = randn(h0.shape, torch.float32, DEV, seed=56)
    fn = lambda: _fwd_bwd((q, k, v, g, beta), h0, None, do, dht)  # noqa: E731
    fn()  # compiled before the other processes start
    with gpu_time_sharers(2):
        assert_bitwise_repeat(fn, repeats=20)
