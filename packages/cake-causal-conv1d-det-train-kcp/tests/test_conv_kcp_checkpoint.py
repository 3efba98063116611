"""The KCP route under ``torch.utils.checkpoint``: two gloo processes (CPU), the autograd
entry (halo exchange forward and backward, the weight and bias gradients summed over the
ranks in rank order) wrapped in a non-reentrant checkpoint (its forward, collectives
included, runs again during the backward on every rank) against the plain autograd entry:
the same output and gradients, bitwise, on every rank."""

from pathlib import Path

import pytest
import torch
from cake_core.testing import assert_gloo_ranks_pass

_BODY = """
import torch
from torch.utils.checkpoint import checkpoint


def body(rank, world):
    from _conv_kcp_helpers import global_inputs
    from cake_causal_conv1d_det_train_kcp import (build_context_det_kcp,
                                                  causal_conv1d_det_kcp,
                                                  partition_det_kcp)
    from cake_core.testing import bitwise_equal

    cu = torch.tensor([0, 40, 41, 64, 130])
    x, w, b, dy = global_inputs(130, 24, 4, seed=3, device="cpu")
    for layout in ("zigzag", "zigzag_per_document"):
        p = partition_det_kcp(cu, world, layout)
        ctx = build_context_det_kcp(p, None, rank, "cpu", conv_kernel_size=4)
        idx = p.global_index(rank)
        xl, dyl = x[:, idx].contiguous(), dy[:, idx].contiguous()

        def run(ckpt):
            leaves = [t.clone().requires_grad_() for t in (xl, w, b)]

            def f(*a):
                return causal_conv1d_det_kcp(*a, ctx, activation="silu",
                                             reduce_weight_grads=True)
            y = checkpoint(f, *leaves, use_reentrant=False) if ckpt else f(*leaves)
            y.backward(dyl)
            return [y.detach()] + [t.grad for t in leaves]

        plain, ckpt = run(False), run(True)
        same = [bitwise_equal(a, c) for a, c in zip(plain, ckpt, strict=True)]
        assert all(same), (layout, rank, same)
"""


def test_checkpoint_two_ranks(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a gloo (CPU) test")
    assert_gloo_ranks_pass(_BODY, tmp_path, path=[Path(__file__).parent])
