"""One forward and backward of chunk_gated_delta_rule_nondet captured in a CUDA graph and
replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`): packed ragged documents (one empty,
one of length 1) through the autograd entry and through the low-level pair with a static
workspace; ``cu_seqlens`` stays one unchanged tensor (read on the host once, before the
capture; the chunk tables the warm-up uploaded on the capture stream are reused), and
fixed-length rows (their tables are cached from the warm-up and pinned in the offsets cache
by the capture). Replays equal to eager bitwise: this package's kernels today have no
atomics; revisit if a plan adds them. The graph tests need CUDA; the same steps run eagerly
on the CPU under Triton's interpreter."""

import pytest
import torch
import torch.nn.functional as F
from cake_core.testing import deterministic_algorithms, graph_replay_matches_eager, randn
from cake_core.triton_utils import is_interpreting
from cake_gdn_nondet_train import (
    GDNNondetWorkspace,
    chunk_gated_delta_rule_nondet,
    chunk_gdn_nondet_bwd,
    chunk_gdn_nondet_fwd,
    make_nondet_plan,
)

NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state")


@pytest.fixture(autouse=True)
def _deterministic_algorithms_off():
    """The nondet backward raises under ``torch.use_deterministic_algorithms(True)``."""
    with deterministic_algorithms(False):
        yield


def case(dev, H, HV, K, V, dtype, *, lens=None, B=1, T=0, low_level=False):
    """``(make_inputs, step, names)`` on ``dev``: ``B`` rows of ``T`` tokens, or (``lens``)
    one packed row of documents of those lengths; the autograd entry, or with ``low_level``
    the fwd/bwd pair with a static workspace."""
    cu = None
    if lens is not None:
        B, T = 1, sum(lens)
        cu = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(dev, torch.int32)
    N = B if cu is None else len(lens)
    plan = make_nondet_plan(K, V, dtype, dev)
    ws = GDNNondetWorkspace.for_plan(plan, dev, num_v_heads=HV, max_tokens=B * T, max_seqs=N,
                                     dtype=dtype)

    def make_inputs(seed):
        s = 10 * seed
        q = randn((B, T, H, K), torch.float64, "cpu", seed=s + 1)
        k = F.normalize(randn((B, T, H, K), torch.float64, "cpu", seed=s + 2), dim=-1)
        v = randn((B, T, HV, V), torch.float64, "cpu", seed=s + 3)
        g = F.logsigmoid(randn((B, T, HV), torch.float64, "cpu", seed=s + 4))
        beta = torch.sigmoid(randn((B, T, HV), torch.float64, "cpu", seed=s + 5))
        h0 = 0.5 * randn((N, HV, K, V), torch.float64, "cpu", seed=s + 6)
        do = randn((B, T, HV, V), torch.float64, "cpu", seed=s + 7)
        dht = randn((N, HV, K, V), torch.float64, "cpu", seed=s + 8)
        return (*(t.to(dev, dtype) for t in (q, k, v)),
                *(t.to(dev, torch.float32) for t in (g, beta, h0)), do.to(dev, dtype),
                dht.to(dev, torch.float32))

    def step(q, k, v, g, beta, h0, do, dht):
        if low_level:
            o, ht, saved = chunk_gdn_nondet_fwd(q, k, v, g, beta, initial_state=h0,
                                                output_final_state=True, cu_seqlens=cu,
                                                plan=plan, workspace=ws)
            grads = tuple(chunk_gdn_nondet_bwd(do, dht, saved, workspace=ws))[:6]
            return (o, ht, *grads)
        leaves = [t.detach().requires_grad_() for t in (q, k, v, g, beta, h0)]
        o, ht = chunk_gated_delta_rule_nondet(*leaves[:5], initial_state=leaves[5],
                                              output_final_state=True, cu_seqlens=cu,
                                              plan=plan)
        grads = torch.autograd.grad((o, ht), leaves, (do, dht))
        return (o.detach(), ht.detach(), *grads)

    return make_inputs, step, NAMES


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("H,HV,K,V,dtype,lens,low_level", [
    (2, 4, 64, 64, torch.bfloat16, (1, 70, 0, 65, 9), False),
    (1, 2, 32, 32, torch.float32, (1, 70, 0, 65, 9), True),
    (2, 2, 64, 64, torch.bfloat16, (130, 1, 64), True),
])
def test_graph_replay_matches_eager_packed(H, HV, K, V, dtype, lens, low_level):
    make_inputs, step, names = case(torch.device("cuda"), H, HV, K, V, dtype, lens=lens,
                                    low_level=low_level)
    graph_replay_matches_eager(make_inputs, step, names=names)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("low_level", [False, True])
def test_graph_replay_matches_eager_fixed_length(low_level):
    make_inputs, step, names = case(torch.device("cuda"), 2, 4, 64, 64, torch.bfloat16, B=2,
                                    T=100, low_level=low_level)
    graph_replay_matches_eager(make_inputs, step, names=names)


@pytest.mark.skipif(not is_interpreting(), reason="Triton compiles for CUDA in this process")
def test_step_runs_eagerly_on_the_cpu():
    H, HV, K, V, lens = 1, 2, 32, 32, (1, 40, 0, 29)  # one document across two chunks
    T, N = sum(lens), len(lens)
    want = [(1, T, HV, V), (N, HV, K, V), (1, T, H, K), (1, T, H, K), (1, T, HV, V),
            (1, T, HV), (1, T, HV), (N, HV, K, V)]
    for low_level in (False, True):
        make_inputs, step, names = case(torch.device("cpu"), H, HV, K, V, torch.float32,
                                        lens=lens, low_level=low_level)
        outs = step(*make_inputs(1))
        assert [tuple(o.shape) for o in outs] == want, low_level
        for name, o in zip(names, outs, strict=True):
            assert torch.isfinite(o).all(), (name, low_level)
