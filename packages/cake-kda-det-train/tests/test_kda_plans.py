"""Plan configurations other than the CPU default, against the float64 reference: the key
channels taken in several inner blocks (``block_k_inner`` < K, K not a multiple of it),
narrow V blocks in every kernel, T recomputed instead of kept. The same configurations
run on a GPU through ``shared/gpu/plan_configs.py kda``."""

import dataclasses

import pytest
import torch
from cake_core.testing import record_launches
from cake_core.triton_utils import default_device
from cake_kda_det_train import make_plan
from cake_kda_det_train.plan import KDADetPlan, _rule, cuda_plan_problem

DEV = default_device()


# block_k_inner and block_k_bwd step only kernels that work inside one chunk (the chunk prep,
# the pairs and the backward's chunk kernels): documents within a chunk; block_v_h sets the
# V blocks of the state kernels, which carry a document's state from chunk to chunk: one
# document across a chunk boundary
@pytest.mark.parametrize("over, lens", [
    (dict(block_k_inner=16, block_k_bwd=16), [1, 18, 0, 9]),
    (dict(block_k_inner=32, block_k_bwd=32, block_v=16, block_v_h=16, block_v_bwd=16,
          store_16bit=0), [1, 66, 0, 9]),
    (dict(block_k_inner=32, block_k_bwd=16), [1, 18, 0, 9]),
], ids=["bki16", "bki32-bv16", "bki32-bkb16"])
def test_plan_configurations(over, lens, kda):
    K, V = 48, 32  # block_k 64: the last inner block is partly masked
    plan = dataclasses.replace(make_plan(K, V, torch.float32, DEV), **over)
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 1, 2, K, V, seed=21,
                                               g_mode="strong", n_states=len(lens), h0=True)
    problem = cuda_plan_problem(plan, torch.float32) if DEV.type == "cuda" else None
    if problem is not None:  # built wrongly by Triton 3.6 on an H200: refused on CUDA
        with pytest.raises(ValueError, match="illegal memory access"):
            kda.check_vs_reference((q, k, v, g, beta), h0, seed=21,
                                   cu_seqlens=kda.cu_of(lens), plan=plan)
        return
    # fp32 dots are tf32x3 on CUDA: dg at decays down to -20 per token measured 1.06e-5
    # there (H200), against 1e-5 for the other fp32 checks
    kda.check_vs_reference((q, k, v, g, beta), h0, seed=21, cu_seqlens=kda.cu_of(lens),
                           plan=plan, grad_tol=3e-5 if DEV.type == "cuda" else None)


def test_cuda_rule_respects_shared_memory_limits():
    """The CUDA rule's fp32 plans at K = 128 keep inside the limits the offline sm_90
    builds found; a plan outside them is refused by name."""
    from cake_kda_det_train.plan import _rule, cuda_plan_problem

    cuda = torch.device("cuda")
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for K, V in ((64, 64), (128, 128), (128, 64), (32, 16)):
            assert cuda_plan_problem(_rule(K, V, dt, cuda), dt) is None, (K, V, dt)
    bad = dataclasses.replace(_rule(128, 128, torch.float32, cuda), block_k_inner=64)
    assert "block_k_inner" in cuda_plan_problem(bad, torch.float32)


def test_cuda_rule_avoids_the_configurations_built_wrongly():
    """Plans Triton 3.6 built wrongly on an H200 (measured against float64; right under
    the interpreter) are refused on CUDA by name, and the CUDA rule picks none of them."""
    from cake_kda_det_train.plan import _rule, cuda_plan_problem

    cuda = torch.device("cuda")
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for K in (16, 32, 48, 64, 100, 128):
            for V in (16, 32, 64, 128):
                assert cuda_plan_problem(_rule(K, V, dt, cuda), dt) is None, (K, V, dt)
                # the backward chunk kernel's wide build only where it was measured
                # (16-bit K = 128); elsewhere the 2-warp build it had before its barriers
                plan = _rule(K, V, dt, cuda)
                wide = K == 128 and dt != torch.float32 and plan.store_16bit
                assert plan.num_warps_bwd == (8 if wide else 2 if K > 32 else 4), (K, V)
                assert plan.block_k_bwd == (64 if wide else min(32, plan.block_k)), (K, V)
                assert plan.block_v_bwd == min(64 if wide else 32, max(16, V)), (K, V)
    cases = [((48, 32, torch.float32), dict(block_k_inner=16), "illegal memory access"),
             ((64, 128, torch.bfloat16), dict(block_v_bwd=64), "block_v_bwd"),
             ((128, 128, torch.float32), dict(block_v_bwd=64), "block_v_bwd"),
             ((32, 128, torch.bfloat16), dict(block_v_bwd=128), "block_v_bwd"),
             ((32, 64, torch.float16), dict(store_16bit=1), "store_16bit=0"),
             ((128, 128, torch.bfloat16), dict(block_k_inner=64), "block_k_inner"),
             ((64, 64, torch.float16), dict(block_k_inner=64), "block_k_inner"),
             ((128, 128, torch.float32), dict(num_warps_bwd=4), "num_warps_bwd"),
             ((48, 32, torch.float32), dict(num_warps_bwd=8), "num_warps_bwd"),
             ((48, 32, torch.float32), dict(num_warps_bwd=4), "num_warps_bwd"),
             ((64, 64, torch.float32), dict(block_k_bwd=64), "block_k_bwd"),
             ((48, 32, torch.float32), dict(block_k_bwd=16), "illegal memory access"),
             ((128, 128, torch.bfloat16), dict(num_warps_bwd=2, block_v_bwd=64),
              "block_v_bwd")]
    for (K, V, dt), over, match in cases:
        bad = dataclasses.replace(_rule(K, V, dt, cuda), **over)
        assert match in cuda_plan_problem(bad, dt), (K, V, dt, over)
    fine = [((64, 64, torch.float32), dict(block_k_inner=32)),
            ((64, 64, torch.bfloat16), dict(block_v_bwd=64)),
            ((128, 128, torch.bfloat16), dict(block_v_bwd=16)),
            ((64, 64, torch.bfloat16), dict(num_warps_bwd=8)),
            ((128, 128, torch.bfloat16), dict(num_warps_bwd=2, block_k_bwd=32,
                                              block_v_bwd=32)),
            ((128, 128, torch.bfloat16), dict(num_warps_bwd=4))]
    for (K, V, dt), over in fine:
        assert cuda_plan_problem(dataclasses.replace(_rule(K, V, dt, cuda), **over), dt) is None


def test_rule_prep_warps():
    """The chunk prep (w, u, kg; T comes from its own kernel) 4 warps with 16-bit
    intermediates on CUDA, 8 with fp32 ones at K >= 32; 4 under the interpreter."""
    from cake_kda_det_train.plan import _rule

    cuda = torch.device("cuda")
    assert _rule(128, 128, torch.bfloat16, cuda).num_warps_prep == 4
    assert _rule(128, 128, torch.float32, cuda).num_warps_prep == 8
    assert _rule(32, 32, torch.bfloat16, cuda).num_warps_prep == 8
    assert _rule(128, 128, torch.float32, torch.device("cpu")).num_warps_prep == 4


def test_bwd_chunk_kernel_steps_block_k_bwd(kda):
    """``block_k_bwd``, not ``block_k_inner``, sets the backward chunk kernel's key block
    (the sub-chunk kernel keeps ``block_k_inner``); right against float64 on documents of
    1, 18, 0 and 9 tokens. On CUDA the rule's wide build (64 against 32, 8 warps)."""
    from cake_kda_det_train import chunk

    if DEV.type == "cuda":
        K, V, dtype, over = 128, 128, torch.bfloat16, {}
    else:
        K, V, dtype, over = 48, 32, torch.float32, dict(block_k_inner=32, block_k_bwd=16)
    plan = dataclasses.replace(make_plan(K, V, dtype, DEV), **over)
    assert plan.block_k_bwd != plan.block_k_inner
    with record_launches(chunk, "kda_bwd_local_kernel", "kda_bwd_intra_kernel") as launches:
        kda.check_plan_on_docs(plan, [1, 18, 0, 9], K, V, dtype, seed=7)
    assert {kw["BKI"] for _, kw in launches["kda_bwd_local_kernel"]} == {plan.block_k_bwd}
    assert {kw["BKI"] for _, kw in launches["kda_bwd_intra_kernel"]} == {plan.block_k_inner}


@pytest.mark.parametrize("bkb, msg", [(24, "block_k_bwd must be a power of two"),
                                       (8, "block_k_bwd"), (128, "block_k_bwd must be <=")])
def test_bad_block_k_bwd_refused(bkb, msg):
    """A key step that is no power of two >= 16, or wider than block_k (64 at K = 48)."""
    with pytest.raises(ValueError, match=msg):
        dataclasses.replace(make_plan(48, 32, torch.float32, DEV), block_k_bwd=bkb)


def test_block_k_bwd_rule_off_the_wide_build_and_the_kernel_barriers():
    """Off CUDA's wide build the rule keeps the backward chunk kernel's key step at
    block_k_inner (the launches it had before the field); and the kernel keeps a barrier at
    the end of each step of its two loops over V (without them its sm_90 builds of more than
    2 warps did not repeat under shared load: docs/determinism.md)."""
    import inspect

    from cake_kda_det_train.kernels import chunk_bwd

    for dev in ("cpu", "cuda"):
        for K, V, dt in ((48, 32, torch.float32), (64, 64, torch.bfloat16),
                         (128, 128, torch.float32), (32, 128, torch.float16)):
            plan = _rule(K, V, dt, torch.device(dev))
            assert plan.block_k_bwd == plan.block_k_inner, (dev, K, V, dt)
    lines = inspect.getsource(chunk_bwd.kda_bwd_local_kernel.fn).splitlines()
    bodies = []
    for i, line in enumerate(lines):
        if line.strip().startswith("for vi in range(NV):"):
            indent = len(line) - len(line.lstrip())
            body = []
            for nxt in lines[i + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt.strip())
            bodies.append(body)
    assert len(bodies) == 2
    assert all(any(x.startswith("tl.debug_barrier()") for x in body) for body in bodies)


def test_bwd_maxnreg_launch_constant(kda, monkeypatch):
    """``chunk.BWD_MAXNREG`` (the backward chunk kernel's ``maxnreg``, a launch constant for
    GPU sweeps, None in the rule) reaches the launch and leaves the results right against
    float64 (on CUDA it changes only the register budget of the build); documents of 1, 18, 0
    and 9 tokens, then of 3 and 20."""
    from cake_kda_det_train import chunk

    plan = make_plan(48, 32, torch.float32, DEV)
    for maxnreg, lens, seed in ((255, [1, 18, 0, 9], 5), (None, [3, 20], 6)):
        monkeypatch.setattr(chunk, "BWD_MAXNREG", maxnreg)
        with record_launches(chunk, "kda_bwd_local_kernel") as launches:
            kda.check_plan_on_docs(plan, lens, 48, 32, torch.float32, seed=seed)
        got = [kw.get("maxnreg") for _, kw in launches["kda_bwd_local_kernel"]]
        assert got and set(got) == {maxnreg}


def test_plan_format_1_only():
    """Format 1 is the only one (no release exists: no upgrade messages); a dict of any other
    version is refused, and the rule's plans round-trip."""
    assert KDADetPlan.format_version == 1 and not KDADetPlan.format_upgrades
    for dev in ("cpu", "cuda"):
        plan = _rule(128, 128, torch.bfloat16, torch.device(dev))
        d = plan.to_dict()
        assert d["version"] == 1 and KDADetPlan.from_dict(d) == plan
        for v in (0, 2, 11):
            with pytest.raises(ValueError, match=f"format version {v} is not 1$"):
                KDADetPlan.from_dict({**d, "version": v})
        # fields removed in issue 42 (every rule output had one value) are refused by name
        for name, x in (("chunk_size", 64), ("keep_a", 1), ("rec_form", 2),
                        ("num_warps_intra", 4), ("inv_kernel", 2)):
            with pytest.raises(ValueError, match=f"unknown KDADetPlan fields .*{name}"):
                KDADetPlan.from_dict({**d, name: x})


def test_cuda_rule_fits_the_devices_shared_memory(monkeypatch):
    """The CUDA rule reads the device's shared memory per block: at A100's or more the
    stages stay; under it (consumer GPUs' 99 KiB) the forward state kernel takes at most 2
    stages and the dS kernel 1 (compiled under 99 KiB offline: kda.md); a plan per class."""
    import cake_core.linear_attention as la
    import torch
    from cake_kda_det_train import make_plan

    cuda = torch.device("cuda", 0)
    got = {}
    for smem in (232448, 166912, 101376):
        monkeypatch.setattr(la, "rule_shared_memory", lambda d, s=smem: s)
        for dt in (torch.bfloat16, torch.float32):
            got[smem, dt] = make_plan(128, 128, dt, cuda)
    big = got[232448, torch.bfloat16]
    assert (big.num_stages_h, big.num_stages_dh) == (3, 2)
    assert got[166912, torch.bfloat16] == big
    small = got[101376, torch.bfloat16]
    assert (small.num_stages_h, small.num_stages_dh) == (2, 1)
    assert small == __import__("dataclasses").replace(big, num_stages_h=2, num_stages_dh=1)
    assert got[101376, torch.float32] == got[232448, torch.float32]  # 1 stage each already
