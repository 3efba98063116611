"""GDNDetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.linear_attention import make_head_plan
from cake_core.plan import cached_plan
from cake_core.triton_utils import (
    A100_SHARED_MEMORY,
    HOPPER_SHARED_MEMORY,
    next_power_of_2,
    sm_count,
)

#: Tokens per chunk (fixed: the WY/UT triangular system is solved on 64 x 64 tiles).
CHUNK_SIZE = 64
#: Largest head dims K and V (a whole state row block stays in registers).
MAX_HEAD_DIM = 256


@dataclasses.dataclass(frozen=True)
class GDNDetPlan(Plan):
    """Execution plan of the det chunked Gated DeltaNet kernels (64-token chunks).

    Bits are promised per plan. Each field, then the rule's value (:func:`make_plan`) and
    why; V' is V rounded up to a power of two >= 16, "16-bit K = 128" means CUDA with
    16-bit intermediates at K = 128, where the H200 timings of docs/benchmarks/gdn.md chose
    (the local backward's one K block at K = V = 128: H100 timings, same file):

    Fields:
        head_k_dim / head_v_dim: K and V, the q/k and v head dims (1 to 256).
        block_k: K padded to a power of two >= 16 (each program holds the whole K).
        block_v: V columns per program of the output and dv_local kernels: min(64, V') on
            CUDA, 128 at 16-bit K = V = 128 (faster), V' under the interpreter (fewer programs).
        block_v_h: the same for the state-recurrence kernels: min(64, V') on CUDA (32 by the
            ``state_programs`` rule when the GPU is half empty), V' under the interpreter.
        block_v_local: V columns per step of the backward local kernels (bits depend on it):
            64 at 16-bit K = 128, min(32, V') elsewhere on CUDA (faster), V' interpreted.
        block_k_local: K columns per block of ``local_form = 2`` (bits depend on it):
            block_k (one block) at 16-bit K = V = 128 on GPUs with Hopper's shared memory
            per block (faster on an H100; the K-block kernel takes 152 KiB there), else
            min(64, block_k) (32 was slower). The one block takes 112 KiB on sm_80 / sm_120:
            more than consumer GPUs' 99 KiB; it fits A100's 163 KiB but spills registers
            there and was not timed on one, so A100 keeps the two blocks.
        num_warps_h: warps of the state-recurrence kernels: 8 on CUDA for state tiles
            ``block_k * block_v_h >= 8192``, else 4 (the kernels not named here run 4).
        num_warps_local: warps of the backward local kernel (local_form 0) or of the
            K-block kernel (local_form 2): 8 on CUDA for ``block_k * V' >= 4096`` (faster)
            except with local_form 2's 64-column K blocks (4), else 4.
        num_stages_h: pipelining stages of the state-recurrence kernels: 3 at 16-bit K = 128
            (faster), 2 with other 16-bit intermediates, 1 with fp32 ones (shared memory).
        rec_form: the form of the state-recurrence kernels (cake_core.chunk_state, scalar
            decay): 0 = decays on the ``[64, K]`` tiles; 1 = FLA's operand form (decays on
            the ``[64, block_v_h]`` tiles, other rounding; a one-axis grid), the rule's at
            16-bit K = 128 (faster).
        local_form: the backward chunk-local gradients: 0 = one kernel with whole-K tiles
            (kernels/bwd_local.py); 2 = K-block programs summed in K-block order
            (kernels/bwd_local_kblock.py, other bits), the rule's at 16-bit K = 128 (faster).
        fp32_dots: precision of dots with fp32 operands, 0 = "tf32", 1 = "ieee", 2 = "tf32x3":
            0 on CUDA with 16-bit intermediates (only the chunk solve is fp32 there), 2 with
            fp32 ones ("ieee" spills), 1 under the interpreter (it computes fp32 anyway).
        store_16bit: 1 = with bf16 / fp16 inputs the chunk intermediates are stored, and the
            big dots fed, in that dtype (as FLA: half the traffic): 1 where block_k >= 32
            and V > 16 (16-wide 16-bit dots were wrong on an H200), else 0.
        l2norm_block_rows: rows per program of the q/k L2-norm kernel: 16 on CUDA, 256 under
            the interpreter (fewer programs).
        gate_block_t: tokens per program of the gate / beta-sigmoid kernels and the first
            stage of the dA_log / ddt_bias sums (bits depend on it): 128 on CUDA, 256
            interpreted.
        keep_states: a user choice of memory for time: 1 = the forward keeps the chunk
            states, w, v_new and g's chunk cumsum and the backward skips their recompute
            (about 1 GB more per layer at 32768 tokens, HV = 32, K = V = 128, bf16; less
            fwd+bwd time, measurements: docs/benchmarks/gdn.md; same bits; low-level callers
            must not modify the inputs in place in between); 0 (the rule's) = low memory, as FLA.

    A field with a default (keyword only; a dict without it loads it as 0, the launches of
    every plan made before it):
        l2norm_local: with ``use_qk_l2norm_in_kernel``, ``local_form = 2`` and one K block
            (``block_k_local >= head_k_dim``), 1 = the q/k L2 norm's backward runs inside
            the local kernels, on the whole rows they hold (dq in the K-block kernel with
            one value head per q/k head, else dq and dk in the dk kernel after their value
            heads' sum), which then store dq and dk in q's dtype: the fp32 dq / dk and the
            two L2-norm backward launches are gone (other bits than 0). The rule's 1 where
            it picks one K block; 0 elsewhere (ignored where those conditions fail).

    Limits found on an H200 (Triton 3.6), checked by :func:`cuda_plan_problem` when a plan
    runs on CUDA: K, V <= 128; K <= 64 with fp32 intermediates (shared memory);
    ``num_warps_local = 8`` only with ``block_k * V' >= 4096``; with ``local_form = 2``,
    ``block_k_local >= 32`` with 16-bit intermediates or more than 4 ``num_warps_local``,
    and ``block_k_local >= min(64, block_k)`` with ``block_v_local >= 64``;
    ``block_v_h >= min(64, V')`` with 16-bit intermediates at K != block_k; ``block_v_local
    >= 32`` with fp32 intermediates at block_k >= 64 and V > block_v_local (illegal
    accesses or wrong gradients otherwise).
    """

    family: ClassVar[str] = "cake-gdn-det-train"
    format_version: ClassVar[int] = 1
    #: the mode a plan of this class must carry (cake-gdn-nondet-train's subclass: nondet)
    expected_mode: ClassVar[Mode] = Mode.DET

    head_k_dim: int
    head_v_dim: int
    block_k: int
    block_v: int
    block_v_h: int
    block_v_local: int
    block_k_local: int
    num_warps_h: int
    num_warps_local: int
    num_stages_h: int
    rec_form: int
    local_form: int
    fp32_dots: int
    store_16bit: int
    l2norm_block_rows: int
    gate_block_t: int
    keep_states: int
    l2norm_local: int = dataclasses.field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_int_fields()
        self.require_in_range("head_k_dim", 1, MAX_HEAD_DIM)
        self.require_in_range("head_v_dim", 1, MAX_HEAD_DIM)
        self.require_power_of_two("block_k", "block_v", "block_v_h", "block_v_local",
                                  minimum=16)
        if self.block_v_local > _bvf(self.head_v_dim):
            self._fail("block_v_local must be <= head_v_dim rounded up to a power of two")
        self.require_power_of_two("l2norm_block_rows", "gate_block_t")
        if self.block_k < self.head_k_dim:
            self._fail("block_k must be >= head_k_dim")
        for name in ("block_v", "block_v_h"):
            if getattr(self, name) > next_power_of_2(max(16, self.head_v_dim)):
                self._fail(f"{name} must be <= head_v_dim rounded up to a power of two "
                           "(>= 16)")
        self.require_in_range("fp32_dots", 0, 2)
        self.require_flags("store_16bit", "keep_states", "l2norm_local")
        if self.local_form not in (0, 2):
            self._fail(f"local_form must be 0 or 2, got {self.local_form}")
        self.require_in_range("rec_form", 0, 1)
        self.require_power_of_two("block_k_local", minimum=16)
        if self.block_k_local > self.block_k:
            self._fail("block_k_local must be <= block_k")
        self.require_in_range("num_stages_h", 1, 4)
        if self.store_16bit and (self.block_k < 32 or _bvf(self.head_v_dim) < 32
                                 or min(self.block_v, self.block_v_h) < 32):
            self._fail("store_16bit=1 needs block_k >= 32, block_v >= 32, block_v_h >= 32 and "
                       "head_v_dim > 16 (16-wide 16-bit dots gave wrong results on an H200, "
                       "Triton 3.6)")
        self.require_warps("num_warps_h", "num_warps_local")
        self.require_mode(self.expected_mode)

    @property
    def dot_precision(self) -> str:
        """``input_precision`` of the kernels' fp32 ``tl.dot`` calls."""
        return ("tf32", "ieee", "tf32x3")[self.fp32_dots]


_PLANS: dict[tuple, GDNDetPlan] = {}


def _bvf(V: int) -> int:
    """Width of the whole-V tiles (chunk prep, backward local kernel)."""
    return next_power_of_2(max(V, 16))


def cuda_plan_problem(plan: GDNDetPlan, dtype: torch.dtype) -> str | None:
    """Why ``plan`` cannot run inputs of ``dtype`` on CUDA (None when it can): the limits
    an H200 run with Triton 3.6 found (see :class:`GDNDetPlan`)."""
    if max(plan.head_k_dim, plan.head_v_dim) > 128:
        return "on CUDA K and V must be <= 128 (larger tiles are not built yet)"
    if (dtype == torch.float32 or not plan.store_16bit) and plan.block_k > 64:
        return ("on CUDA fp32 intermediates need K <= 64 (fp32 tiles of K = 128 overflow "
                f"shared memory): this plan has store_16bit={plan.store_16bit} with {dtype} "
                "inputs (the rule keeps fp32 intermediates for fp32 inputs and for V <= 16); "
                "use bf16/fp16 inputs with V > 16, or K <= 64")
    if plan.num_warps_local > 4 and plan.block_k * _bvf(plan.head_v_dim) < 4096:
        return "on CUDA num_warps_local > 4 needs block_k * V >= 4096"
    if dtype != torch.float32 and plan.store_16bit and plan.local_form \
            and plan.block_k_local < 32:
        return ("on CUDA local_form=2 needs block_k_local >= 32 with 16-bit intermediates "
                "(16-wide 16-bit dots gave wrong results on an H200, Triton 3.6)")
    if plan.local_form and plan.block_k_local < min(64, plan.block_k) \
            and plan.block_v_local >= 64:
        return ("on CUDA local_form=2 with block_v_local >= 64 needs block_k_local >= "
                "min(64, block_k) (K blocks of 32 with block_v_local=64 gave dk / dg / dbeta "
                "0.04-0.2 off float64 at K, V = 100, 48 / 96, 64 / 128, 64 bf16 and fp16 on an "
                "H200, Triton 3.6, right under the interpreter; the rule's block_k_local=64 "
                "was right)")
    if dtype != torch.float32 and plan.store_16bit and plan.head_k_dim != plan.block_k \
            and plan.block_v_h < min(64, _bvf(plan.head_v_dim)):
        return ("on CUDA with 16-bit intermediates block_v_h < min(64, V rounded up) needs "
                "K = block_k (block_v_h=32 at "
                "K = 100 with V = 48 / 64, bf16 and fp16, gave illegal memory accesses with "
                "rec_form=1 (an out-of-range shared-memory address in the forward state "
                "kernel) and o / dk / dv / dbeta 0.04-0.6 off float64 with 4 warps or 2 "
                "stages, on an H200 with Triton 3.6; right at K = 128, with fp32 at "
                "K = 48, and under the interpreter)")
    if (dtype == torch.float32 or not plan.store_16bit) and plan.block_k >= 64 \
            and plan.block_v_local < 32 and plan.head_v_dim > plan.block_v_local:
        return ("on CUDA fp32 intermediates with block_k >= 64 need block_v_local >= 32 when "
                "V > block_v_local (block_v_local=16 at K = 56 / 64, V = 40 / 48 fp32 gave "
                "illegal memory accesses or wrong dk / dg / dbeta on an H200, Triton 3.6, with "
                "either local_form; K = 32 was right)")
    if plan.local_form == 2 and plan.num_warps_local > 4 and plan.block_k_local < 32:
        return ("on CUDA local_form=2 with num_warps_local > 4 needs block_k_local >= 32 "
                "(fp32 K = V = 40 with block_k_local=16 at 8 warps gave an illegal memory "
                "access on an H200, Triton 3.6; the same at 4 warps with V = 32, "
                "and 8 warps at block_k_local=64, were right; not narrowed further)")
    return None


def make_plan(head_k_dim: int, head_v_dim: int, dtype: torch.dtype,
              device: torch.device | str, *, state_programs: int | None = None) -> GDNDetPlan:
    """Pick the plan for heads of ``head_k_dim`` (K) and ``head_v_dim`` (V) on ``device``
    by rule (no timing; each field's rule and why: :class:`GDNDetPlan`; the H200
    measurements behind them: docs/benchmarks/gdn.md).

    ``state_programs``: the number of (sequence, value head) pairs of the calls the plan is
    for (``N * HV``; the entries pass it), or ``None``. It changes two launch fields only:
    on CUDA with 16-bit intermediates, K = 128 and block_v_h = 64, when ``state_programs *
    ceil(V / 64)`` is at most half the GPU's SM count, the state kernels take
    ``block_v_h = 32`` and ``num_warps_h = 4`` (twice the programs: faster on an H200 at one
    long sequence, slower at full occupancy, the same bits there). A workspace made for
    either plan serves both (the buffers are the same).

    Raises:
        ValueError: if K or V is outside [1, 256], ``dtype`` is not fp32/bf16/fp16, or on
            CUDA the limits of :func:`cuda_plan_problem` (K, V <= 128; fp32 inputs or
            V <= 16: K <= 64); if ``state_programs`` is neither None nor an int >= 0, or is
            given for a CUDA device on a machine without CUDA (the rule reads that GPU's
            SM count).
    """
    return plan_by_rule(GDNDetPlan, _PLANS, head_k_dim, head_v_dim, dtype, device,
                        state_programs)


def plan_by_rule(plan_type: type[GDNDetPlan], cache: dict, head_k_dim: int, head_v_dim: int,
                 dtype: torch.dtype, device: torch.device | str,
                 state_programs: int | None) -> GDNDetPlan:
    """The body of :func:`make_plan` for ``plan_type`` (GDNDetPlan, or cake-gdn-nondet-
    train's subclass): the rule's fields in a ``plan_type``, memoised in ``cache``."""
    plan = make_head_plan(head_k_dim, head_v_dim, dtype, device, max_head_dim=MAX_HEAD_DIM,
                          rule=lambda K, V, dt, dev: _rule(K, V, dt, dev, plan_type),
                          cuda_plan_problem=cuda_plan_problem, cache=cache,
                          fit_shared_memory=fit_shared_memory)
    if state_programs is None:
        return plan
    if isinstance(state_programs, bool) or not isinstance(state_programs, numbers.Integral) \
            or state_programs < 0:
        raise ValueError(f"state_programs: must be None or an int >= 0, got {state_programs!r}")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError("state_programs: the rule reads the CUDA device's SM count, and this "
                         "machine has no CUDA; pass state_programs=None for the plan without "
                         "that rule (the narrowed plan differs in block_v_h and num_warps_h)")
    return narrowed_for(plan, dtype, torch.device(device), int(state_programs))




def fit_shared_memory(plan: GDNDetPlan, smem: int) -> GDNDetPlan:
    """The rule on a CUDA device of ``smem`` bytes of shared memory per block: under
    Hopper's, local_form 2's K blocks stay at 64 columns of 4 warps (one 128-column block
    takes 112 KiB on sm_80 / sm_120, more than consumer GPUs' 99 KiB; on A100 it fits but
    spills 872 bytes of registers and is untimed); under A100's (consumer Ampere, Ada and
    Blackwell: 99 KiB) the state kernels' stages are capped at 2 (at 16-bit K = V = 128, 72
    and 97 KiB against 113 and 161 KiB with 3, by Triton 3.6 compiles for sm_86 and sm_120:
    docs/benchmarks/gdn.md; not timed on such GPUs)."""
    if smem < HOPPER_SHARED_MEMORY and plan.local_form == 2 and \
            plan.block_k_local == plan.block_k == 128:
        plan = dataclasses.replace(plan, block_k_local=64, num_warps_local=4, l2norm_local=0)
    if smem < A100_SHARED_MEMORY and plan.num_stages_h > 2:
        return dataclasses.replace(plan, num_stages_h=2)
    return plan


#: what :func:`make_plan`'s ``state_programs`` rule sets: launch shapes of the two state
#: kernels only (no buffer depends on them, so a workspace serves either plan)
NARROWED_FIELDS = {"block_v_h": 32, "num_warps_h": 4}


def narrowed_for(plan: GDNDetPlan, dtype: torch.dtype, device: torch.device,
                 state_programs: int) -> GDNDetPlan:
    """The rule's ``plan`` after :func:`make_plan`'s ``state_programs`` rule: its
    ``block_v_h = 32``, ``num_warps_h = 4`` copy (memoised) on CUDA where
    :func:`narrow_states_pay` says so, else ``plan``."""
    if device.type != "cuda" or not narrow_states_pay(plan, dtype, state_programs,
                                                      sm_count(device)):
        return plan
    return cached_plan(_PLANS, (plan, *NARROWED_FIELDS.items()),
                       lambda: dataclasses.replace(plan, **NARROWED_FIELDS))


def narrow_states_pay(plan: GDNDetPlan, dtype: torch.dtype, state_programs: int,
                      sms: int) -> bool:
    """Whether :func:`make_plan`'s ``state_programs`` rule narrows the state kernels' V
    block of the rule's ``plan`` to 32: 16-bit intermediates, K = 128 (where it was timed
    and checked against float64 on an H200; K = 100 with block_v_h = 32 faulted:
    :func:`cuda_plan_problem`), block_v_h = 64 (block_v 64 or 128), and
    ``state_programs * ceil(V / 64) <= sms / 2``."""
    return (dtype != torch.float32 and bool(plan.store_16bit)
            and plan.head_k_dim == plan.block_k == 128 and plan.block_v_h == 64
            and plan.block_v in (64, 128)
            and 0 < state_programs * -(-plan.head_v_dim // 64) * 2 <= sms)


def _rule(K: int, V: int, dtype: torch.dtype, device: torch.device,
          plan_type: type[GDNDetPlan] = GDNDetPlan) -> GDNDetPlan:
    cuda = device.type == "cuda"
    block_k = next_power_of_2(max(K, 16))
    block_v_full = next_power_of_2(max(V, 16))
    block_v = min(64, block_v_full) if cuda else block_v_full
    store_16bit = int(block_k >= 32 and block_v_full >= 32)
    wide = dtype != torch.float32 and store_16bit
    block_v_h = block_v
    if cuda and dtype != torch.float32 and K == block_k == 128 and V == 128:
        block_v = 128  # output and dv_local kernels over the whole V: faster on an H200
    # the 16-bit [128, 64] state tiles, where the H200 timed rec_form 1 with 3 stages and
    # local_form 2 (K-block programs) with 64-column V steps faster
    big_rec = cuda and wide and block_k * block_v_h >= 8192
    # one K block of 8 warps at 16-bit K = V = 128: the K-block kernel no longer forms
    # do v_new^T once per K block (faster on an H100 than two blocks of 64 at 4 warps)
    one_kblock = big_rec and K == block_k == 128 and V == 128
    return plan_type(
        head_k_dim=K,
        head_v_dim=V,
        block_k=block_k,
        block_v=block_v,
        block_v_h=block_v_h,
        block_v_local=(64 if big_rec else min(32, block_v_full)) if cuda else block_v_full,
        block_k_local=block_k if one_kblock else min(64, block_k),
        num_warps_h=8 if cuda and block_k * block_v_h >= 8192 else 4,
        num_warps_local=8 if one_kblock or (not big_rec and cuda
                                            and block_k * block_v_full >= 4096) else 4,
        num_stages_h=(3 if big_rec else 2) if wide else 1,
        rec_form=int(big_rec),
        local_form=2 * int(big_rec),
        fp32_dots=(0 if wide else 2) if cuda else 1,
        store_16bit=store_16bit,
        l2norm_block_rows=16 if cuda else 256,
        gate_block_t=128 if cuda else 256,
        keep_states=0,
        l2norm_local=int(one_kblock),
    )
