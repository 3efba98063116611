"""Integration: a short cake-tinylm job end to end (three trainings, report files)."""

from __future__ import annotations

import json

import torch
from cake_tinylm import TrainConfig, format_summary, run_job, write_report


def test_tinylm_short_job_is_bitwise_deterministic(tmp_path):
    cfg = TrainConfig(
        steps=20,
        batch_size=4,
        seq_len=32,
        d_model=32,
        n_layers=2,
        n_heads=4,
        lr=3e-3,
        bytes=200_000,
        device="cpu",
        out=str(tmp_path),
        val_windows=8,
    )
    result = run_job(cfg, progress=False)
    a, b, ref = result.runs
    assert (a.name, b.name, ref.name) == ("cake-a", "cake-b", "torch")

    # The cake runs train cake's kernels: norms, every projection, the fused head + loss.
    from cake_dense_projection_det_gemm import Linear
    from cake_lm_head_loss_det_train import LMHeadLoss
    from cake_rmsnorm_det_train import RMSNorm

    kinds = {type(m) for m in a.model.modules()}
    assert {RMSNorm, Linear, LMHeadLoss} <= kinds and torch.nn.Linear not in kinds
    assert not {RMSNorm, Linear, LMHeadLoss} & {type(m) for m in ref.model.modules()}

    # Bitwise-identical per-step losses (compare the float bits) and final weights.
    assert a.losses.shape == (20,) and a.losses.dtype == torch.float32
    assert torch.equal(a.losses.view(torch.int32), b.losses.view(torch.int32))
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    assert pa.keys() == pb.keys()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name
    assert result.losses_identical and result.weights_identical and result.identical

    # It learns: the loss falls.
    assert a.losses[-5:].mean() < a.losses[0]
    # The torch reference follows the same curve closely (fp32, same init and batches).
    assert result.max_gap_torch < 1e-3

    json_path, png_path = write_report(result, tmp_path)
    assert json_path.exists() and png_path.exists() and png_path.stat().st_size > 0
    report = json.loads(json_path.read_text())
    assert report["identical"] is True
    assert set(report["runs"]) == {"cake-a", "cake-b", "torch"}
    assert len(report["runs"]["torch"]["losses"]) == 20
    assert report["versions"]["torch"] == torch.__version__
    assert "cake-a" in format_summary(result)


def test_tinylm_context_parallel_two_processes(tmp_path):
    """``--cp 2`` (gloo, two processes; GDN block): the CP run follows the single-process
    run within float tolerance, repeats bitwise, and its two replicas stay equal."""
    from cake_tinylm.cp import CPConfig, run_cp_job, write_cp_report

    cfg = TrainConfig(steps=2, batch_size=2, seq_len=32, d_model=32, n_layers=1, n_heads=2,
                      bytes=200_000, device="cpu", out=str(tmp_path), val_windows=4,
                      mixer="gdn")
    result = run_cp_job(cfg, CPConfig(2, "zigzag", "allgather"), progress=False)
    assert result.losses_identical and result.weights_identical
    assert result.replicas_identical and result.identical
    assert result.max_gap_single < 1e-4
    report = json.loads(open(write_cp_report(result, tmp_path)).read())
    assert report["config"]["cp"] == {"world_size": 2, "layout": "zigzag",
                                      "exchange": "allgather"}
    assert len(report["cp_runs"]) == 2 and report["identical"] is True
