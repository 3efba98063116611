"""Fast unit tests of cake-tinylm: data selection, model shapes, cake-vs-torch parity, CLI."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from cake_tinylm import (
    ModelConfig,
    TrainConfig,
    batch_starts,
    build_model,
    get_batch,
    load_corpus,
    split_train_val,
    stdlib_files,
)
from cake_tinylm.cli import main

SMALL = ModelConfig(d_model=32, n_layers=2, n_heads=4, max_seq_len=16)


def test_stdlib_selection_is_deterministic_and_filtered():
    files = stdlib_files()
    assert files == stdlib_files()
    assert files == sorted(files)
    assert files and all(f.endswith(".py") for f in files)
    for f in files:
        parts = f.split("/")[:-1]
        assert not {"site-packages", "dist-packages", "test", "tests", "__pycache__"} & set(parts)
    a = load_corpus(max_bytes=50_000)
    b = load_corpus(max_bytes=50_000)
    assert a.n_bytes == 50_000 and a.data.dtype == torch.uint8
    assert torch.equal(a.data, b.data) and a.files == b.files
    assert a.files[0] == files[0]


def test_text_directory_and_file(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"world")
    (tmp_path / "a.txt").write_bytes(b"hello ")
    (tmp_path / ".hidden").write_bytes(b"nope")
    c = load_corpus(tmp_path, max_bytes=None)
    assert bytes(c.data.tolist()) == b"hello world" and c.files == ("a.txt", "b.txt")
    assert bytes(load_corpus(tmp_path / "b.txt", max_bytes=3).data.tolist()) == b"wor"
    with pytest.raises(FileNotFoundError):
        load_corpus(tmp_path / "missing")
    with pytest.raises(ValueError):
        load_corpus(tmp_path, max_bytes=0)


def test_split_and_batches_deterministic():
    data = torch.arange(1000, dtype=torch.int64).to(torch.uint8)
    train, val = split_train_val(data)
    assert val.numel() == 50 and train.numel() == 950
    s1 = batch_starts(train.numel(), 5, 3, 16, seed=7)
    s2 = batch_starts(train.numel(), 5, 3, 16, seed=7)
    assert s1.shape == (5, 3) and torch.equal(s1, s2)
    assert not torch.equal(s1, batch_starts(train.numel(), 5, 3, 16, seed=8))
    assert int(s1.min()) >= 0 and int(s1.max()) + 16 < train.numel()
    x, y = get_batch(train, s1[0], 16)
    assert x.shape == y.shape == (3, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError):
        batch_starts(10, 1, 1, 16, seed=0)


def test_forward_shapes_and_errors():
    torch.manual_seed(0)
    model = build_model(SMALL, "cake")
    idx = torch.randint(0, 256, (2, 16))
    logits, loss = model(idx, idx)
    assert logits is None  # fused head + loss: the logits are never materialized
    assert loss.shape == () and loss.dtype == torch.float32
    logits, loss = model(idx)
    assert logits.shape == (2, 16, 256) and logits.dtype == torch.float32 and loss is None
    logits, loss = model(idx[:, :5])
    assert logits.shape == (2, 5, 256) and loss is None
    ref_logits, ref_loss = build_model(SMALL, "torch")(idx, idx)
    assert ref_logits.shape == (2, 16, 256) and ref_loss.shape == ()
    with pytest.raises(ValueError):
        model(torch.randint(0, 256, (2, 17)))
    with pytest.raises(ValueError):
        model(idx[0])
    pos = torch.arange(16)[None]
    for bad, match in ((pos + 1, r"values in \[1, 16\]"), (pos - 1, r"values in \[-1, 14\]"),
                       (pos.int(), "int64"), (pos[:, :15], "int64"), (pos.expand(3, 16), "int64")):
        with pytest.raises(ValueError, match=match):
            model(idx, positions=bad)
    ok, _ = model(idx, positions=pos.expand(2, 16))
    assert torch.equal(ok, model(idx)[0])
    with pytest.raises(ValueError):
        ModelConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError):
        build_model(SMALL, "jax")


def test_cake_and_torch_models_match_from_same_weights():
    from cake_dense_projection_det_gemm import Linear
    from cake_lm_head_loss_det_train import LMHeadLoss
    from cake_rmsnorm_det_train import RMSNorm

    torch.manual_seed(0)
    cake = build_model(SMALL, "cake")
    ref = build_model(SMALL, "torch")
    assert cake.state_dict().keys() == ref.state_dict().keys()
    for k, v in ref.state_dict().items():
        assert cake.state_dict()[k].shape == v.shape, k
    ref.load_state_dict(cake.state_dict())
    # Every norm of the cake model is cake's RMSNorm (exact type), every torch one torch's.
    norms = [m for m in cake.modules() if "RMSNorm" in type(m).__name__]
    assert len(norms) == 2 * SMALL.n_layers + 1 and all(type(m) is RMSNorm for m in norms)
    assert all(type(m) is torch.nn.RMSNorm for m in ref.modules() if "RMSNorm" in type(m).__name__)
    # Every projection (qkv, proj, fc1, fc2) is cake's Linear; the head is cake's LMHeadLoss.
    linears = [n for n, m in cake.named_modules() if type(m) is Linear]
    assert len(linears) == 4 * SMALL.n_layers
    assert not [n for n, m in cake.named_modules() if isinstance(m, torch.nn.Linear)]
    assert type(cake.lm_head) is LMHeadLoss and cake.lm_head.weight.shape == (256, 32)
    ref_linears = [n for n, m in ref.named_modules() if type(m) is torch.nn.Linear]
    assert ref_linears == linears + ["lm_head"]
    kernel_pkgs = ("cake_rmsnorm_det_train", "cake_dense_projection_det_gemm",
                   "cake_lm_head_loss_det_train")
    assert not [m for m in ref.modules() if type(m).__module__.startswith(kernel_pkgs)]
    idx = torch.randint(0, 256, (2, 16))
    lc, _ = cake(idx)
    lr, _ = ref(idx)
    torch.testing.assert_close(lc, lr, rtol=1e-5, atol=1e-5)
    _, loss_c = cake(idx, idx)
    _, loss_r = ref(idx, idx)
    torch.testing.assert_close(loss_c, loss_r, rtol=1e-5, atol=1e-5)
    loss_c.backward()
    loss_r.backward()
    gc = dict(cake.named_parameters())
    for name, p in ref.named_parameters():
        torch.testing.assert_close(gc[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_train_config_validation():
    with pytest.raises(ValueError):
        TrainConfig(steps=0)
    with pytest.raises(ValueError):
        TrainConfig(dtype="float16")
    with pytest.raises(ValueError):
        TrainConfig(device="tpu")
    with pytest.raises(ValueError, match="cuda_graph"):
        TrainConfig(cuda_graph="yes")


def test_cuda_graph_option(tmp_path, capsys):
    """``--cuda-graph``: auto captures on CUDA only, off never, on refuses a CPU job up front
    (exit 2, before the corpus is read)."""
    from cake_tinylm.train import use_cuda_graph

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not use_cuda_graph(TrainConfig(), cpu)
    assert use_cuda_graph(TrainConfig(), cuda)
    assert not use_cuda_graph(TrainConfig(cuda_graph="off"), cuda)
    with pytest.raises(ValueError, match="--cuda-graph on needs a CUDA device"):
        use_cuda_graph(TrainConfig(cuda_graph="on"), cpu)
    assert main(["train", "--device", "cpu", "--cuda-graph", "on", "--text",
                 str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    assert "--cuda-graph on needs a CUDA device" in capsys.readouterr().err


def test_failed_capture_puts_the_run_back(monkeypatch):
    """A step that cannot be captured (here: the capture itself raises, as a host sync
    inside it would) propagates the error with the weights back at their values before the
    warm-up steps, the optimizer's state zeroed and no gradients (CUDA's stream calls stubbed
    so this runs on a CPU)."""
    import contextlib

    from cake_tinylm.train import _capture_step

    class _Stream:
        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def failing_graph(g):
        yield
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: None)
    monkeypatch.setattr(torch.cuda, "graph", failing_graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    torch.manual_seed(0)
    model = build_model(SMALL, "torch")
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def body(x, y):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        return loss

    x = torch.randint(0, 256, (2, 16))
    with pytest.raises(RuntimeError, match="capturing"):
        _capture_step(model, opt, body, x, x)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())
    assert opt.state and all(not v.any() for st in opt.state.values() for v in st.values())


def test_failed_capture_run_gives_the_eager_run_bits(monkeypatch):
    """train_once end to end where the capture fails as torch's does (an op inside the
    captured step raises, then the capture's exit raises its own error with that one as
    its context): the run warns, notes both errors, and its eager steps give the bits of a
    plain eager run (losses, final weights, validation loss), with the learning-rate
    warm-up inside the steps (CUDA's stream calls stubbed so this runs on a CPU)."""
    import contextlib

    import cake_tinylm.train as train_mod

    class _Stream:
        def wait_stream(self, other):
            pass

    capturing = []

    @contextlib.contextmanager
    def failing_graph(g):
        capturing.append(True)
        try:
            yield
        finally:
            capturing.clear()
            raise RuntimeError("CUDA error: operation failed due to a previous error during "
                               "capture\nCUDA kernel errors might be asynchronously reported")

    def refuse_in_capture(module, args):
        if capturing:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    cfg = TrainConfig(steps=4, batch_size=2, seq_len=16, warmup=2, device="cpu")
    data = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(1))
    data = data.to(torch.uint8)
    starts = batch_starts(data.numel(), cfg.steps, cfg.batch_size, cfg.seq_len, seed=3)
    val = batch_starts(data.numel(), 1, 2, cfg.seq_len, seed=4)[0]
    torch.manual_seed(0)
    init = build_model(SMALL, "torch").state_dict()

    def run(graph: bool):
        model = build_model(SMALL, "torch")
        model.load_state_dict(init)
        model.blocks[0].register_forward_pre_hook(refuse_in_capture)
        return model, train_mod.train_once("r", model, data, starts, cfg, val_data=data,
                                           val_starts=val, progress=False)

    eager_model, eager = run(False)
    monkeypatch.setattr(train_mod, "use_cuda_graph", lambda cfg, device: True)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: None)
    monkeypatch.setattr(torch.cuda, "graph", failing_graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    with pytest.warns(UserWarning, match="could not be captured"):
        fell_model, fell = run(True)
    assert not fell.cuda_graph and not eager.cuda_graph and eager.cuda_graph_note is None
    assert fell.cuda_graph_note.startswith(
        "RuntimeError: CUDA error: operation not permitted when stream is capturing; then "
        "RuntimeError: CUDA error: operation failed due to a previous error during capture")
    assert "\n" not in fell.cuda_graph_note
    assert torch.equal(fell.losses.view(torch.int32), eager.losses.view(torch.int32))
    assert fell.val_loss == eager.val_loss
    assert all(torch.equal(p, q) for p, q in zip(fell_model.parameters(),
                                                 eager_model.parameters(), strict=True))


def test_capture_failure_note_single_error():
    from cake_tinylm.train import _capture_failure_note

    assert _capture_failure_note(RuntimeError("boom\nmore")) == "RuntimeError: boom"
    try:
        try:
            raise ValueError("first")
        except ValueError as exc:
            raise RuntimeError("second") from exc
    except RuntimeError as exc:
        assert _capture_failure_note(exc) == "ValueError: first; then RuntimeError: second"


def test_cp_ranks_share_the_single_run_optimizer():
    """The context-parallel ranks build their AdamW and learning-rate warm-up with the
    single-process run's helpers (on CUDA: capturable, a device-tensor lr), so the CP job's
    loss gap is the split's; on a CPU the float lr of the eager job as before."""
    import inspect

    from cake_tinylm import cp
    from cake_tinylm.train import _make_optimizer, _set_lr

    src = inspect.getsource(cp._worker)
    assert "_make_optimizer(model, cfg)" in src and "_set_lr(opt, cfg, step)" in src
    assert "torch.optim" not in src
    cfg = TrainConfig(lr=1e-2, warmup=4, weight_decay=0.05)
    opt = _make_optimizer(build_model(SMALL, "torch"), cfg)
    g = opt.param_groups[0]
    assert g["lr"] == 1e-2 and not g["capturable"] and g["betas"] == (0.9, 0.95)
    assert g["weight_decay"] == 0.05
    _set_lr(opt, cfg, 0)
    assert g["lr"] == 1e-2 / 4
    _set_lr(opt, cfg, 9)
    assert g["lr"] == 1e-2


def test_graph_status_in_summaries():
    """The job summary names the graphed runs (not "each run" when one fell back) and the
    fallback's reason; the CP summary and report_cp.json say whether the single-process
    run was graphed (--cuda-graph covers that run only; the CP runs are eager)."""
    import json

    from cake_tinylm.cp import CPConfig, CPJobResult, CPRunResult
    from cake_tinylm.report import format_summary
    from cake_tinylm.train import JobResult, RunResult

    cfg = TrainConfig(mixer="gdn")
    losses = torch.rand(3, generator=torch.Generator().manual_seed(5)) + 1.0

    def run(name, graph, note=None):
        return RunResult(name, "cake", losses, 1.5, 2.0, 100.0, torch.nn.Linear(1, 1),
                         cuda_graph=graph, cuda_graph_note=note)

    job = JobResult(cfg, cfg.model_config(), "cuda", "GPU", {}, [
        run("cake-a", True), run("cake-b", True), run("torch", False, "RuntimeError: x")],
        True, True, 0.0, 1.0)
    text = format_summary(job)
    assert "(--cuda-graph): cake-a, cake-b;" in text and "each run" not in text
    assert "torch: not captured, eager steps (RuntimeError: x)" in text
    cp_run = CPRunResult("cp-a", losses, 1.0, 10.0, {}, ["h", "h"])
    for graph, note, expect in ((True, None, "single-process steps replayed from one CUDA "
                                 "graph"), (False, "RuntimeError: y", "single-process step "
                                 "not captured, eager steps: RuntimeError: y"),
                                (False, None, None)):
        res = CPJobResult(cfg, cfg.model_config(), CPConfig(2), "cuda", "GPU",
                          run("single", graph, note), [cp_run, cp_run], 1.5, True, True,
                          True, 0.0, 1.0)
        text = res.summary()
        assert (expect in text) if expect else "CUDA graph" not in text and "captured" \
            not in text
        single = json.loads(json.dumps(res.to_dict()))["single"]
        assert single["cuda_graph"] is graph and single["cuda_graph_note"] == note


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_job_gives_the_eager_bits(tmp_path):
    """CUDA: a job whose steps replay one captured graph trains to the eager job's bits (the
    same losses at every step and the same final weights) in both cake runs."""
    from cake_tinylm import run_job

    def job(mode):
        cfg = TrainConfig(steps=6, batch_size=2, seq_len=64, d_model=64, n_layers=2, n_heads=4,
                          bytes=60_000, device="cuda", out=str(tmp_path / mode), val_windows=4,
                          warmup=3, cuda_graph=mode)
        return run_job(cfg, progress=False)

    eager, graphed = job("off"), job("on")
    assert graphed.identical and all(r.cuda_graph for r in graphed.runs)
    assert not any(r.cuda_graph for r in eager.runs)
    for e, g in zip(eager.runs[:2], graphed.runs[:2], strict=True):
        assert torch.equal(e.losses.view(torch.int32), g.losses.view(torch.int32)), e.name
    assert all(torch.equal(p, q) for p, q in zip(eager.runs[0].model.parameters(),
                                                 graphed.runs[0].model.parameters(),
                                                 strict=True))


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for opt in (
        "--steps",
        "--batch-size",
        "--seq-len",
        "--d-model",
        "--n-layers",
        "--n-heads",
        "--lr",
        "--seed",
        "--dtype",
        "--out",
        "--text",
        "--bytes",
        "--device",
        "--mixer",
        "--cuda-graph",
    ):
        assert opt in out
    assert "{attention,gdn,kda}" in out
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "cake_tinylm", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "train" in proc.stdout


def test_cli_bad_arguments_exit_2(tmp_path, capsys):
    assert main(["train", "--d-model", "30", "--n-heads", "4", "--out", str(tmp_path)]) == 2
    assert main(["train", "--text", str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    assert "error" in capsys.readouterr().err


def test_cli_out_not_a_directory_exits_2_before_training(tmp_path, monkeypatch, capsys):
    # exit 1 means "the cake runs differ": a bad --out must not train, then exit 1
    import cake_tinylm.train as train_mod

    monkeypatch.setattr(train_mod, "run_job", lambda *a, **k: pytest.fail("trained"))
    out = tmp_path / "report"
    out.write_text("a file, not a directory")
    assert main(["train", "--out", str(out), "--no-progress"]) == 2
    assert "--out" in capsys.readouterr().err


def test_empty_text_file_named_in_the_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty.txt is empty"):
        load_corpus(empty)


def test_identity_checks_can_fail():
    from cake_tinylm.train import _same_bits, _same_weights

    a = torch.tensor([1.0, 2.0])
    b = torch.nextafter(a, torch.tensor(3.0))  # one ulp away
    assert _same_bits(a, a.clone()) and not _same_bits(a, b)
    nan = torch.tensor([float("nan")])
    assert _same_bits(nan, nan.clone())  # bits, not ==
    torch.manual_seed(0)
    m1 = build_model(SMALL, "torch")
    m2 = build_model(SMALL, "torch")
    m2.load_state_dict(m1.state_dict())
    assert _same_weights(m1, m2)
    with torch.no_grad():
        m2.norm_f.weight[0] = torch.nextafter(m2.norm_f.weight[0], torch.tensor(2.0))
    assert not _same_weights(m1, m2)


def test_cli_train_exit_code_follows_verdict(tmp_path, monkeypatch, capsys):
    import cake_tinylm.train as train_mod

    args = [
        "train",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--seq-len",
        "8",
        "--d-model",
        "16",
        "--n-layers",
        "1",
        "--n-heads",
        "2",
        "--bytes",
        "4000",
        "--device",
        "cpu",
        "--no-progress",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    assert (tmp_path / "report.json").exists() and (tmp_path / "loss.png").exists()
    printed = capsys.readouterr().out
    assert "bitwise identical: yes" in printed
    assert "Triton's interpreter" in printed  # CPU tokens/s are no speed measure
    monkeypatch.setattr(train_mod, "_same_weights", lambda a, b: False)
    assert main(args) == 1
    assert "final weights identical:  NO" in capsys.readouterr().out


# --------------------------------------------------------------------------- --mixer gdn
GDN_SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=16, mixer="gdn")


def _fla_layer_checks(cake, ref, layer_cls, keys):
    """The mixer of both builds is the family's layer (FLA's keys), the cake one on cake's
    modules, the torch one on plain torch with no kernel package's module."""
    from cake_causal_conv1d_det_train import ShortConvolution
    from cake_core.layer_utils import RMSNormGatedTorch, ShortConvolutionTorch
    from cake_dense_projection_det_gemm import Linear
    from cake_rmsnorm_silu_gate_det_train import RMSNormGated

    mixer, ref_mixer = cake.blocks[0].mixer, ref.blocks[0].mixer
    assert isinstance(mixer, layer_cls) and isinstance(ref_mixer, layer_cls)
    assert (mixer.impl, ref_mixer.impl) == ("cake", "torch")
    assert sorted(mixer.state_dict()) == sorted(keys)
    assert {type(m) for m in mixer.modules() if "Linear" in type(m).__name__} == {Linear}
    assert {type(m) for m in ref_mixer.modules() if "Linear" in type(m).__name__} == {
        torch.nn.Linear}
    assert type(mixer.q_conv1d) is ShortConvolution and type(mixer.o_norm) is RMSNormGated
    assert type(ref_mixer.q_conv1d) is ShortConvolutionTorch
    assert type(ref_mixer.o_norm) is RMSNormGatedTorch
    kernel_pkgs = ("cake_rmsnorm_det_train", "cake_dense_projection_det_gemm",
                   "cake_lm_head_loss_det_train", "cake_causal_conv1d_det_train",
                   "cake_rmsnorm_silu_gate_det_train", "cake_gdn_det_train",
                   "cake_kda_det_train")
    assert not [m for m in ref.modules() if type(m).__module__.startswith(kernel_pkgs)]
    # heads of d_model // n_heads for q, k and v; FLA's short conv of 4, no bias
    assert mixer.q_proj.weight.shape == mixer.v_proj.weight.shape == (32, 32)
    assert mixer.q_conv1d.weight.shape == (32, 1, 4) and mixer.o_norm.weight.shape == (16,)
    assert float(mixer.q_conv1d.weight.detach().abs().max()) > 0.1  # own init, not N(0, .02)


def _cake_torch_parity(cake, ref):
    idx = torch.randint(0, 256, (2, 16))
    _, loss_c = cake(idx, idx)
    _, loss_r = ref(idx, idx)
    torch.testing.assert_close(loss_c, loss_r, rtol=1e-5, atol=1e-5)
    loss_c.backward()
    loss_r.backward()
    gc = dict(cake.named_parameters())
    for name, p in ref.named_parameters():
        assert bool(p.grad.isfinite().all()), name
        torch.testing.assert_close(gc[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


GDN_KEYS = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "a_proj.weight",
            "b_proj.weight", "A_log", "dt_bias", "q_conv1d.weight", "k_conv1d.weight",
            "v_conv1d.weight", "g_proj.weight", "o_norm.weight", "o_proj.weight"]


def test_gdn_mixer_cake_and_torch_match_from_same_weights():
    from cake_gdn_det_train import GatedDeltaNet

    assert ModelConfig().mixer == "attention" and TrainConfig().mixer == "attention"
    with pytest.raises(ValueError):
        ModelConfig(mixer="rwkv")
    torch.manual_seed(0)
    cake = build_model(GDN_SMALL, "cake")
    ref = build_model(GDN_SMALL, "torch")
    assert cake.state_dict().keys() == ref.state_dict().keys()
    ref.load_state_dict(cake.state_dict())
    _fla_layer_checks(cake, ref, GatedDeltaNet, GDN_KEYS)
    mixer = cake.blocks[0].mixer
    assert mixer.a_proj.weight.shape == (2, 32) and mixer.A_log.shape == mixer.dt_bias.shape == (2,)
    assert bool((mixer.dt_bias != 0).all())  # FLA's init survives TinyLM's zero-bias init
    _cake_torch_parity(cake, ref)


def test_gdn_mixer_short_job_is_bitwise_deterministic(tmp_path):
    from cake_tinylm import run_job

    cfg = TrainConfig(
        steps=4, batch_size=2, seq_len=16, d_model=32, n_layers=1, n_heads=2, lr=3e-3,
        bytes=20_000, device="cpu", out=str(tmp_path), val_windows=4, mixer="gdn",
    )
    result = run_job(cfg, progress=False)
    a, b, ref = result.runs
    assert result.model_config.mixer == "gdn"
    assert type(a.model.blocks[0].mixer).__name__ == "GatedDeltaNet"
    assert torch.equal(a.losses.view(torch.int32), b.losses.view(torch.int32))
    assert result.losses_identical and result.weights_identical and result.identical
    assert result.max_gap_torch < 1e-4
    assert abs(a.val_loss - ref.val_loss) < 1e-4


# --------------------------------------------------------------------------- --mixer kda
KDA_SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=16, mixer="kda")


KDA_KEYS = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "q_conv1d.weight",
            "k_conv1d.weight", "v_conv1d.weight", "f_proj.0.weight", "f_proj.1.weight",
            "b_proj.weight", "A_log", "dt_bias", "g_proj.0.weight", "g_proj.1.weight",
            "g_proj.1.bias", "o_norm.weight", "o_proj.weight"]


def test_kda_mixer_cake_and_torch_match_from_same_weights():
    from cake_kda_det_train import KimiDeltaAttention

    torch.manual_seed(0)
    cake = build_model(KDA_SMALL, "cake")
    ref = build_model(KDA_SMALL, "torch")
    assert cake.state_dict().keys() == ref.state_dict().keys()
    ref.load_state_dict(cake.state_dict())
    _fla_layer_checks(cake, ref, KimiDeltaAttention, KDA_KEYS)
    mixer = cake.blocks[0].mixer
    # FLA's low-rank gate projections through K = 16 channels; sigmoid-gated output norm
    assert mixer.f_proj[0].weight.shape == (16, 32) and mixer.f_proj[1].weight.shape == (32, 16)
    assert mixer.g_proj[1].bias.shape == (32,) and mixer.o_norm.activation == "sigmoid"
    a = mixer.A_log.detach().exp()
    assert mixer.A_log.shape == (2,) and bool(((a >= 1) & (a <= 16)).all())  # log U(1, 16)
    assert mixer.dt_bias.shape == (32,) and not mixer.dt_bias.detach().any()
    _cake_torch_parity(cake, ref)


def test_kda_mixer_short_job_is_bitwise_deterministic(tmp_path):
    import json

    from cake_tinylm import run_job, write_report

    cfg = TrainConfig(
        steps=4, batch_size=2, seq_len=16, d_model=32, n_layers=1, n_heads=2, lr=3e-3,
        bytes=20_000, device="cpu", out=str(tmp_path), val_windows=4, mixer="kda",
    )
    result = run_job(cfg, progress=False)
    a, b, ref = result.runs
    assert result.model_config.mixer == "kda"
    assert type(a.model.blocks[0].mixer).__name__ == "KimiDeltaAttention"
    assert bool(a.losses.isfinite().all())
    assert torch.equal(a.losses.view(torch.int32), b.losses.view(torch.int32))
    assert result.losses_identical and result.weights_identical and result.identical
    assert result.max_gap_torch < 1e-4
    assert abs(a.val_loss - ref.val_loss) < 1e-4
    json_path, _ = write_report(result, tmp_path)
    report = json.loads(json_path.read_text())
    assert report["config"]["model"]["mixer"] == "kda"
    assert {"cake-kda-det-train", "cake-causal-conv1d-det-train",
            "cake-rmsnorm-silu-gate-det-train"} <= set(report["cake_families"])
    assert "cake-gdn-det-train" not in report["cake_families"]
    assert report["versions"]["cake-kda-det-train"] is not None


def test_cp_config_and_refusals(tmp_path, capsys):
    """--cp: bad split settings and the attention mixer are refused before any process
    starts (exit code 2 from the CLI)."""
    from cake_tinylm.cp import CPConfig, train_cp

    for bad in (dict(world_size=0), dict(world_size=True), dict(world_size=2, layout="x"),
                dict(world_size=2, exchange="x")):
        with pytest.raises(ValueError):
            CPConfig(**bad)
    cfg = TrainConfig(steps=1, batch_size=1, seq_len=4, d_model=32, n_layers=1, n_heads=4,
                      device="cpu", mixer="gdn")
    starts = torch.zeros(1, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="without tokens"):
        train_cp("x", cfg, CPConfig(5), {}, torch.zeros(100, dtype=torch.uint8), starts)
    # zigzag leaves rank 2 of 4 empty with 5 tokens: refused before the single-process
    # run (run_cp_job checks first; no corpus is even loaded)
    from cake_tinylm.cp import check_cp, run_cp_job

    five = TrainConfig(steps=1, batch_size=1, seq_len=5, d_model=32, n_layers=1, n_heads=4,
                       device="cpu", mixer="gdn", text=str(tmp_path / "missing"))
    check_cp(five, CPConfig(4, "contiguous"), 1)
    with pytest.raises(ValueError, match=r"per rank: \[1, 2, 0, 2\]"):
        run_cp_job(five, CPConfig(4, "zigzag"))
    assert main(["train", "--cp", "2", "--mixer", "attention", "--steps", "1",
                 "--out", str(tmp_path), "--no-progress"]) == 2
    assert "--mixer gdn or kda" in capsys.readouterr().err
    assert main(["train", "--cp", "0", "--out", str(tmp_path), "--no-progress"]) == 2


def test_positions_argument_matches_default():
    """forward(positions=arange(T)) gives the default forward's bits (the CP route feeds
    each token's position in its window)."""
    torch.manual_seed(0)
    model = build_model(SMALL, "cake")
    idx = torch.randint(0, 256, (2, 8))
    a, _ = model(idx)
    b, _ = model(idx, positions=torch.arange(8)[None].expand(2, 8))
    assert torch.equal(a, b)


# --------------------------------------------------------------------------- --moe E,k
MOE_SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=16, moe_experts=4,
                        moe_top_k=2)


def test_moe_cake_and_torch_match_from_same_weights():
    from cake_moe_grouped_det_gemm import MoEFeedForward
    from cake_tinylm.model import MLP, MoEFeedForwardTorch

    assert ModelConfig().moe_experts == 0 and TrainConfig().moe_experts == 0
    assert type(build_model(SMALL, "cake").blocks[0].mlp) is MLP  # default: dense
    for bad in (dict(moe_experts=4, moe_top_k=0), dict(moe_experts=2, moe_top_k=3),
                dict(moe_experts=0, moe_top_k=1), dict(moe_experts=-1)):
        with pytest.raises(ValueError, match="moe"):
            ModelConfig(**bad)
    torch.manual_seed(0)
    cake = build_model(MOE_SMALL, "cake")
    ref = build_model(MOE_SMALL, "torch")
    assert cake.state_dict().keys() == ref.state_dict().keys()
    ref.load_state_dict(cake.state_dict())
    mlp = cake.blocks[0].mlp
    assert type(mlp) is MoEFeedForward and type(ref.blocks[0].mlp) is MoEFeedForwardTorch
    assert (mlp.num_experts, mlp.top_k, mlp.d_ff) == (4, 2, 128)
    assert mlp.w_gate_up.shape == (4, 256, 32) and mlp.w_down.shape == (4, 32, 128)
    # GPT-2 init reaches the stacked expert weights; w_down is a residual projection
    assert abs(float(mlp.w_gate_up.detach().std()) - 0.02) < 2e-3
    assert float(mlp.w_down.detach().std()) < 0.02
    idx = torch.randint(0, 256, (2, 16))
    _, loss_c = cake(idx, idx)
    _, loss_r = ref(idx, idx)
    torch.testing.assert_close(loss_c, loss_r, rtol=1e-5, atol=1e-5)
    loss_c.backward()
    loss_r.backward()
    gc = dict(cake.named_parameters())
    for name, p in ref.named_parameters():
        torch.testing.assert_close(gc[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    # the training loss holds the load-balancing loss (about its coefficient, 0.01); eval
    # mode scores the cross entropy alone
    cake.eval()
    with torch.no_grad():
        _, ce = cake(idx, idx)
    assert 0.005 < float(loss_c.detach() - ce) < 0.02


def test_moe_short_job_is_bitwise_deterministic(tmp_path, capsys):
    import json

    from cake_tinylm import run_job, write_report

    cfg = TrainConfig(
        steps=3, batch_size=2, seq_len=16, d_model=32, n_layers=1, n_heads=2, lr=3e-3,
        bytes=20_000, device="cpu", out=str(tmp_path), val_windows=4, moe_experts=4,
        moe_top_k=2,
    )
    result = run_job(cfg, progress=False)
    a, b, ref = result.runs
    assert result.model_config.moe_experts == 4 and result.model_config.moe_top_k == 2
    assert type(a.model.blocks[0].mlp).__name__ == "MoEFeedForward"
    assert bool(a.losses.isfinite().all())
    assert torch.equal(a.losses.view(torch.int32), b.losses.view(torch.int32))
    assert result.losses_identical and result.weights_identical and result.identical
    assert result.max_gap_torch < 1e-4
    json_path, _ = write_report(result, tmp_path)
    report = json.loads(json_path.read_text())
    assert report["config"]["model"]["moe_experts"] == 4
    assert "cake-moe-grouped-det-gemm" in report["cake_families"]


def test_moe_cli(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0 and "--moe E,k" in capsys.readouterr().out
    for bad in ("4", "4,0", "2,3", "a,b"):
        with pytest.raises(SystemExit) as e:
            main(["train", "--moe", bad, "--out", str(tmp_path)])
        assert e.value.code == 2
    assert main(["train", "--moe", "4,2", "--cp", "2", "--mixer", "gdn", "--steps", "1",
                 "--out", str(tmp_path), "--no-progress"]) == 2
    assert "--cp with --moe" in capsys.readouterr().err


# --------------------------------------------------------------------------- --mhc N
MHC_SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=16, mhc=4)


def test_mhc_default_off_and_bad_values(capsys, tmp_path):
    assert ModelConfig().mhc == 0 and TrainConfig().mhc == 0
    torch.manual_seed(0)
    assert not [n for n in build_model(SMALL, "cake").state_dict() if "mhc" in n]
    for bad in (1, 3, 16, -1):
        with pytest.raises(ValueError, match="mhc"):
            ModelConfig(mhc=bad)
    with pytest.raises(ValueError, match="mhc and moe together"):
        ModelConfig(mhc=2, moe_experts=4, moe_top_k=2)
    assert main(["train", "--mhc", "3", "--steps", "1", "--out", str(tmp_path)]) == 2
    assert "mhc" in capsys.readouterr().err


def test_mhc_cake_and_torch_match_from_same_weights():
    from cake_mhc_det_train import HyperConnection
    from cake_tinylm.model import HyperConnectionTorch

    torch.manual_seed(0)
    cake = build_model(MHC_SMALL, "cake")
    ref = build_model(MHC_SMALL, "torch")
    assert cake.state_dict().keys() == ref.state_dict().keys()
    hc = cake.blocks[0].mhc_mixer
    assert type(hc) is HyperConnection and type(ref.blocks[0].mhc_mlp) is HyperConnectionTorch
    assert hc.phi.shape == (4 * 32, 24) and hc.alpha.shape == (3,)
    assert abs(float(hc.bias.detach()[0]) - math.log(1 / 3)) < 1e-6  # own init kept
    # the branch's modules stay where they were: no duplicate parameters
    assert {n for n in cake.state_dict() if ".mhc_" in n} == {
        f"blocks.0.mhc_{s}.{p}" for s in ("mixer", "mlp") for p in ("phi", "alpha", "bias")}
    with torch.no_grad():  # make the coefficients depend on the tokens
        for m in (cake, ref):
            for blk in m.blocks:
                for h in (blk.mhc_mixer, blk.mhc_mlp):
                    h.alpha.fill_(0.5)
    ref.load_state_dict(cake.state_dict())
    idx = torch.randint(0, 256, (2, 16))
    _, loss_c = cake(idx, idx)
    _, loss_r = ref(idx, idx)
    torch.testing.assert_close(loss_c, loss_r, rtol=1e-5, atol=1e-5)
    loss_c.backward()
    loss_r.backward()
    gc = dict(cake.named_parameters())
    for name, p in ref.named_parameters():
        torch.testing.assert_close(gc[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_mhc_short_job_is_bitwise_deterministic(tmp_path):
    from cake_tinylm import run_job

    cfg = TrainConfig(
        steps=3, batch_size=2, seq_len=16, d_model=32, n_layers=1, n_heads=2, lr=3e-3,
        bytes=20_000, device="cpu", out=str(tmp_path), val_windows=4, mhc=2,
    )
    result = run_job(cfg, progress=False)
    a, b, ref = result.runs
    assert result.model_config.mhc == 2
    assert type(a.model.blocks[0].mhc_mixer).__name__ == "HyperConnection"
    assert result.losses_identical and result.weights_identical and result.identical
    assert result.max_gap_torch < 1e-4
