"""The KCP route under ``torch.utils.checkpoint``: two gloo processes (CPU), the autograd
entry wrapped in a non-reentrant checkpoint (its forward, collectives included, runs again
during the backward on every rank) against the plain autograd entry: the same output and
gradients, bitwise, on every rank."""

from pathlib import Path

import pytest
import torch
from cake_core.testing import assert_gloo_ranks_pass

_BODY = """
import torch
from torch.utils.checkpoint import checkpoint


def body(rank, world):
    from _gdn_kcp_helpers import global_inputs
    from cake_core.testing import bitwise_equal
    from cake_gdn_det_train_kcp import (build_context_det_kcp,
                                        chunk_gated_delta_rule_det_kcp, partition_det_kcp)

    cu = torch.tensor([0, 40, 41, 64, 130])
    for layout in ("zigzag", "zigzag_per_document"):
        p = partition_det_kcp(cu, world, layout)
        ctx = build_context_det_kcp(p, None, rank, "cpu")
        idx = p.global_index(rank)
        xs = [t[:, idx].contiguous() for t in global_inputs(130, HV=2, seed=3,
                                                              device="cpu")]

        def run(ckpt):
            leaves = [t.clone().requires_grad_() for t in xs[:5]]
            f = lambda *a: chunk_gated_delta_rule_det_kcp(*a, ctx)  # noqa: E731
            o = checkpoint(f, *leaves, use_reentrant=False) if ckpt else f(*leaves)
            o.backward(xs[5])
            return [o.detach()] + [t.grad for t in leaves]

        plain, ckpt = run(False), run(True)
        same = [bitwise_equal(a, b) for a, b in zip(plain, ckpt, strict=True)]
        assert all(same), (layout, rank, same)
"""


def test_checkpoint_two_ranks(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a gloo (CPU) test")
    assert_gloo_ranks_pass(_BODY, tmp_path, path=[Path(__file__).parent])
