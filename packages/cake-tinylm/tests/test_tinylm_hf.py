"""``--model qwen3-next`` / ``--model qwen3``: the main job on transformers' models patched by
cake-transformers.

Tiny configs (Qwen3-Next: 2 layers, one Gated DeltaNet, one gated attention; Qwen3: 2 dense
layers; hidden 64, T = 16, B = 2, 3 steps, fp32 on the CPU): the two patched runs must be
bitwise identical, the unpatched (transformers) run close, and report.json must carry the
model and its config.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("cake_transformers")

from cake_tinylm import default_config, run_job, write_report  # noqa: E402
from cake_tinylm.cli import main  # noqa: E402
from cake_tinylm.hf import HF_MODELS, HFCausalLM, qwen3_config, qwen3_next_config  # noqa: E402
from cake_tinylm.train import TrainConfig  # noqa: E402

TINY = dict(model="qwen3-next", steps=3, batch_size=2, seq_len=16, d_model=64, n_layers=2,
            n_heads=2, bytes=20_000, val_windows=2)


def test_qwen3_next_job_is_bitwise_deterministic_and_reported(tmp_path):
    from transformers import Qwen3NextForCausalLM

    cfg = default_config("cpu", out=str(tmp_path), **TINY)
    assert (cfg.moe_experts, cfg.moe_top_k) == (4, 2)  # the model's CPU defaults
    result = run_job(cfg, progress=False)
    a, b, ref = result.runs
    assert [r.name for r in result.runs] == ["cake-a", "cake-b", "torch"]
    assert [r.impl for r in result.runs] == ["cake", "cake", "torch"]
    for r in result.runs:
        assert isinstance(r.model, HFCausalLM) and isinstance(r.model.lm, Qwen3NextForCausalLM)
    # patched in place (instance forwards), the torch run unpatched; the same keys
    assert "forward" in vars(a.model.lm) and "forward" not in vars(ref.model.lm)
    assert a.model.state_dict().keys() == ref.model.state_dict().keys()
    assert result.model_config.layer_types == ["linear_attention", "full_attention"]
    assert torch.equal(a.losses.view(torch.int32), b.losses.view(torch.int32))
    assert result.losses_identical and result.weights_identical and result.identical
    assert result.max_gap_torch < 1e-4 and abs(a.val_loss - ref.val_loss) < 1e-4

    json_path, png_path = write_report(result, tmp_path)
    rep = json.loads(json_path.read_text())
    assert png_path.exists()
    assert rep["model"] == "qwen3-next" and rep["identical"] is True
    assert rep["n_params"] == sum(p.numel() for p in a.model.parameters())
    assert rep["config"]["train"]["model"] == "qwen3-next"
    hf = rep["config"]["model"]
    assert hf["model_type"] == "qwen3_next" and hf["vocab_size"] == 256
    assert (hf["hidden_size"], hf["head_dim"], hf["num_experts"]) == (64, 64, 4)
    assert rep["cake_families"] == list(HF_MODELS["qwen3-next"].families)
    assert set(rep["runs"]) == {"cake-a", "cake-b", "torch"}
    for run in rep["runs"].values():
        assert {"final_train_loss", "val_loss", "tokens_per_s", "losses"} <= set(run)
    assert rep["versions"]["transformers"] and "cake-transformers" in rep["versions"]


def test_qwen3_next_configs():
    # the CUDA default: about 100M parameters, 3 Gated DeltaNet : 1 attention, bf16
    spec = HF_MODELS["qwen3-next"]
    big = TrainConfig(**spec.cuda_defaults, device="cpu", model="qwen3-next")
    c = qwen3_next_config(big)
    assert big.dtype == "bfloat16" and big.seq_len == 4096
    assert c.layer_types == ["linear_attention"] * 3 + ["full_attention"] + \
        ["linear_attention"] * 3 + ["full_attention"]
    assert (c.num_experts, c.num_experts_per_tok, c.hidden_size) == (32, 4, 1024)
    from transformers import Qwen3NextForCausalLM

    with torch.device("meta"):
        n = sum(p.numel() for p in Qwen3NextForCausalLM(c).parameters())
    assert 90e6 < n < 110e6
    # refusals: tinylm's options, no experts
    with pytest.raises(ValueError, match="tinylm"):
        TrainConfig(model="qwen3-next", mixer="gdn")
    with pytest.raises(ValueError, match="model must be"):
        TrainConfig(model="llama")
    with pytest.raises(ValueError, match="experts"):
        TrainConfig(model="qwen3-next").model_config()


def test_qwen3_next_cli_refusals(tmp_path, capsys, monkeypatch):
    out = ["--out", str(tmp_path), "--device", "cpu", "--no-progress"]
    assert main(["train", "--model", "qwen3-next", "--mixer", "kda", *out]) == 2
    assert main(["train", "--model", "qwen3-next", "--cp", "2", *out]) == 2
    # a missing cake-transformers: exit 2, the install command named, before any training
    import cake_tinylm.hf as hf_mod

    real = hf_mod.importlib.import_module

    def no_cake_transformers(name, *a):
        if name == "cake_transformers":
            raise ImportError("No module named 'cake_transformers'")
        return real(name, *a)

    for model in ("qwen3-next", "qwen3"):  # sizes the transformers models cannot take
        for bad in (["--n-heads", "0"], ["--d-model", "0"], ["--n-layers", "0"],
                    ["--seq-len", "1"]):
            assert main(["train", "--model", model, *bad, *out]) == 2
            assert f"{bad[0]} must be >=" in capsys.readouterr().err
    monkeypatch.setattr(hf_mod.importlib, "import_module", no_cake_transformers)
    assert main(["train", "--model", "qwen3-next", *out]) == 2
    err = capsys.readouterr().err
    assert "pip install ./packages/cake-transformers" in err
    assert not (tmp_path / "report.json").exists()


def test_qwen3_job_is_bitwise_deterministic(tmp_path):
    from transformers import Qwen3ForCausalLM

    tiny = dict(TINY, model="qwen3")
    cfg = default_config("cpu", out=str(tmp_path), **tiny)
    assert cfg.moe_experts == 0  # dense
    result = run_job(cfg, progress=False)
    a, b, ref = result.runs
    assert isinstance(a.model.lm, Qwen3ForCausalLM)
    assert "forward" in vars(a.model.lm) and "forward" not in vars(ref.model.lm)
    assert result.identical and result.max_gap_torch < 1e-4
    rep = json.loads(write_report(result, tmp_path)[0].read_text())
    assert rep["model"] == "qwen3" and rep["config"]["model"]["model_type"] == "qwen3"
    assert rep["cake_families"] == list(HF_MODELS["qwen3"].families)


def test_qwen3_configs():
    big = TrainConfig(**HF_MODELS["qwen3"].cuda_defaults, device="cpu", model="qwen3")
    c = qwen3_config(big)
    assert (c.hidden_size, c.num_hidden_layers, c.head_dim) == (1024, 8, 64)
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        n = sum(p.numel() for p in Qwen3ForCausalLM(c).parameters())
    assert 90e6 < n < 110e6
    with pytest.raises(ValueError, match="dense"):
        TrainConfig(model="qwen3", moe_experts=4, moe_top_k=2).model_config()
