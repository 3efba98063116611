"""MoEFeedForward is bitwise repeatable, in one process and across processes; its combine
and the permutation's backward are fixed-order sums, and an index_add_ in another order
(what atomics do) gives other bits (the tests can fail); no accumulating scatter op runs
anywhere in the layer."""

import torch
from _moe_cases import DEV
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_same_output_across_processes,
    bitwise_equal,
    randn,
)
from cake_moe_grouped_det_gemm import (
    MoEFeedForward,
    moe_permute_det,
    moe_route_det,
    moe_unpermute_det,
)
from torch.utils._python_dispatch import TorchDispatchMode

D, F, E, K = 24, 20, 8, 4


def _routing(T=33, seed=0):
    logits = randn((T, E), torch.float32, DEV, seed=seed, scale=2.0)
    return moe_route_det(logits, K)


def _mixed(shape, seed):
    """Values of mixed magnitudes, so that the order of a sum shows in its bits."""
    v = randn(shape, torch.float32, DEV, seed=seed)
    return v * torch.exp(2.0 * randn(shape, torch.float32, DEV, seed=seed + 100))


def _shuffled_index_add(values, index, n, gen):
    """``zeros(n, d).index_add_(0, index, values)`` with the rows added in a random order:
    the arrival order of floating atomics."""
    perm = torch.randperm(values.shape[0], generator=gen)
    out = torch.zeros((n, values.shape[1]), dtype=torch.float32, device=values.device)
    for i in perm.tolist():
        out[index[i]] += values[i]
    return out


def test_combine_is_slot_order_sum_and_atomics_order_would_show():
    r = _routing()
    T = r.ids.shape[0]
    out = _mixed((T * K, D), seed=1)
    y = moe_unpermute_det(out, r)
    # the documented order: ((w0 o0 + w1 o1) + w2 o2) + w3 o3, fp32
    rows = out[r.slot].view(T, K, D)
    want = r.weights[:, 0, None] * rows[:, 0]
    for j in range(1, K):
        want = want + r.weights[:, j, None] * rows[:, j]
    assert bitwise_equal(y, want)
    # the same terms scattered with index_add_ in other orders
    terms = (r.weights.reshape(-1)[r.order, None] * out)  # sorted row p -> its term
    token = torch.div(r.order, K, rounding_mode="floor")
    gen = torch.Generator().manual_seed(0)
    differs = sum(not bitwise_equal(_shuffled_index_add(terms, token, T, gen), y)
                  for _ in range(10))
    assert differs > 0, "no order changed the bits: this input cannot detect atomics"
    assert bitwise_equal(moe_unpermute_det(out, r), y)


def test_permute_backward_is_slot_order_sum_and_atomics_order_would_show():
    r = _routing(seed=2)
    T = r.ids.shape[0]
    x = randn((T, D), torch.float32, DEV, seed=3).requires_grad_()
    dxp = _mixed((T * K, D), seed=4)
    xp = moe_permute_det(x, r)
    assert torch.equal(xp, x.detach()[torch.div(r.order, K, rounding_mode="floor")])
    xp.backward(dxp)
    rows = dxp[r.slot].view(T, K, D)
    want = rows[:, 0]
    for j in range(1, K):
        want = want + rows[:, j]
    assert bitwise_equal(x.grad, want)
    token = torch.div(r.order, K, rounding_mode="floor")
    gen = torch.Generator().manual_seed(1)
    differs = sum(not bitwise_equal(_shuffled_index_add(dxp, token, T, gen), x.grad)
                  for _ in range(10))
    assert differs > 0


_FORBIDDEN = ("index_add", "scatter_add", "scatter_reduce", "index_reduce", "put_",
              "embedding_dense_backward", "_index_put_impl_")


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        accumulate = name.startswith("aten::index_put") and (
            kwargs.get("accumulate") or (len(args) > 3 and args[3]))
        self.ops.append((name, bool(accumulate)))
        return func(*args, **kwargs)


def _layer_step(dtype, seed=0):
    torch.manual_seed(seed)
    m = MoEFeedForward(D, F, E, K).to(DEV, dtype)
    x = randn((2, 19, D), dtype, DEV, seed=5, scale=2.0).requires_grad_()
    dy = randn((2, 19, D), dtype, DEV, seed=6)
    y, aux = m(x)
    ((y.float() * dy.float()).sum() + 7.0 * aux).backward()
    return [y, aux, x.grad, m.router_weight.grad, m.w_gate_up.grad, m.w_down.grad]


def test_layer_repeats_bitwise_and_runs_no_accumulating_scatter():
    log = _OpLog()
    with log:
        first = _layer_step(torch.bfloat16)
    bad = [n for n, acc in log.ops if acc or any(f in n for f in _FORBIDDEN)]
    assert not bad, bad
    assert any("sort" in n for n, _ in log.ops)  # the log did see the layer's ops

    def noise():
        _layer_step(torch.float32, seed=3)

    again = assert_bitwise_repeat(lambda: _layer_step(torch.bfloat16), repeats=2,
                                  between=noise)
    for a, b in zip(first, again, strict=True):
        assert bitwise_equal(a, b)


_LAYER_HASH_SCRIPT = """
import torch
from cake_core.bench import bits_sha256
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_moe_grouped_det_gemm import MoEFeedForward
dev = default_device()
torch.manual_seed(0)
m = MoEFeedForward(24, 20, 8, 4).to(dev, torch.bfloat16)
x = randn((37, 24), torch.bfloat16, dev, seed=5, scale=2.0).requires_grad_()
dy = randn((37, 24), torch.bfloat16, dev, seed=6)
y, aux = m(x)
((y.float() * dy.float()).sum() + 7.0 * aux).backward()
print(bits_sha256([y, aux, x.grad, m.router_weight.grad, m.w_gate_up.grad, m.w_down.grad]))
"""


def test_layer_same_bits_process_after_process():
    assert_same_output_across_processes(_LAYER_HASH_SCRIPT)
