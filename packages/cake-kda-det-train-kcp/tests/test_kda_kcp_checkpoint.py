"""The KCP route under ``torch.utils.checkpoint``: two gloo processes (CPU), the autograd
entry with FLA's in-kernel gate and L2 norm wrapped in a non-reentrant checkpoint (its
forward, collectives included, runs again during the backward on every rank; the gate
parameters' gradient sum over the ranks too) against the plain autograd entry: the same
output and gradients, A_log's and dt_bias's included, bitwise, on every rank."""

from pathlib import Path

import pytest
import torch
from cake_core.testing import assert_gloo_ranks_pass

_BODY = """
import torch
from torch.utils.checkpoint import checkpoint


def body(rank, world):
    from _kda_kcp_helpers import global_inputs
    from cake_core.testing import bitwise_equal
    from cake_kda_det_train_kcp import (build_context_det_kcp, chunk_kda_det_kcp,
                                        partition_det_kcp)

    cu = torch.tensor([0, 40, 41, 64, 130])
    xs, kw = global_inputs(130, HV=2, seed=3, device="cpu", kind="gate")
    for layout in ("zigzag_per_document",):  # the layout with the most fragments per rank
        p = partition_det_kcp(cu, world, layout)
        ctx = build_context_det_kcp(p, None, rank, "cpu")
        idx = p.global_index(rank)
        local = [t[:, idx].contiguous() for t in xs]

        def run(ckpt):
            leaves = [t.clone().requires_grad_() for t in local[:5]]
            a_log, dt_bias = (kw[n].clone().requires_grad_()
                              for n in ("A_log", "dt_bias"))
            opts = {n: v for n, v in kw.items() if n not in ("A_log", "dt_bias")}
            opts["use_qk_l2norm_in_kernel"] = True

            def f(*a):
                return chunk_kda_det_kcp(*a[:5], ctx, A_log=a[5], dt_bias=a[6],
                                         **opts)
            args = (*leaves, a_log, dt_bias)
            o = checkpoint(f, *args, use_reentrant=False) if ckpt else f(*args)
            o.backward(local[5])
            return [o.detach()] + [t.grad for t in args]

        plain, ckpt = run(False), run(True)
        same = [bitwise_equal(a, b) for a, b in zip(plain, ckpt, strict=True)]
        assert all(same), (layout, rank, same)
"""


def test_checkpoint_two_ranks(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a gloo (CPU) test")
    assert_gloo_ranks_pass(_BODY, tmp_path, path=[Path(__file__).parent])
