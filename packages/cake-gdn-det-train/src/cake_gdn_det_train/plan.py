"""GDNDetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.linear_attention import make_head_plan
from cake_core.plan import cached_plan
from cake_core.triton_utils import next_power_of_2, sm_count

#: Tokens per chunk (fixed: the WY/UT triangular system is solved on 64 x 64 tiles).
CHUNK_SIZE = 64
#: Largest head dims K and V (a whole state row block stays in registers).
MAX_HEAD_DIM = 256


@dataclasses.dataclass(frozen=True)
class GDNDetPlan(Plan):
    """Execution plan of the det chunked Gated DeltaNet kernels.

    Fields:
        head_k_dim / head_v_dim: K and V, the q/k and v head dims.
        block_k: K padded to a power of two >= 16 (the whole K per program).
        block_v: columns of V per program in the output kernel and the backward's dv_local
            kernel (power of two >= 16); V is split into ``ceil(V / block_v)`` independent
            column blocks. Bits are promised per plan only.
        block_v_h: the same for the two state-recurrence kernels (fwd_h, bwd_dh; the
            recurrence never mixes columns of V). They
            run ``N * HV * ceil(V / block_v_h)`` programs (``rec_form = 1``: on one grid
            axis, V blocks fastest; else a 3-axis grid): with one long sequence (N = 1) and
            HV = 32, 64-column blocks fill 64 of an H200's 132 SMs, 32-column blocks 128.
            The rule takes ``block_v_h = min(64, V rounded up)`` on CUDA (``block_v`` may be
            wider) and the whole V under the interpreter.
        num_warps_h / num_warps_local: warps of the state-recurrence (forward and
            backward) and backward chunk-local kernels (the others run 4).
        l2norm_block_rows: rows per program of the q/k L2-norm kernel.
        gate_block_t: tokens per program of the in-kernel gate / beta
            sigmoid kernels (power of two); also the first stage of the fixed-order sums
            dA_log and ddt_bias (one partial per block of ``gate_block_t`` tokens), so
            their bits depend on it.
        fp32_dots: precision of the dots whose operands are fp32 (the in-chunk triangular
            solve always; every dot when the inputs are fp32): 0 = "tf32", 1 = "ieee" (full
            fp32 on CUDA cores: slow, and it spills registers at these tile sizes),
            2 = "tf32x3" (three TF32 products, close to fp32). The interpreter always
            computes fp32.
        store_16bit: 1 = with bf16/fp16 inputs, the chunk intermediates (T, w, u, v_new, the
            chunk states h, and the backward's dh and dv_new) are stored in the inputs'
            dtype and the big dots take 16-bit operands with fp32 accumulation (as FLA:
            half the memory traffic, tensor cores at full rate); 0 = all fp32. States
            carried across chunks, g's cumulative sum and all gradients accumulate in
            fp32 either way. fp32 inputs ignore it. Needs block_k >= 32 and V > 16: with
            16-wide 16-bit dots an H200 (Triton 3.6) gave wrong outputs (K=32, V=16).
        block_v_local: columns of V per step of the backward local kernel's loop over V
            (power of two >= 16, <= V rounded up); its sums over V blocks run in index
            order, so bits depend on it.
        keep_states: 1 = the autograd forward (and :func:`chunk_gdn_det_fwd`) also keeps, for
            the backward, the chunk states h ``[NC, HV, K, V]`` (NC = the chunks of all
            sequences), w ``[NT, HV, K]`` and v_new ``[NT, HV, V]`` in the intermediates'
            dtype, and g's fp32 within-chunk cumulative sum ``[NT, HV]``, in fresh tensors
            (never a workspace's buffers); the backward then skips the chunk prep and the
            forward state recurrence (it runs only its own kernels). Memory, per layer: 2 (K + V)
            bytes per token and value head for w and v_new plus 2 K V bytes per chunk and
            value head for h with bf16 (twice that with fp32 intermediates), plus 4 bytes
            per token and value head for g's cumsum; at 32768 tokens (one sequence, 512
            chunks), HV = 32, K = V = 128, bf16: h 0.54 GB + w 0.27 GB + v_new 0.27 GB +
            g_cumsum 0.004 GB = 1.08 GB (1.0 GiB), on top of T's 0.13 GB. 0 (the rule's
            choice, as FLA: keep memory low) = the backward recomputes them. Same bits
            either way under the interpreter (tested); the backward's recompute runs the same
            computation on the same inputs, through kernel variants that differ only in
            reading the kept T and in not storing a final state, so on a GPU the equality is
            the compiler's: equal hashes on an H200 at the benchmark's cases a and b (session
            13), where it took 12-15% less fwd+bwd time. The kept tensors are
            the forward's: a caller of the low-level functions must not modify the inputs
            in place between :func:`chunk_gdn_det_fwd` and :func:`chunk_gdn_det_bwd` (with 0
            the backward would recompute from the modified inputs, with 1 it mixes both;
            neither is the gradient of the forward that ran; the autograd entry refuses it).
            The custom ops that ``torch.compile`` traces always recompute (T and the
            states).
        num_stages_h: software-pipelining stages of the two chunk-recurrence kernels
            (shared memory grows with it).
        rec_form: operand form of the two chunk-recurrence kernels (fwd_h, bwd_dh).
            0 = the decays multiply the ``[64, K]`` tiles (k, q) and k, q, w are
            transposed in registers (the rule's choice: the path checked on an H200);
            1 = FLA's form: the transposed operands (k in fwd_h; q, w in bwd_dh) are
            loaded as ``[K, 64]`` tiles straight into the dots and the decays scale the
            ``[64, block_v_h]`` tiles (v_new, k @ dS, do) instead: fewer register products,
            transposes and shared-memory round trips per serial step. Same math, other
            rounding (bits differ from 0, still fixed per plan). The rule's choice on
            CUDA at 16-bit K = 128 (docs/benchmarks/gdn_speed_plan.md).
        local_form: 0 = the backward chunk-local gradients in one kernel per (chunk, value
            head) holding whole-K ``[64, K]`` fp32 accumulators (kernels/bwd_local.py);
            2 = in three kernels (kernels/bwd_local_kblock.py, FLA's ``chunk_bwd_dqkwg``
            split): one per (chunk, value head, K block of ``block_k_local``), partial dT
            and row sums through workspaces, added in K-block order by one per (chunk,
            value head), then dk's dA terms per (chunk, q/k head, K block) (its two later
            kernels run 4 warps). Other summation order: other bits than 0,
            fixed per plan. The rule's choice on CUDA at 16-bit K = 128 (an H200: faster).
        block_k_local: columns of K per block of ``local_form = 2`` (power of two >= 16,
            <= block_k); unused with ``local_form = 0``. Bits depend on it.

    Limits found on an H200 (Triton 3.6), checked by :func:`cuda_plan_problem` when a
    plan runs on CUDA: K, V <= 128; fp32 intermediates (fp32 inputs, or V <= 16, where the
    rule takes ``store_16bit = 0``) K <= 64 (larger fp32 tiles overflow the 227 KiB of
    shared memory); num_warps_local 8 only with block_k * V >= 4096 (8 warps
    on 16 x 16 tiles made an illegal memory access); ``block_k_local`` >= 32 with
    ``local_form = 2`` and 16-bit intermediates (the 16-wide 16-bit dot fault of
    ``store_16bit``);
    ``block_k_local >= min(64, block_k)`` where ``local_form = 2`` has ``block_v_local >=
    64`` (K blocks of 32 with 64-wide V blocks gave wrong dk / dg / dbeta on an H200; right
    under the interpreter, so a compiler fault); ``block_k_local >= 32`` where
    ``local_form = 2`` has ``num_warps_local > 4`` (8 warps with K blocks of 16 made an
    illegal memory access at fp32 K = V = 40, 2026-12-03; not narrowed further).
    """

    family: ClassVar[str] = "cake-gdn-det-train"
    format_version: ClassVar[int] = 1

    head_k_dim: int
    head_v_dim: int
    block_k: int
    block_v: int
    num_warps_h: int
    num_warps_local: int
    num_stages_h: int
    block_v_local: int
    l2norm_block_rows: int
    fp32_dots: int
    store_16bit: int
    gate_block_t: int
    rec_form: int
    local_form: int
    block_k_local: int
    keep_states: int
    block_v_h: int

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
        self.require_flags("store_16bit", "keep_states")
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
        self.require_mode(Mode.DET)

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
                "stages, on an H200, Triton 3.6, 2026-12-01; right at K = 128, with fp32 at "
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
                "access on an H200, Triton 3.6, 2026-12-03; the same at 4 warps with V = 32, "
                "and 8 warps at block_k_local=64, were right; not narrowed further)")
    return None


def make_plan(head_k_dim: int, head_v_dim: int, dtype: torch.dtype,
              device: torch.device | str, *, state_programs: int | None = None) -> GDNDetPlan:
    """Pick the plan for heads of ``head_k_dim`` (K) and ``head_v_dim`` (V) on ``device``.

    ``state_programs``: the number of (sequence, value head) pairs of the calls the plan is
    for (``N * HV``; the entries pass it), or ``None``. It changes two launch fields only: on CUDA
    with 16-bit intermediates, K = 128 and block_v_h = 64, when ``state_programs *
    ceil(V / 64)`` is at most half the GPU's SM count, ``block_v_h = 32`` (twice the state
    kernels' programs): an H200, 2026-12-01 (Triton 3.6), case a of the benchmark (one
    sequence, HV = 32: 64 programs for 132 SMs) fwd+bwd 11.24 -> 10.48 ms, while at case d
    (128 programs) it was slower (fwd 1.29 -> 1.46 ms, bwd 2.26 -> 2.46 ms); the same bits
    at both there (equal hashes; under the interpreter, whose dots are numpy products of
    the tile widths, bits may differ). The narrowed plan's state kernels run 4 warps, not
    the rule's 8 (an H200, 2026-12-03, case a: forward state kernel 779 -> 669 us, backward
    943 -> 850 us, fwd+bwd 9.41 -> 9.14 ms, the same bits; at case d, not narrowed, 4 warps
    made the backward one 173 -> 396 us, so the wide plan keeps 8). Otherwise the plan
    stays. A workspace made for either plan serves both (the buffers are the same).

    Rules (no timing): ``block_k = next_power_of_2(max(K, 16))``;
    on CUDA ``block_v = block_v_h = min(64, next_power_of_2(max(V, 16)))``, except
    ``block_v = 128`` at K = V = 128 with 16-bit inputs (an H200, 2026-12-01: the output
    kernel 0.67 -> 0.59 ms and the backward's dv_local 0.44 -> 0.31 ms at case a, fwd+bwd
    10.16 -> 9.88 ms there, 4.96 -> 4.92 at b, 2.79 at d either way; the same bits; right
    against float64 in bf16 and fp16, packed, with kept states), with 4 warps per kernel
    (8 for the state kernel when ``block_k * block_v_h >= 8192``, 8 for the backward local
    kernel when ``block_k * V >= 4096``, except 4 with ``local_form = 2``), recurrence
    kernels pipelined on 2 stages with 16-bit intermediates, 1 with fp32; under the
    interpreter the whole V in one block (fewer programs, each costing Python time). The
    gate kernels take 128 tokens per program on CUDA, 256 under the interpreter. On CUDA
    fp32 dots are "tf32x3" (``fp32_dots=2``; "ieee" spills registers and compiles for
    minutes), except with 16-bit intermediates, where only the chunk solve has fp32
    operands: "tf32" there (an H200 run: 23% faster forward, errors against float64
    unchanged to two digits, at K = V = 128 bf16). 16-bit inputs keep 16-bit intermediates
    (``store_16bit=1``); under the interpreter ``fp32_dots=1`` (it computes fp32
    regardless). ``store_16bit=1`` when block_k >= 32 and V > 16, else 0. On CUDA with
    16-bit intermediates and ``block_k * block_v_h >= 8192`` (K = 128): ``rec_form = 1`` and
    ``num_stages_h = 3`` (an H200 run: 8-9% faster fwd+bwd at K = V = 128 bf16, every
    configuration right against float64, bitwise repeatable); elsewhere ``rec_form = 0``.
    ``local_form = 2`` with
    ``num_warps_local = 4`` where ``rec_form = 1`` (an H200, session 26: the chunk-local
    kernels 11-13% faster than form 1 at cases a and b; form 1, the rule from 2026-11-30 to
    12-03, was 4-7% faster fwd+bwd than ``local_form = 0``; ``block_k_local = 32`` and
    ``block_v_local = 16`` or 32 were slower), else 0; ``block_k_local = min(64, block_k)``.
    ``keep_states = 0`` everywhere (the backward recomputes the chunk states: low memory,
    as FLA). ``block_v_local``: 64 where ``rec_form = 1`` (an H200 run, 2026-11-30: 5%
    faster fwd+bwd at K = V = 128 bf16 than 32, right against float64 at K = 128 with
    V = 64 and 128, bf16 and fp16), else min(32, V rounded up) on CUDA; V rounded up on the CPU.

    Raises:
        ValueError: if K or V is outside [1, 256], ``dtype`` is not fp32/bf16/fp16, or on
            CUDA the limits of :func:`cuda_plan_problem` (K, V <= 128; fp32 inputs or
            V <= 16: K <= 64); if ``state_programs`` is neither None nor an int >= 0, or is
            given for a CUDA device on a machine without CUDA (the rule reads that GPU's
            SM count).
    """
    plan = make_head_plan(head_k_dim, head_v_dim, dtype, device, max_head_dim=MAX_HEAD_DIM,
                          rule=_rule, cuda_plan_problem=cuda_plan_problem, cache=_PLANS)
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


def _rule(K: int, V: int, dtype: torch.dtype, device: torch.device) -> GDNDetPlan:
    cuda = device.type == "cuda"
    block_k = next_power_of_2(max(K, 16))
    block_v_full = next_power_of_2(max(V, 16))
    block_v = min(64, block_v_full) if cuda else block_v_full
    store_16bit = int(block_k >= 32 and block_v_full >= 32)
    wide = dtype != torch.float32 and store_16bit
    # H200 2026-11-30 (docs/benchmarks/gdn.md): at K = V = 128 bf16 the backward-recurrence
    # form with 3 stages took 14.5 ms fwd+bwd at case a (default form, 2 stages: 15.7 ms);
    # adopted where it was measured, the 16-bit [128, 64] state tiles. Same place, same
    # day: split local kernels took case a 14.49 -> 13.94 ms, case b 7.66 -> 7.15 ms. Session 10
    # (same GPU and versions): block_v_local = 64 with them, case a 13.14 -> 12.43 ms and
    # 12.99 -> 12.37 (two runs), case b 5.47 -> 5.18 / 5.40 -> 5.13, right against float64.
    block_v_h = block_v  # the state kernels' V block
    if cuda and dtype != torch.float32 and K == block_k == 128 and V == 128:
        # H200 2026-12-01 (session 15, docs/benchmarks/gdn.md): the output and dv_local
        # kernels over the whole V (q, k and the decays loaded once per chunk and value head,
        # not twice): fwd_o 0.671 -> 0.594 ms, dv_local 0.436 -> 0.307 ms at case a, the same
        # bits; the state kernels keep 64 columns
        block_v = 128
    big_rec = cuda and wide and block_k * block_v_h >= 8192
    return GDNDetPlan(
        head_k_dim=K,
        head_v_dim=V,
        block_k=block_k,
        block_v=block_v,
        num_warps_h=8 if cuda and block_k * block_v_h >= 8192 else 4,
        # local_form = 2 (session 26, an H200): its K-block kernel at 4 warps 925 us at case
        # b against 1505 at 8 (4 warps spill 184 bytes in an offline build and still win)
        num_warps_local=4 if big_rec else 8 if cuda and block_k * block_v_full >= 4096 else 4,
        num_stages_h=(3 if big_rec else 2) if wide else 1,
        block_v_local=(64 if big_rec else min(32, block_v_full)) if cuda else block_v_full,
        l2norm_block_rows=16 if cuda else 256,
        fp32_dots=(0 if wide else 2) if cuda else 1,
        store_16bit=store_16bit,
        gate_block_t=128 if cuda else 256,
        rec_form=int(big_rec),
        local_form=2 * int(big_rec),
        block_k_local=min(64, block_k),
        keep_states=0,
        block_v_h=block_v_h,
    )

