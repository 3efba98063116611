"""The module, plans, workspaces, torch.compile, torch.utils.checkpoint, the manifest."""

import dataclasses

import pytest
import torch
import torch.utils.checkpoint
from cake_core.triton_utils import default_device
from cake_rmsnorm_silu_gate_det_train import (
    RMSNormGated,
    RMSNormSiluGateDetPlan,
    RMSNormSiluGateDetWorkspace,
    make_plan,
    rmsnorm_silu_gate_det,
)

DEV = default_device()
BACKEND = "aot_eager" if DEV.type == "cpu" else "inductor"


class _FLAOrMambaLike(torch.nn.Module):
    """The parameter layout of FLA's FusedRMSNormGated and Mamba2's RMSNormGated: a
    ``weight`` [D] and a ``bias`` registered as None."""

    def __init__(self, D):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(D, generator=torch.Generator().manual_seed(1)))
        self.register_parameter("bias", None)


@pytest.mark.parametrize("norm_before_gate,group_size,activation",
                         [(True, None, "swish"), (False, 16, "silu"), (True, 24, "sigmoid")])
def test_module_matches_functional_and_loads_state_dict(norm_before_gate, group_size,
                                                        activation, make_inputs):
    D = 48
    m = RMSNormGated(D, 1e-5, norm_before_gate=norm_before_gate, group_size=group_size,
                     activation=activation, device=DEV)
    assert m.activation == activation
    assert list(m.state_dict()) == ["weight"] and torch.equal(m.weight, torch.ones(D, device=DEV))
    other = _FLAOrMambaLike(D).to(DEV)
    m.load_state_dict(other.state_dict(), strict=True)
    other.load_state_dict(m.state_dict(), strict=True)
    assert torch.equal(m.weight, other.weight)
    x, z, _, dy = make_inputs((2, 7, D), seed=4)
    x1, z1 = x.clone().requires_grad_(), z.clone().requires_grad_()
    y = m(x1, z1)
    y.backward(dy)
    x2, z2 = x.clone().requires_grad_(), z.clone().requires_grad_()
    w2 = other.weight.detach().clone().requires_grad_()
    y2 = rmsnorm_silu_gate_det(x2, z2, w2, 1e-5, norm_before_gate=norm_before_gate,
                               group_size=group_size, activation=activation)
    y2.backward(dy)
    for a, b in ((y, y2), (x1.grad, x2.grad), (z1.grad, z2.grad), (m.weight.grad, w2.grad)):
        assert torch.equal(a, b)
    assert "norm_before_gate" in repr(m) and f"activation={activation}" in repr(m)


def test_module_activation_argument_as_fla(make_inputs):
    """FLA's FusedRMSNormGated names it ``activation``, default ``"swish"`` (= SiLU); the
    default module gives the "silu" bits, and KDA's "sigmoid" another output."""
    import inspect

    param = inspect.signature(RMSNormGated).parameters["activation"]
    assert param.default == "swish"
    x, z, _, _ = make_inputs((6, 32), seed=12)
    default = RMSNormGated(32, device=DEV)
    assert default.activation == "swish"
    y = default(x, z)
    assert torch.equal(y, RMSNormGated(32, activation="silu", device=DEV)(x, z))
    assert not torch.equal(y, RMSNormGated(32, activation="sigmoid", device=DEV)(x, z))


def test_module_dtypes_strides_and_errors(make_inputs):
    x, z, _, _ = make_inputs((5, 32), seed=6)
    bf = RMSNormGated(32, device=DEV, dtype=torch.bfloat16)  # bf16 weight, fp32 input
    ref = rmsnorm_silu_gate_det(x, z, torch.ones(32, device=DEV))
    torch.testing.assert_close(bf(x, z), ref)
    xt = x.t().contiguous().t()  # last dim not contiguous: the module copies
    torch.testing.assert_close(RMSNormGated(32, device=DEV)(xt, z), ref)
    with pytest.raises(ValueError, match="hidden_size=32"):
        RMSNormGated(32, device=DEV)(x[:, :16], z[:, :16])
    with pytest.raises(ValueError, match="group_size"):
        RMSNormGated(32, group_size=5)
    with pytest.raises(ValueError, match="hidden_size"):
        RMSNormGated(0)


def test_torch_compile_fullgraph_same_bits(make_inputs):
    """The traced route (custom ops cake_rmsnorm_silu_gate_det_train::fwd/bwd) gives the
    eager route's bits, accumulator included."""
    torch._dynamo.reset()
    from torch._dynamo.testing import CompileCounterWithBackend

    D = 32
    x, z, w, dy = make_inputs((9, D), seed=8)

    def f(x, z, w, acc):
        a = rmsnorm_silu_gate_det(x, z, w, group_size=16)
        b = rmsnorm_silu_gate_det(x * 2, z, w, norm_before_gate=False,
                                  dweight_accumulator=acc)
        c = rmsnorm_silu_gate_det(x, z * 0.5, w, group_size=8, activation="sigmoid")
        d = rmsnorm_silu_gate_det(x * 0.5, z, w, norm_before_gate=False, activation="sigmoid")
        return a + b + c + d

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (x, z, w)]
        acc = torch.zeros(D, device=DEV)
        y = fn(*leaves, acc)
        y.backward(dy)
        return [y.detach(), acc] + [t.grad for t in leaves]

    want = run(f)
    cnt = CompileCounterWithBackend(BACKEND)
    got = run(torch.compile(f, fullgraph=True, backend=cnt))
    assert cnt.frame_count == 1
    assert "cake_rmsnorm_silu_gate_det_train.fwd" in cnt.graphs[0].code
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_custom_ops_opcheck(activation, make_inputs):
    """Schema, fake implementations and autograd registration of the custom ops."""
    from cake_core.compile import plan_to_op_fields

    x, z, w, dy = make_inputs((6, 24), seed=9)
    x, z, w = (t.requires_grad_() for t in (x, z, w))
    fields = plan_to_op_fields(make_plan(24, torch.float32, DEV, group_size=8))
    args = (x, z, w, 1e-6, False, activation, fields, None, None)
    torch.library.opcheck(torch.ops.cake_rmsnorm_silu_gate_det_train.fwd, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))
    with torch.no_grad():
        _, rstd = torch.ops.cake_rmsnorm_silu_gate_det_train.fwd(*args)
        bwd_args = (dy, x, z, w, rstd, False, activation, fields, None, None)
    assert rstd.shape == (6, 3)
    torch.library.opcheck(torch.ops.cake_rmsnorm_silu_gate_det_train.bwd, bwd_args,
                          test_utils=("test_schema", "test_faketensor"))


def test_checkpoint_same_bits(make_inputs):
    x, z, w, dy = make_inputs((2, 9, 40), seed=10)

    def block(x, z, w):
        return rmsnorm_silu_gate_det(x * 1.5, z, w, norm_before_gate=False, group_size=20)

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (x, z, w)]
        fn(*leaves).backward(dy)
        return [t.grad for t in leaves]

    def ckpt(*a):
        return torch.utils.checkpoint.checkpoint(block, *a, use_reentrant=False)

    for a, b in zip(run(ckpt), run(block), strict=True):
        assert torch.equal(a, b)


def test_plan_rules_and_roundtrip():
    p = make_plan(128, torch.bfloat16, DEV)
    assert (p.hidden_size, p.group_size, p.block_ng, p.block_g) == (128, 128, 1, 128)
    assert p.mode.value == "det"
    assert make_plan(128, torch.bfloat16, DEV) == p  # rule, not timing: same answer
    assert RMSNormSiluGateDetPlan.from_dict(p.to_dict()) == p
    g = make_plan(96, torch.float32, DEV, group_size=32)
    assert (g.group_size, g.block_ng, g.block_g) == (32, 4, 32)
    cuda = make_plan(128, torch.bfloat16, "cuda") if torch.cuda.is_available() else None
    if cuda is not None:
        # rows of <= 1024 elements: 2048-element tiles, twice the general warps (H200 sweep)
        assert cuda.block_m_fwd * 128 == 2048 and cuda.block_m_bwd * 128 == 2048
        assert cuda.num_warps_fwd == cuda.num_warps_bwd == 8
        wide = make_plan(4096, torch.bfloat16, "cuda")
        assert (wide.block_m_fwd, wide.num_warps_fwd, wide.num_warps_bwd) == (1, 8, 8)
    with pytest.raises(ValueError, match="hidden_size"):
        make_plan(0, torch.float32, DEV)
    with pytest.raises(ValueError, match="group_size"):
        make_plan(96, torch.float32, DEV, group_size=7)
    with pytest.raises(ValueError, match="device"):
        make_plan(32, torch.float32, "nope")
    good = p.to_dict()
    for field, bad in (("bwd_programs", 0), ("block_g", 64), ("block_m_fwd", 3),
                       ("group_size", 96), ("num_warps_fwd", 3), ("hidden_size", 128.0)):
        with pytest.raises(ValueError, match=field):
            RMSNormSiluGateDetPlan.from_dict({**good, field: bad})


def test_workspace_reuse_across_row_counts_and_calls(make_inputs):
    D = 40
    plan = make_plan(D, torch.float32, DEV, group_size=10)
    ws = RMSNormSiluGateDetWorkspace.for_plan(plan, DEV)
    assert ws.nbytes == plan.bwd_programs * D * 4
    for rows in (5, 70):  # one workspace serves any row count
        x, z, w, dy = make_inputs((rows, D), seed=rows)
        grads = []
        for kw in ({"plan": plan, "workspace": ws}, {}):
            leaves = [t.clone().requires_grad_() for t in (x, z, w)]
            rmsnorm_silu_gate_det(*leaves, group_size=10, **kw).backward(dy)
            grads.append([t.grad for t in leaves])
        for a, b in zip(*grads, strict=True):
            assert torch.equal(a, b)


def test_shared_workspace_and_accumulator_across_calls(make_inputs):
    """Two calls share one workspace and one accumulator (tied weights) before backward."""
    D = 48
    plan = make_plan(D, torch.float32, DEV)
    ws = RMSNormSiluGateDetWorkspace.for_plan(plan, DEV)
    acc = torch.zeros(D, device=DEV)
    a, za, w, _ = make_inputs((7, D), seed=1)
    b, zb, _, _ = make_inputs((9, D), seed=2)
    w = w.requires_grad_()
    ya = rmsnorm_silu_gate_det(a, za, w, plan=plan, workspace=ws, dweight_accumulator=acc)
    yb = rmsnorm_silu_gate_det(b, zb, w, plan=plan, workspace=ws, dweight_accumulator=acc)
    (ya.sum() + yb.sum()).backward()
    assert w.grad is None
    w2 = w.detach().clone().requires_grad_()
    (rmsnorm_silu_gate_det(a, za, w2).sum() + rmsnorm_silu_gate_det(b, zb, w2).sum()).backward()
    torch.testing.assert_close(acc, w2.grad, rtol=1e-6, atol=1e-6)


def test_double_backward_refused_not_silent(make_inputs):
    x, z, w, _ = make_inputs((4, 32), seed=6)
    x = x.requires_grad_()
    (g,) = torch.autograd.grad(rmsnorm_silu_gate_det(x, z, w).pow(3).sum(), x,
                               create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
        g.pow(2).sum().backward()


def test_manifest_and_lazy_import():
    import importlib
    import subprocess
    import sys

    from cake_core.build import validate_manifest
    from cake_rmsnorm_silu_gate_det_train.cake_build import manifest

    m = manifest()
    assert validate_manifest(m) == []
    assert m["name"] == "cake-rmsnorm-silu-gate-det-train"
    assert m["source_digest"].startswith("sha256:")
    for k in m["kernels"]:
        assert hasattr(importlib.import_module(k["module"]), k["function"])
    code = ("import sys, cake_rmsnorm_silu_gate_det_train as p; "
            "assert 'triton' not in sys.modules; print(p.__version__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": ":".join(p for p in sys.path if p)})
    assert r.returncode == 0 and r.stdout.strip() == "0.1.0", r.stderr


def test_plan_variant_fields_cross_the_op_boundary():
    from cake_core.compile import plan_from_op_fields, plan_to_op_fields

    p = dataclasses.replace(make_plan(96, torch.float16, DEV, group_size=48), bwd_programs=7)
    assert plan_from_op_fields(RMSNormSiluGateDetPlan, plan_to_op_fields(p)) == p


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_bwd_stages_same_bits_and_format(stages, make_inputs):
    """Plan field bwd_stages (format 2): the backward loop pipelined over a program's row
    blocks gives the rule's bits (same arithmetic, same order; programs own 3-4 blocks, the
    last partly masked); a format-1 dict is refused with the upgrade; range checked."""
    x, z, w, dy = make_inputs((3, 61, 48), torch.bfloat16, seed=stages)
    rule = make_plan(48, torch.bfloat16, DEV, group_size=16)
    # the rule: 3 on CUDA for rows of <= 1024 elements (timed on an H200), else 1
    assert rule.bwd_stages == (3 if torch.device(DEV).type == "cuda" else 1)
    base = dataclasses.replace(rule, block_m_bwd=16, bwd_programs=4, bwd_stages=1)

    def run(plan):
        xs, zs, ws = (t.detach().clone().requires_grad_() for t in (x, z, w))
        rmsnorm_silu_gate_det(xs, zs, ws, group_size=16, plan=plan).backward(dy)
        return xs.grad, zs.grad, ws.grad

    want = run(base)
    got = run(dataclasses.replace(base, bwd_stages=stages))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    d = dataclasses.replace(base, bwd_stages=stages).to_dict()
    assert d["version"] == 2 and d["bwd_stages"] == stages
    v1 = {k: v for k, v in base.to_dict().items() if k != "bwd_stages"}
    v1["version"] = 1
    with pytest.raises(ValueError, match="format version 1 is not 2: .*bwd_stages = 1"):
        RMSNormSiluGateDetPlan.from_dict(v1)
    assert RMSNormSiluGateDetPlan.from_dict({**v1, "bwd_stages": 1, "version": 2}) == base
    for bad in (0, 5, True):
        with pytest.raises(ValueError, match="bwd_stages"):
            dataclasses.replace(base, bwd_stages=bad)
