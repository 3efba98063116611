"""KDADetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.linear_attention import inter_dtype as inter_dtype  # re-exported
from cake_core.linear_attention import make_head_plan
from cake_core.triton_utils import A100_SHARED_MEMORY, next_power_of_2

#: Tokens per chunk (fixed: the WY/UT triangular system is solved on 64 x 64 tiles).
CHUNK_SIZE = 64
#: Tokens per sub-chunk: pairs of tokens in different sub-chunks meet through a dot with a
#: per-channel reference decay between them; pairs inside one are summed elementwise.
SUB_CHUNK = 16
#: Largest head dims K and V.
MAX_HEAD_DIM = 256

@dataclasses.dataclass(frozen=True)
class KDADetPlan(Plan):
    """Execution plan of the det chunked Kimi Delta Attention kernels (64-token chunks).

    Bits are promised per plan. Each field, then the rule's value (:func:`make_plan`) and
    why; V' is V rounded up to a power of two >= 16, "16-bit" means 16-bit intermediates
    (``store_16bit`` with bf16 / fp16 inputs); the H200 and H100 timings and faults behind the
    CUDA values are in docs/benchmarks/kda.md:

    Fields:
        head_k_dim / head_v_dim: K and V, the q/k and v head dims (1 to 256).
        block_k: K padded to a power of two >= 16 (the recurrence and output kernels hold
            the whole K per program).
        block_k_inner: key channels per step of the loops over K of the chunk prep, the
            pairs kernel and the backward's sub-chunk kernels (bits depend on it: their sums
            run block by block in index order): min(block_k, 32) on CUDA (64 was not
            repeatable on an H200 and does not fit shared memory with fp32 intermediates),
            min(block_k, 64) under the interpreter (fewer steps).
        block_k_bwd: key channels per step of the backward chunk kernel's loop over K (bits
            depend on it): 64 on CUDA at 16-bit K = 128 (with 8 warps and 64-column V
            steps: faster than 2 warps on 32 x 32 steps), else block_k_inner.
        block_v: V columns per program of the output kernel: on CUDA min(128, V') at
            16-bit (faster), else min(64, V'); V' under the interpreter.
        block_v_bwd: V columns per step of the backward chunk kernel's loop over V (bits
            depend on it): min(64, V') on CUDA at 16-bit K = 128, else min(32, V') (larger
            ones were wrong or failed on an H200 before the kernel's barriers); V' under the
            interpreter.
        block_v_h: V columns per program of the two state-recurrence kernels (they never
            mix columns of V): min(64, V') on CUDA, V' under the interpreter.
        num_warps_prep: warps of the chunk prep (w, u, kg): 8 on CUDA at K >= 32 with fp32
            intermediates (4 were built wrongly at K = 32), else 4 (faster at 16-bit).
        num_warps_h: warps of the forward state recurrence: 8 on CUDA for state tiles
            ``block_k * block_v_h >= 8192`` with fp32 intermediates, else 4 (faster at
            16-bit).
        num_warps_o: warps of the output kernel: 8 on CUDA for ``block_k * block_v >=
            8192``, else 4.
        num_warps_bwd: warps of the backward chunk kernel: 8 on CUDA at 16-bit K = 128
            (right and repeatable under shared load with the kernel's barriers), 2 at other
            block_k >= 64 (not measured there with the barriers), else 4.
        num_stages_h: pipelining stages of the forward state recurrence: 3 at 16-bit
            (faster), else 1 (shared memory with fp32 intermediates).
        num_warps_dh / num_stages_dh: warps and stages of the backward dS recurrence: 8
            warps on CUDA for ``block_k * block_v_h >= 8192`` (4 were slower), else 4; 2
            stages at 16-bit (3 overflow shared memory at K = 128, 1 was slower), else 1.
        l2norm_block_rows: rows per program of the q/k L2-norm kernel: 16 on CUDA, 256
            under the interpreter (fewer programs).
        gate_block_t: tokens per program of the beta sigmoid's kernels (forward and
            backward; they sum nothing, so the bits do not depend on it; the gate itself
            runs in the chunk kernels): ``4096 // block_k`` on CUDA (16 to 128), 256 under
            the interpreter.
        fp32_dots: precision of dots with fp32 operands, 0 = "tf32", 1 = "ieee", 2 =
            "tf32x3": on CUDA 0 at 16-bit (only the solve is fp32 there), else 2 ("ieee"
            spills); 1 under the interpreter (it computes fp32 anyway).
        store_16bit: 1 = with bf16 / fp16 inputs the chunk intermediates (T, Aqk, w, u,
            kg, v_new, the chunk states, dS and du) are stored, and the big dots fed, in
            that dtype (as FLA: half the traffic): 1 at block_k >= 64 on CUDA (32 was wrong
            on an H200) or >= 32 under the interpreter, with V > 16; else 0. Needs block_k,
            block_v and block_v_h >= 32.
        tok_heads / num_warps_tok: value heads per program (a power of two, 1 to 64) and
            warps of the forward's token-parallel pairs kernel (bits depend on them: the
            order of each pair's sum over K): 2 / 1 on CUDA (faster), 4 / 4 under the
            interpreter (fewer programs).
        tok_heads_bwd / num_warps_tok_bwd: the same for the backward's token-parallel
            kernel (its only sum over K is dbeta's): 1 / 1 on CUDA, 4 / 4 interpreted.

    A field with a default (keyword only; a dict without it loads it as 0):
        keep_states: a user choice of memory for time: 1 = the forward keeps the chunk
            states h, w, kg and v_new and the backward skips their recompute (the chunk
            prep and the forward state pass; same bits). About 0.7 GB more per layer at
            2 x 8192 tokens, HV = 32, K = V = 128 with bf16 intermediates
            (:func:`~cake_kda_det_train.saved_bytes` counts it); worth it where memory is
            free, as under activation checkpointing, where the forward runs again just
            before the backward. Low-level callers must not modify the inputs in place
            between the forward and the backward. 0 (the rule's) = low memory, as FLA.

    The kernels not named here run with fixed launch constants (the cumulative decay, the
    sub-chunk pairs and intra kernels and the q/k L2 norm and gate kernels 4 warps, the
    inverse kernel 2). Limits found on an H200 (Triton 3.6) are checked by
    :func:`cuda_plan_problem` when a plan runs on CUDA.
    """

    family: ClassVar[str] = "cake-kda-det-train"
    format_version: ClassVar[int] = 1
    #: the mode every plan of this class carries (cake-kda-nondet-train's subclass: nondet)
    expected_mode: ClassVar[Mode] = Mode.DET

    head_k_dim: int
    head_v_dim: int
    block_k: int
    block_k_inner: int
    block_v: int
    block_v_bwd: int
    num_warps_prep: int
    num_warps_h: int
    num_warps_o: int
    num_warps_bwd: int
    num_stages_h: int
    l2norm_block_rows: int
    gate_block_t: int
    fp32_dots: int
    store_16bit: int
    block_v_h: int
    num_warps_dh: int
    num_stages_dh: int
    tok_heads: int
    num_warps_tok: int
    tok_heads_bwd: int
    num_warps_tok_bwd: int
    block_k_bwd: int
    keep_states: int = dataclasses.field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_int_fields()
        self.require_in_range("head_k_dim", 1, MAX_HEAD_DIM)
        self.require_in_range("head_v_dim", 1, MAX_HEAD_DIM)
        self.require_power_of_two("block_k", "block_k_inner", "block_v", "block_v_bwd",
                                  "block_v_h", "block_k_bwd", minimum=16)
        for name in ("block_k_inner", "block_k_bwd"):
            if getattr(self, name) > self.block_k:
                self._fail(f"{name} must be <= block_k")
        self.require_power_of_two("l2norm_block_rows", "gate_block_t")
        if self.block_k < self.head_k_dim:
            self._fail("block_k must be >= head_k_dim")
        for name in ("block_v", "block_v_bwd", "block_v_h"):
            if getattr(self, name) > _bvf(self.head_v_dim):
                self._fail(f"{name} must be <= head_v_dim rounded up to a power of two (>= 16)")
        self.require_in_range("fp32_dots", 0, 2)
        self.require_flags("store_16bit", "keep_states")
        self.require_power_of_two("tok_heads", "tok_heads_bwd")
        self.require_in_range("tok_heads", 1, 64)
        self.require_in_range("tok_heads_bwd", 1, 64)
        self.require_in_range("num_stages_h", 1, 4)
        self.require_in_range("num_stages_dh", 1, 4)
        if self.store_16bit and (self.block_k < 32 or _bvf(self.head_v_dim) < 32
                                 or min(self.block_v, self.block_v_h) < 32):
            self._fail("store_16bit=1 needs block_k >= 32, block_v >= 32, block_v_h >= 32 "
                       "and head_v_dim > 16")
        self.require_warps("num_warps_prep", "num_warps_h", "num_warps_o", "num_warps_bwd",
                           "num_warps_dh", "num_warps_tok", "num_warps_tok_bwd")
        self.require_mode(self.expected_mode)

    @property
    def dot_precision(self) -> str:
        """``input_precision`` of the kernels' fp32 ``tl.dot`` calls."""
        return ("tf32", "ieee", "tf32x3")[self.fp32_dots]


_PLANS: dict[tuple, KDADetPlan] = {}


def _bvf(V: int) -> int:
    return next_power_of_2(max(V, 16))


def cuda_plan_problem(plan: KDADetPlan, dtype: torch.dtype) -> str | None:
    """Why ``plan`` cannot run inputs of ``dtype`` on CUDA (None when it can).

    The shared-memory limit comes from sm_90 builds compiled offline (227 KiB per program).
    The others are configurations that Triton 3.6 builds wrongly for an H200 (sm_90),
    found against the float64 recurrence (``shared/gpu/plan_configs.py``,
    ``shared/gpu/kda_diag.py``; docs/benchmarks/kda.md): the same plans are right under the
    interpreter, so the fault is in the compiled code, like the Hopper miscompile FLA guards
    its own GDN backward against."""
    if max(plan.head_k_dim, plan.head_v_dim) > 128:
        return "on CUDA K and V must be <= 128 (larger tiles are not built yet)"
    fp32_inter = dtype == torch.float32 or not plan.store_16bit
    if fp32_inter and plan.block_k > 64 and (plan.num_stages_h > 1 or plan.num_stages_dh > 1
                                             or plan.block_k_inner > 32):
        return ("on CUDA fp32 intermediates (fp32 inputs or store_16bit=0) at K > 64 need "
                "num_stages_h=1, num_stages_dh=1 and block_k_inner<=32 (larger fp32 tiles "
                "overflow the 227 KiB of shared memory)")
    if fp32_inter and plan.block_k >= 64 and (plan.block_k_bwd > 32 or plan.num_warps_bwd > 2):
        return ("on CUDA fp32 intermediates (fp32 inputs or store_16bit=0) at K > 32 need "
                "block_k_bwd<=32 and num_warps_bwd<=2 (block_k_bwd=64 with 8 warps gave dk 2% "
                "off the float64 reference at K = 48 on an H100, Triton 3.6; the other wide "
                "builds are not measured with fp32 intermediates)")
    if plan.block_k >= 128 and plan.block_v_h >= 64 and plan.num_stages_dh > 2:
        return ("on CUDA K > 64 with block_v_h >= 64 needs num_stages_dh <= 2 "
                "(the dS kernel asked for 256 KiB of shared memory with 3 stages, "
                "16-bit intermediates, on an H200, Triton 3.6: more than its 227 KiB)")
    if plan.block_k_inner > 32:
        return ("on CUDA block_k_inner must be <= 32 (64 made dk, dg and dbeta differ from "
                "call to call at K = V = 128, bf16, on an H200 running nothing else, Triton "
                "3.6, when it also set the backward chunk kernel's key block, before that "
                "kernel's barriers; the other kernels it steps are not measured at 64)")
    if fp32_inter and 16 in (plan.block_k_inner, plan.block_k_bwd) and plan.block_k > 16:
        return ("on CUDA fp32 intermediates need block_k_inner >= 32 and block_k_bwd >= 32 "
                "when K > 16 (16 made an illegal memory access in the backward chunk kernel "
                "on an H200, Triton 3.6, when block_k_inner set its key step)")
    if plan.block_v_bwd > 64 or (plan.block_v_bwd == 64 and _bvf(plan.head_v_dim) > 64
                                 and (fp32_inter or plan.block_k < 128
                                      or plan.num_warps_bwd <= 2)):
        return ("on CUDA block_v_bwd > 32 only as 64, with V > 64 only at 16-bit K > 64 and "
                "more than 2 warps (128 failed to run on an H200; 64 with V = 128 and 2 warps "
                "gave wrong dk / dg there before the backward chunk kernel's barriers, and is "
                "measured right since only with 4 and 8 warps at 16-bit K = 128, on an H100, "
                "Triton 3.6)")
    if plan.store_16bit and dtype != torch.float32 and plan.block_k < 64:
        return ("on CUDA 16-bit intermediates need K > 32 (store_16bit=1 at K = 32 gave a wrong "
                "o and final state with num_warps_prep=4, and wrong dk / dg at V >= 64 with "
                "either warp count, on an H200, Triton 3.6): use store_16bit=0")
    return None


def make_plan(head_k_dim: int, head_v_dim: int, dtype: torch.dtype,
              device: torch.device | str) -> KDADetPlan:
    """Pick the plan for heads of ``head_k_dim`` (K) and ``head_v_dim`` (V) on ``device``.

    The rule (shapes, dtype and device; no timing) gives each field the default that
    :class:`KDADetPlan`'s docstring states with its reason; the H200 measurements behind
    them are in docs/benchmarks/kda.md.

    The backward chunk kernel's wide build (8 warps at 16-bit K = 128) relies on the
    barriers in its loops over V: without them its dk, dg and dbeta did not repeat while
    other processes time-shared the GPU (docs/determinism.md).

    Raises:
        ValueError: K or V outside [1, 256], ``dtype`` not fp32/bf16/fp16, or on CUDA the
            limits of :func:`cuda_plan_problem`.
    """
    return make_head_plan(head_k_dim, head_v_dim, dtype, device, max_head_dim=MAX_HEAD_DIM,
                          rule=_rule, cuda_plan_problem=cuda_plan_problem, cache=_PLANS,
                          fit_shared_memory=fit_shared_memory)




def fit_shared_memory(plan: KDADetPlan, smem: int) -> KDADetPlan:
    """The rule on a CUDA device of ``smem`` bytes of shared memory per block: under A100's
    (consumer Ampere, Ada and Blackwell: 99 KiB) the forward state kernel's stages are
    capped at 2 and the dS kernel's at 1 (at 16-bit K = V = 128, 64 and 40 KiB against 104
    and 128 KiB, by Triton 3.6 compiles for sm_86 and sm_120: docs/benchmarks/kda.md; not
    timed on such GPUs)."""
    if smem < A100_SHARED_MEMORY and (plan.num_stages_h > 2 or plan.num_stages_dh > 1):
        return dataclasses.replace(plan, num_stages_h=min(plan.num_stages_h, 2),
                                   num_stages_dh=1)
    return plan


def _rule(K: int, V: int, dtype: torch.dtype, device: torch.device) -> KDADetPlan:
    """The rule's plan; each value's reason is in :class:`KDADetPlan`'s docstring."""
    cuda = device.type == "cuda"
    block_k = next_power_of_2(max(K, 16))
    block_v_full = _bvf(V)
    block_v_h = min(64, block_v_full) if cuda else block_v_full
    # CUDA: 16-bit intermediates from K = 64 on (Triton 3.6 built K = 32 wrongly on an H200)
    store_16bit = int(block_k >= (64 if cuda else 32) and block_v_full >= 32)
    wide = dtype != torch.float32 and store_16bit
    block_v = min(128 if wide else 64, block_v_full) if cuda else block_v_full
    big_h = cuda and block_k * block_v_h >= 8192
    # the backward chunk kernel's wide build, where it was measured (16-bit K = 128)
    wide_bwd = cuda and wide and K == 128
    block_k_inner = min(block_k, 32 if cuda else 64)
    return KDADetPlan(
        head_k_dim=K,
        head_v_dim=V,
        block_k=block_k,
        block_k_inner=block_k_inner,
        block_v=block_v,
        block_v_bwd=min(64 if wide_bwd else 32, block_v_full) if cuda else block_v_full,
        num_warps_prep=8 if cuda and block_k >= 32 and not wide else 4,
        num_warps_h=8 if big_h and not wide else 4,
        num_warps_o=8 if cuda and block_k * block_v >= 8192 else 4,
        num_warps_bwd=8 if wide_bwd else 2 if cuda and block_k >= 64 else 4,
        num_stages_h=3 if wide else 1,
        l2norm_block_rows=16 if cuda else 256,
        gate_block_t=min(128, max(16, 4096 // block_k)) if cuda else 256,
        fp32_dots=(0 if wide else 2) if cuda else 1,
        store_16bit=store_16bit,
        block_v_h=block_v_h,
        num_warps_dh=8 if big_h else 4,
        num_stages_dh=2 if wide else 1,
        tok_heads=2 if cuda else 4,
        num_warps_tok=1 if cuda else 4,
        tok_heads_bwd=1 if cuda else 4,
        num_warps_tok_bwd=1 if cuda else 4,
        block_k_bwd=64 if wide_bwd else block_k_inner,
    )
