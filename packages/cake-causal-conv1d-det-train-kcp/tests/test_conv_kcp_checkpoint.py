"""The KCP route under ``torch.utils.checkpoint``: two gloo processes (CPU), the autograd
entry (halo exchange forward and backward, the weight and bias gradients summed over the
ranks in rank order) wrapped in a non-reentrant checkpoint (its forward, collectives
included, runs again during the backward on every rank) against the plain autograd entry:
the same output and gradients, bitwise, on every rank."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).parent

_WORKER = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils.checkpoint import checkpoint

    def worker(rank, world, init):
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        try:
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
            dist.barrier()
        finally:
            dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(2, "file://" + sys.argv[1]), nprocs=2, join=True)
        print("ok")
""")


def test_checkpoint_two_ranks(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a gloo (CPU) test")
    script = tmp_path / "ckpt_worker.py"
    script.write_text(_WORKER)
    env = dict(os.environ, PYTHONPATH=":".join([str(_HERE), *(x for x in sys.path if x)]))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "rdzv")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-4000:]
