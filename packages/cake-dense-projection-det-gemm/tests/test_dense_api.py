"""The Linear drop-in, plans, workspaces, torch.compile, manifest."""

import dataclasses

import pytest
import torch
from cake_core.compile import plan_from_op_fields, plan_to_op_fields
from cake_core.testing import bitwise_equal, randn
from cake_core.triton_utils import default_device
from cake_dense_projection_det_gemm import (
    DenseProjectionDetPlan,
    DenseProjectionDetWorkspace,
    Linear,
    dense_projection_det,
    make_plan,
)

DEV = default_device()


@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(bias):
    torch.manual_seed(0)
    ref = torch.nn.Linear(40, 24, bias=bias, device=DEV)
    torch.manual_seed(0)
    ours = Linear(40, 24, bias=bias, device=DEV)
    # same init as torch.nn.Linear.reset_parameters, draw for draw
    assert bitwise_equal(ours.weight, ref.weight)
    assert list(ours.state_dict()) == list(ref.state_dict()) == \
        (["weight", "bias"] if bias else ["weight"])
    with torch.no_grad():
        ref.weight.normal_()
    ours.load_state_dict(ref.state_dict())
    ref.load_state_dict(ours.state_dict())
    x = randn((3, 5, 40), torch.float32, DEV, seed=1).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y, y2 = ours(x), ref(x2)
    torch.testing.assert_close(y, y2, rtol=1e-5, atol=1e-5)
    y.square().sum().backward()
    y2.square().sum().backward()
    # two fp32 GEMMs that sum in other orders (cake's kernel vs cuBLAS on a GPU): values
    # near 60 after cancellation differ by a few fp32 ulps of the summands
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-4)
    if bias:
        torch.testing.assert_close(ours.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-4)
    v = randn((40,), torch.float32, DEV, seed=2)  # 1-D input, as torch accepts
    torch.testing.assert_close(ours(v), ref(v), rtol=1e-5, atol=1e-5)
    assert "in_features=40, out_features=24" in repr(ours)


def test_linear_meta_init_and_dtype():
    with torch.device("meta"):
        m = Linear(16, 8, dtype=torch.bfloat16)
    m.to_empty(device=DEV)
    m.reset_parameters()
    assert m.weight.dtype == torch.bfloat16 and m.bias.shape == (8,)
    assert m(randn((2, 16), torch.bfloat16, DEV)).dtype == torch.bfloat16


def test_linear_accumulate_main_grad():
    m = Linear(24, 12, device=DEV, accumulate_main_grad=True)
    ref = torch.nn.Linear(24, 12, device=DEV)
    ref.load_state_dict(m.state_dict())
    x = randn((300, 24), torch.float32, DEV, seed=3)
    for _ in range(2):  # two micro-batches accumulate
        m(x).sum().backward()
        ref(x).sum().backward()
    assert m.weight.grad is None and m.weight.main_grad.dtype == torch.float32
    torch.testing.assert_close(m.weight.main_grad, ref.weight.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(m.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-4)
    mg = m.weight.main_grad
    m(x).sum().backward()
    assert m.weight.main_grad is mg  # kept, added to in place
    m2 = Linear(24, 12, device=DEV, accumulate_main_grad=True)
    with torch.no_grad():
        m2(x)
    assert getattr(m2.weight, "main_grad", None) is None  # no graph, nothing allocated


def test_linear_main_grad_under_compile_needs_the_buffer_first():
    torch._dynamo.reset()
    m = Linear(24, 12, device=DEV, accumulate_main_grad=True)
    x = randn((30, 24), torch.float32, DEV, seed=3)
    f = torch.compile(m, fullgraph=True, backend="aot_eager" if DEV.type == "cpu" else "inductor")
    with pytest.raises(Exception, match="main_grad must exist before"):
        f(x)
    m.weight.main_grad = torch.zeros(12, 24, device=DEV)
    f(x).sum().backward()
    ref = torch.zeros(12, 24, device=DEV)
    dense_projection_det(x, m.weight.detach().requires_grad_(), m.bias, main_grad=ref).sum() \
        .backward()
    assert torch.equal(m.weight.main_grad, ref)


def test_torch_compile_fullgraph_same_values():
    torch._dynamo.reset()
    model = torch.nn.Sequential(Linear(48, 64), torch.nn.ReLU(), Linear(64, 8)).to(DEV)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager" if DEV.type == "cpu"
                             else "inductor")
    x = randn((10, 48), torch.float32, DEV, seed=3)
    y_eager = model(x)
    y_eager.square().sum().backward()
    g_eager = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    y_comp = compiled(x)
    y_comp.square().sum().backward()
    assert bitwise_equal(y_comp, y_eager)
    for a, p in zip(g_eager, model.parameters(), strict=True):
        assert bitwise_equal(p.grad, a)


def test_torch_compile_main_grad_and_split():
    """The custom-op route mutates main_grad and uses a split plan like the eager route."""
    torch._dynamo.reset()
    x = randn((700, 20), torch.float32, DEV, seed=4)
    w = randn((6, 20), torch.float32, DEV, seed=5)
    b = randn((6,), torch.float32, DEV, seed=6)
    plan = make_plan(700, 6, 20, torch.float32, DEV)
    assert plan.wgrad_splits > 1 or DEV.type == "cuda"

    def f(x, w, b, mg):
        return dense_projection_det(x, w, b, main_grad=mg).square().sum()

    outs = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager" if DEV.type == "cpu"
                                else "inductor")):
        ww, bb = w.clone().requires_grad_(), b.clone().requires_grad_()
        mg = torch.ones(6, 20, device=DEV)
        fn(x, ww, bb, mg).backward()
        assert ww.grad is None
        outs.append((mg, bb.grad))
    assert bitwise_equal(outs[0][0], outs[1][0]) and bitwise_equal(outs[0][1], outs[1][1])


def test_plan_rules_and_roundtrip():
    p = make_plan(1000, 33, 96, torch.bfloat16, DEV)
    assert (p.out_features, p.in_features) == (33, 96) and p.mode.value == "det"
    assert make_plan(1000, 33, 96, torch.bfloat16, DEV) is p  # rule, cached
    assert p.allow_tf32 == 0 and p.cublas_fwd_dgrad == int(DEV.type == "cuda")
    assert p.fp32_dots == 1  # exact fp32 products (bf16 inputs: unused)
    assert DenseProjectionDetPlan.from_dict(p.to_dict()) == p
    assert plan_from_op_fields(DenseProjectionDetPlan, plan_to_op_fields(p)) == p
    if DEV.type == "cpu":
        assert p.wgrad_splits == 4  # few N×K tiles, many tokens
        # interpreter tiles follow the dims: next power of two in [16, 256]
        assert (p.block_m, p.block_n, p.block_k) == (256, 128, 128)
        assert (p.wgrad_block_m, p.wgrad_block_n, p.wgrad_block_k) == (128, 128, 128)
        small = make_plan(17, 7, 33, torch.float32, DEV)
        assert (small.block_m, small.block_n, small.block_k, small.wgrad_block_k) == \
            (32, 64, 64, 32)
        assert make_plan(100, 33, 96, torch.bfloat16, DEV).wgrad_splits == 1  # few tokens
        assert make_plan(4096, 512, 512, torch.bfloat16, DEV).wgrad_splits == 1  # many tiles


def test_cuda_plan_rule_on_an_h200_sized_device(monkeypatch):
    """The documented rule for 132 SMs, evaluated without a GPU."""
    import cake_dense_projection_det_gemm.plan as plan_mod

    monkeypatch.setattr(plan_mod, "sm_count", lambda device: 132)
    monkeypatch.setattr(plan_mod, "cuda_capability", lambda device: (9, 0))
    cuda = torch.device("cuda", 0)
    big = plan_mod._rule(16384, 4096, 4096, torch.bfloat16, cuda)
    assert (big.block_m, big.block_n, big.block_k, big.num_warps) == (128, 256, 64, 8)
    assert big.wgrad_splits == 1 and big.cublas_fwd_dgrad == 1
    assert (big.wgrad_block_m, big.wgrad_block_n, big.wgrad_block_k) == (128, 256, 64)
    assert big.wgrad_tma == 1 and big.wgrad_num_stages == 4
    thin = plan_mod._rule(4096, 128, 8192, torch.bfloat16, cuda)
    assert thin.wgrad_splits == 1  # 64 wgrad tiles, but 4096 tokens make one slice
    assert (thin.wgrad_block_m, thin.wgrad_block_n, thin.wgrad_block_k) == (64, 128, 128)
    assert (thin.wgrad_num_warps, thin.wgrad_num_stages, thin.wgrad_tma) == (4, 4, 1)
    assert plan_mod._rule(65536, 128, 8192, torch.bfloat16, cuda).wgrad_splits == 1
    monkeypatch.setattr(plan_mod, "cuda_capability", lambda device: (8, 0))  # no TMA
    thin = plan_mod._rule(4096, 128, 8192, torch.bfloat16, cuda)
    assert (thin.wgrad_block_m, thin.wgrad_block_n, thin.wgrad_tma) == (128, 128, 0)
    assert plan_mod._rule(65536, 128, 8192, torch.bfloat16, cuda).wgrad_splits == 2
    fp32 = plan_mod._rule(16384, 4096, 4096, torch.float32, cuda)
    assert fp32.block_k == 32 and fp32.cublas_fwd_dgrad == 0 and fp32.wgrad_block_n == 128
    assert fp32.fp32_dots == 3  # "bf16x6" on bf16 tensor cores
    monkeypatch.setattr(plan_mod, "cuda_capability", lambda device: (9, 0))
    fp32 = plan_mod._rule(16384, 512, 2048, torch.float32, cuda)  # the tinylm job's fc2
    assert (fp32.block_m, fp32.block_n, fp32.block_k, fp32.num_warps, fp32.num_stages) == \
        (128, 128, 64, 8, 3)
    assert (fp32.wgrad_block_k, fp32.fp32_dots, fp32.wgrad_tma) == (64, 3, 0)
    monkeypatch.setattr(plan_mod, "cuda_capability", lambda device: (7, 0))  # no bf16 MMA
    fp32 = plan_mod._rule(16384, 512, 2048, torch.float32, cuda)
    assert (fp32.block_k, fp32.fp32_dots) == (32, 1)


def test_cuda_fp32_rule_deep_k_only_where_shared_memory_holds_it(monkeypatch):
    """64-deep fp32 K steps need 128-176 KiB of shared memory at 128x128 tiles (3 stages;
    offline sm_90 / sm_120 builds): Hopper and datacenter Blackwell (227 KiB per block) take them;
    consumer Blackwell (compute capability 12.x, 99 KiB per block) keeps 32-deep steps and
    "bf16x6" products."""
    import cake_dense_projection_det_gemm.plan as plan_mod

    monkeypatch.setattr(plan_mod, "sm_count", lambda device: 132)
    cuda = torch.device("cuda", 0)
    for cap, bk in (((9, 0), 64), ((10, 0), 64), ((12, 0), 32), ((12, 1), 32), ((8, 9), 32)):
        monkeypatch.setattr(plan_mod, "cuda_capability", lambda device, cap=cap: cap)
        for M, N, K in ((16384, 512, 2048), (256, 40, 96)):  # 128x128 and 64x128 tiles
            fp32 = plan_mod._rule(M, N, K, torch.float32, cuda)
            assert (fp32.block_k, fp32.wgrad_block_k, fp32.fp32_dots) == (bk, bk, 3), cap


def test_plan_validation():
    good = make_plan(64, 8, 16, torch.float32, DEV).to_dict()
    for field, bad, msg in (("block_m", 24, "power of two"), ("block_k", 8, "power of two"),
                            ("wgrad_splits", 0, "wgrad_splits"),
                            ("wgrad_splits", 17, "wgrad_splits"),
                            ("allow_tf32", 2, "allow_tf32"), ("num_warps", 3, "num_warps"),
                            ("fp32_dots", 4, "fp32_dots"), ("fp32_dots", -1, "fp32_dots"),
                            ("out_features", 0, "out_features"), ("block_n", 64.0, "block_n"),
                            ("cublas_fwd_dgrad", True, "cublas_fwd_dgrad")):
        with pytest.raises(ValueError, match=msg):
            DenseProjectionDetPlan.from_dict({**good, field: bad})
    for args, msg in (((-1, 8, 16), "M"), ((4, 0, 16), "N"), ((4, 8, True), "K")):
        with pytest.raises(ValueError, match=msg):
            make_plan(*args, torch.float32, DEV)
    with pytest.raises(ValueError, match="dtype"):
        make_plan(4, 8, 16, torch.float64, DEV)
    with pytest.raises(ValueError, match="device"):
        make_plan(4, 8, 16, torch.float32, "nope")
    if not torch.cuda.is_available():  # a CUDA rule reads the device: refused, not asserted
        with pytest.raises(ValueError, match="CUDA is not available"):
            make_plan(4, 8, 16, torch.bfloat16, "cuda")
    import numpy as np

    assert make_plan(np.int64(64), 8, 16, torch.float32, DEV) == DenseProjectionDetPlan(**{
        k: v for k, v in good.items() if k not in ("family", "plan", "version")})


def test_workspace_independent_of_tokens_and_reusable():
    N, K = 10, 30
    plan = dataclasses.replace(make_plan(800, N, K, torch.float32, DEV), wgrad_splits=3)
    ws = DenseProjectionDetWorkspace.for_plan(plan, DEV)
    assert ws["partials"].shape == (3, N, K) and ws["bias_partials"].shape == (3, N)
    assert ws.nbytes == 3 * (N * K + N) * 4
    assert DenseProjectionDetWorkspace.for_plan(
        dataclasses.replace(plan, wgrad_splits=1), DEV).nbytes == 0
    w = randn((N, K), torch.float32, DEV, seed=9)
    for M in (5, 400):  # one workspace serves any token count
        x = randn((M, K), torch.float32, DEV, seed=M)
        w1, w2 = w.clone().requires_grad_(), w.clone().requires_grad_()
        dense_projection_det(x, w1, plan=plan, workspace=ws).sum().backward()
        dense_projection_det(x, w2, plan=plan).sum().backward()
        assert bitwise_equal(w1.grad, w2.grad)
    with pytest.raises(ValueError, match="plan: expected DenseProjectionDetPlan"):
        DenseProjectionDetWorkspace.for_plan(plan.to_dict(), DEV)


def test_shared_workspace_and_main_grad_across_calls():
    """Two calls share one workspace and one main_grad (tied weights) before backward."""
    N, K = 12, 20
    plan = dataclasses.replace(make_plan(300, N, K, torch.float32, DEV), wgrad_splits=2)
    ws = DenseProjectionDetWorkspace.for_plan(plan, DEV)
    mg = torch.zeros(N, K, device=DEV)
    w = randn((N, K), torch.float32, DEV, seed=1).requires_grad_()
    a = randn((70, K), torch.float32, DEV, seed=2).requires_grad_()
    b = randn((90, K), torch.float32, DEV, seed=3).requires_grad_()
    ya = dense_projection_det(a, w, plan=plan, workspace=ws, main_grad=mg)
    yb = dense_projection_det(b, w, plan=plan, workspace=ws, main_grad=mg)
    (ya.sum() + yb.square().sum()).backward()
    w2 = w.detach().clone().requires_grad_()
    (dense_projection_det(a.detach(), w2).sum() +
     dense_projection_det(b.detach(), w2).square().sum()).backward()
    torch.testing.assert_close(mg, w2.grad, rtol=1e-6, atol=1e-5)
    assert w.grad is None


def test_frozen_weight_skips_wgrad():
    x = randn((40, 16), torch.float32, DEV, seed=1).requires_grad_()
    w = randn((8, 16), torch.float32, DEV, seed=2)
    mg = torch.zeros(8, 16, device=DEV)
    dense_projection_det(x, w, main_grad=mg).sum().backward()
    assert x.grad is not None and torch.equal(mg, torch.zeros_like(mg))


def test_manifest():
    import importlib

    from cake_core.build import validate_manifest
    from cake_dense_projection_det_gemm.cake_build import FAMILY, manifest

    m = manifest()
    assert validate_manifest(m) == [] and m["source_digest"].startswith("sha256:")
    assert m["name"] == FAMILY["name"] == "cake-dense-projection-det-gemm"
    for k in m["kernels"]:
        assert hasattr(importlib.import_module(k["module"]), k["function"])
    import cake_dense_projection_det_gemm as pkg

    for name in FAMILY["entry_points"]:
        assert hasattr(pkg, name)


def test_double_backward_refused_not_silent():
    x = randn((4, 16), torch.float32, DEV, seed=6).requires_grad_()
    w = randn((8, 16), torch.float32, DEV, seed=7).requires_grad_()
    (g,) = torch.autograd.grad(dense_projection_det(x, w).pow(3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
        g.pow(2).sum().backward()
    out = dense_projection_det(x, w).sum()  # a constant upstream gradient: still refused
    (g,) = torch.autograd.grad(out, x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        (out + g.pow(2).sum()).backward()


def test_import_does_not_import_triton():
    import subprocess
    import sys

    code = ("import sys, cake_dense_projection_det_gemm as p, "
            "cake_dense_projection_det_gemm.cake_build as b; b.manifest(); "
            "assert 'triton' not in sys.modules, 'triton imported'")
    env = {"PYTHONPATH": __import__("os").pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_benchmark_cpu_smoke(tmp_path):
    """The GPU benchmark's --device cpu --quick mode runs and records plan, errors, bits."""
    if DEV.type != "cpu":
        pytest.skip("CPU smoke mode")
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "bench_cake_dense_projection_det_gemm.py"
    spec = importlib.util.spec_from_file_location("bench_dense", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    assert bench.main(["--device", "cpu", "--quick", "--shapes", "300x16x32",
                       "--out", str(out)]) == 0
    (res,) = json.loads(out.read_text())["results"]
    assert res["plan"]["wgrad_splits"] == 2 and res["wgrad_bitwise_repeat"] is True
    assert set(res["phases"]) == {"fwd", "dgrad", "wgrad", "wgrad_acc"}
    assert all(e < 1.6e-2 for e in res["rel_err"].values())
    assert all("ratio" in row for row in res["phases"].values())
