"""KDADetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.linear_attention import inter_dtype as inter_dtype  # re-exported
from cake_core.linear_attention import make_head_plan
from cake_core.triton_utils import next_power_of_2

#: Tokens per chunk (fixed: the WY/UT triangular system is solved on 64 x 64 tiles).
CHUNK_SIZE = 64
#: Tokens per sub-chunk: pairs of tokens in different sub-chunks meet through a dot with a
#: per-channel reference decay between them; pairs inside one are summed elementwise.
SUB_CHUNK = 16
#: Largest head dims K and V.
MAX_HEAD_DIM = 256

@dataclasses.dataclass(frozen=True)
class KDADetPlan(Plan):
    """Execution plan of the det chunked Kimi Delta Attention kernels.

    Fields:
        head_k_dim / head_v_dim: K and V, the q/k and v head dims.
        chunk_size: tokens per chunk (64, the only value the kernels take).
        block_k: K padded to a power of two >= 16 (the whole K per program of the
            recurrence and output kernels).
        block_k_inner: key channels per step of the chunk-prep and backward chunk kernels'
            loops over K (power of two >= 16, <= block_k); their pair products and q/k
            gradients are formed block by block, summed in index order (bits depend on it).
        block_v: columns of V per program of the output kernel (power of two >= 16, <= V
            rounded up); the state kernels take ``block_v_h`` (format 9; before it block_v
            set both).
        block_v_bwd: columns of V per step of the backward chunk kernel's loop over V (its
            sums over V blocks run in index order, so bits depend on it).
        num_warps_prep / num_warps_h / num_warps_o / num_warps_bwd: warps of the chunk
            prep (cumulative decay, gated k k^T and q k^T, triangular solve, w and u), the
            forward state recurrence (also run by the backward's recompute; the dS kernel
            takes ``num_warps_dh``), the output kernel and the backward chunk kernel.
        num_stages_h: software-pipelining stages of the forward state recurrence (the dS
            kernel takes ``num_stages_dh``).
        keep_a: 1 = the autograd forward keeps each chunk's T = (I + A)^-1 for the backward
            (no recompute of the gated k k^T and the solve); 0 = recompute. Same bits
            either way (the forward rounds T to its stored dtype before using it).
        l2norm_block_rows / num_warps_l2norm: rows per program of the q/k L2 norm.
        gate_block_t / num_warps_gate: tokens per program of the in-kernel gate and beta
            sigmoid kernels; also the first stage of the fixed-order sums dA_log and
            ddt_bias (one partial per block), so their bits depend on it.
        fp32_dots: precision of dots with fp32 operands: 0 = "tf32", 1 = "ieee",
            2 = "tf32x3". The interpreter always computes fp32.
        store_16bit: 1 = with bf16/fp16 inputs the chunk intermediates (T, w, u, v_new, the
            chunk states h, the backward's dh and dv_new) are stored in the inputs' dtype
            and the big dots take 16-bit operands (fp32 accumulation), as FLA; 0 = fp32.
            Needs block_k >= 32, block_v >= 32, block_v_h >= 32 and V > 16.
        diag_load: how the pair products' terms inside a 16-token sub-chunk (chunk prep and
            backward chunk kernel) get each step's partner. 0 = selected out of the
            register tiles (a 3-D reshape, masked sum and broadcast per step: layout
            conversions through shared memory; the rule's choice, the path checked on an
            H200). 1 = the partner rows of q/k and G loaded from memory (that token's row,
            L1/L2-resident). 2 = as 1, and the backward's entries of dA and the gated dAqk
            loaded from an fp32 copy of each chunk's two ``[64, 64]`` matrices (written by
            the same program, ``[B * T, HV, 128]`` fp32 scratch) instead of a masked row
            sum over the register tile. All three form the same terms and sum them in the
            same order (docs/benchmarks/kda_speed_plan.md).
        bwd_split: 1 = the backward chunk kernel stops before the pair products'
            gradients (writing dA and the gated dAqk to an fp32 ``[B * T, HV, 128]``
            scratch); a kernel with one program per 16-token sub-chunk and value head
            (``[16, block_k_inner]`` tiles, sums in a fixed order: earlier sub-chunks by one
            dot, the sub-chunk itself by 16 loaded steps, later sub-chunks by one dot, per
            key block in index order) forms them, and a last kernel dg's reverse cumsum.
            Different sum order from 0 (other bits, same math). 0 = one program per chunk
            (the rule's choice).
        fwd_split: 1 = the chunk prep (forward, and the backward's recompute) gets its
            gated pair products (A = k k^T raw, to an fp32 ``[B * T, HV, 64]`` scratch, and
            Aqk) from a kernel per 16-token sub-chunk and value head (``[16, block_k_inner]``
            tiles; earlier sub-chunks by one dot, key blocks in index order; the sub-chunk
            itself as ``pairs_diag`` says), after a kernel that forms G; the prep keeps the
            solve, w and u. Other sum order than 0 (other bits, same math).
        num_warps_intra: warps of the sub-chunk kernels (used only with ``bwd_split`` or
            ``fwd_split``).
        pairs_diag: how the ``fwd_split`` pairs kernel forms the terms inside its own
            16-token sub-chunk (used only with ``fwd_split``). 0 = 16 serial steps, each
            with the partner token's k and G rows loaded and one exp per pair and channel
            shared by A and Aqk, kept in ``[16, 16]`` tiles. 1 = all 16 x 16 pairs of one
            key block at once as a ``[16, 16, block_k_inner]`` broadcast (no serial loop).
            Both sum key blocks in index order. 2 = a second, token-parallel kernel
            (``kda_fwd_pairs_tok_kernel``, FLA's ``chunk_kda_fwd_intra_token_parallel``
            form: one program per token and 4 value heads, 4 warps; all key channels of a
            pair summed in one reduction; the rule's choice: H200 case a forward 2.27 ->
            1.74-1.88 ms, fwd+bwd 8.61 -> 7.77-7.93 ms, session 16). Each value is other
            bits than the others' (same math, fixed per plan).
            docs/benchmarks/kda_fwd_plan.md.
        num_warps_pairs: warps of the ``fwd_split`` pairs kernel (the forward's, and the
            backward's recompute of Aqk); ``num_warps_intra`` keeps the other sub-chunk
            kernels (4 in the rule, as before the field existed).
        bwd_diag: how the backward's sub-chunk kernel (``bwd_split = 1``; unused without it)
            forms the terms of dq, dk, dg and dbeta between tokens of the same 16-token
            sub-chunk. 0 = 16 loaded partner steps per key block inside
            ``kda_bwd_intra_kernel``. 1 = a second, token-parallel
            kernel (``kda_bwd_intra_tok_kernel``, the backward counterpart of
            ``pairs_diag = 2``: one program per token and 4 value heads, all key channels at
            once) adds them to the rows the sub-chunk kernel stored. Same math, other bits
            than 0 (fixed per plan). The rule's choice since session 17: on an H200 the
            backward at case a 6.37 -> 4.73 ms, forward+backward 7.79 -> 6.22 ms.
        inv_blocked: how the forward's chunk prep (or ``kda_fwd_inv_kernel`` with
            ``inv_kernel = 1``; unused with 2) inverts ``I + A`` (64 x 64, unit lower
            triangular; the backward loads the kept T when ``keep_a``). 0 =
            :func:`cake_core.triangular.unit_lower_inverse`, 6 block-doubling steps of two
            64^3 dots (the rule's until session 18). 1 =
            :func:`cake_core.triangular.unit_lower_inverse_blocked`: the four 16 x 16
            diagonal blocks inverted apart (batched 16^3 dots), then the last 2 steps on the
            whole tile: 4 of the 12 whole-tile dots (FLA inverts the 16 x 16 blocks apart
            too, then merges). Same math; the blocked form's first steps are the whole-tile
            form's with exact zeros left out, and on an H200 both gave the same bits at the
            benchmark's cases a and b. The rule's choice since session 18 (the prep kernel
            481 -> 392 us per forward at case a).
        keep_aqk: 1 = the forward keeps each chunk's gated ``q k^T`` (``Aqk``, ``[B * T,
            HV, 64]`` in the intermediates' dtype, FLA keeps it too) in the saved set beside
            T, stacked as ``A`` ``[2, B * T, HV, 64]`` (T, then Aqk), and the backward
            launches neither pairs kernel (it recomputed Aqk with them: ~0.5 ms of its 4.7
            at case a on an H200, session 17's profile). Needs ``keep_a = 1`` and
            ``fwd_split = 1``. The same kernels on the same inputs: the same bits as 0 (on
            an H200 at the benchmark's cases a and b too). 0 = the backward recomputes Aqk.
            1 is the rule's choice since session 19 (fwd+bwd 6.17 -> 5.81 ms at case a).
        block_v_h: columns of V per program of the two state kernels (the forward state
            recurrence and the backward dS recurrence; power of two >= 16, <= V rounded up);
            the recurrences never mix columns of V (on an H200 the bits at the benchmark's
            cases a-c did not depend on it, session 20; under the interpreter they can, its
            matmul's summation order following the tile shape).
        num_warps_dh / num_stages_dh: warps and software-pipelining stages of the backward
            dS kernel, apart from ``block_v``, ``num_warps_h`` and
            ``num_stages_h`` (session 20, H200, case a: the forward
            state kernel 195 -> 179 us with 4 warps where the dS kernel went 312 -> 419; the
            output kernel 203 -> 164 us with 128 columns where the state kernels slowed).
        inv_kernel: where the forward (and a backward that recomputes T, ``keep_a = 0``)
            inverts ``I + A`` (used only with ``fwd_split = 1``: its input is the pairs
            kernels' fp32 raw ``k k^T``; without it the prep forms A and inverts it itself).
            0 = inside the chunk prep (``inv_blocked`` says how). 1 =
            ``kda_fwd_inv_kernel``, one program per chunk and value head with
            ``num_warps_inv`` warps, the prep's own whole-tile inverse (as ``inv_blocked``
            says), T rounded and stored in A's dtype as the prep does, then the prep loads
            it as the backward does: the same bits as 0 (the same ops; under the
            interpreter, and on an H200 at case b with 4 and 8 warps, session 21). 2 = the
            same kernel, FLA's ``solve_tril`` order: the four
            16 x 16 diagonal blocks inverted apart (block doubling), then merged block by
            block (``T_rc = -T_rr sum_{c <= m < r} A_rm T_mc``; 16 dots of 16^3 in place of
            four of 64^3); other bits than 0 / 1 (same math). On an H200 at case b (session
            21) the prep with the inverse took 913 us per forward; the inverse alone 218 us
            (1, 4 warps), 116-117 us (2, 2 warps), and the prep without it 327-329 us (287-292
            with 4 warps; two calls).
        num_warps_inv: warps of ``kda_fwd_inv_kernel`` (``inv_kernel`` 1 or 2).
        tok_heads / num_warps_tok: value heads per program (a power of two, 1 to 64) and
            warps of the forward's token-parallel kernel (``pairs_diag = 2``); format 11,
            before it 4 and 4. The tile ``[tok_heads, K]`` and the warps set the order in
            which each pair's sum over the K channels is reduced: other values can give
            other bits (on an H200 at case b 2 / 1 did, 1 / 1 and 8 / 8 did not).
        tok_heads_bwd / num_warps_tok_bwd: the same for the backward's token-parallel
            kernel (``bwd_diag = 1``); its only reduction over K is dbeta's.
    """

    family: ClassVar[str] = "cake-kda-det-train"
    format_version: ClassVar[int] = 1

    head_k_dim: int
    head_v_dim: int
    chunk_size: int
    block_k: int
    block_k_inner: int
    block_v: int
    block_v_bwd: int
    num_warps_prep: int
    num_warps_h: int
    num_warps_o: int
    num_warps_bwd: int
    num_stages_h: int
    keep_a: int
    l2norm_block_rows: int
    num_warps_l2norm: int
    gate_block_t: int
    num_warps_gate: int
    fp32_dots: int
    store_16bit: int
    diag_load: int
    bwd_split: int
    fwd_split: int
    num_warps_intra: int
    pairs_diag: int
    num_warps_pairs: int
    bwd_diag: int
    inv_blocked: int
    keep_aqk: int
    block_v_h: int
    num_warps_dh: int
    num_stages_dh: int
    inv_kernel: int
    num_warps_inv: int
    tok_heads: int
    num_warps_tok: int
    tok_heads_bwd: int
    num_warps_tok_bwd: int

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_int_fields()
        self.require_in_range("head_k_dim", 1, MAX_HEAD_DIM)
        self.require_in_range("head_v_dim", 1, MAX_HEAD_DIM)
        if self.chunk_size != CHUNK_SIZE:
            self._fail(f"chunk_size must be {CHUNK_SIZE}, got {self.chunk_size}")
        self.require_power_of_two("block_k", "block_k_inner", "block_v", "block_v_bwd",
                                  "block_v_h", minimum=16)
        if self.block_k_inner > self.block_k:
            self._fail("block_k_inner must be <= block_k")
        self.require_power_of_two("l2norm_block_rows", "gate_block_t")
        if self.block_k < self.head_k_dim:
            self._fail("block_k must be >= head_k_dim")
        for name in ("block_v", "block_v_bwd", "block_v_h"):
            if getattr(self, name) > _bvf(self.head_v_dim):
                self._fail(f"{name} must be <= head_v_dim rounded up to a power of two (>= 16)")
        self.require_in_range("fp32_dots", 0, 2)
        self.require_flags("store_16bit", "keep_a", "bwd_split", "fwd_split", "bwd_diag",
                           "inv_blocked", "keep_aqk")
        if self.keep_aqk and not (self.keep_a and self.fwd_split):
            self._fail("keep_aqk=1 needs keep_a=1 and fwd_split=1 (Aqk kept beside T, formed "
                       "by the pairs kernels)")
        self.require_in_range("inv_kernel", 0, 2)
        self.require_power_of_two("tok_heads", "tok_heads_bwd")
        self.require_in_range("tok_heads", 1, 64)
        self.require_in_range("tok_heads_bwd", 1, 64)
        self.require_in_range("pairs_diag", 0, 2)
        self.require_in_range("diag_load", 0, 2)
        self.require_in_range("num_stages_h", 1, 4)
        self.require_in_range("num_stages_dh", 1, 4)
        if self.store_16bit and (self.block_k < 32 or _bvf(self.head_v_dim) < 32
                                 or min(self.block_v, self.block_v_h) < 32):
            self._fail("store_16bit=1 needs block_k >= 32, block_v >= 32, block_v_h >= 32 "
                       "and head_v_dim > 16")
        self.require_warps("num_warps_prep", "num_warps_h", "num_warps_o", "num_warps_bwd",
                           "num_warps_l2norm", "num_warps_gate", "num_warps_intra",
                           "num_warps_pairs", "num_warps_dh", "num_warps_inv",
                           "num_warps_tok", "num_warps_tok_bwd")
        self.require_mode(Mode.DET)

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
    measured on 2026-11-30 against the float64 recurrence (``shared/gpu/plan_configs.py``,
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
    if plan.block_k >= 128 and plan.block_v_h >= 64 and plan.num_stages_dh > 2:
        return ("on CUDA K > 64 with block_v_h >= 64 needs num_stages_dh <= 2 "
                "(the dS kernel asked for 256 KiB of shared memory with 3 stages, "
                "16-bit intermediates, on an H200, Triton 3.6: more than its 227 KiB)")
    if plan.block_k_inner > 32:
        return ("on CUDA block_k_inner must be <= 32 (64 made dk, dg and dbeta differ from "
                "call to call at K = V = 128, bf16, on an H200 running nothing else, Triton "
                "3.6: a fault of the compiled backward chunk kernel)")
    if plan.block_k >= 128 and plan.num_warps_bwd >= 4:
        return ("on CUDA num_warps_bwd must be <= 2 at K > 64: 4 gave dk and dg 14-20% off "
                "the float64 reference at K = V = 128, bf16, and 8 gave dk, dg and dbeta that "
                "differed from call to call (11 of 96 batches of 12 calls while other "
                "processes shared the GPU; 2: 0 of 96), on an H200, Triton 3.6")
    if fp32_inter and plan.block_k_inner == 16 and plan.block_k > 16:
        return ("on CUDA fp32 intermediates need block_k_inner >= 32 when K > 16 (16 made an "
                "illegal memory access in the backward chunk kernel on an H200, Triton 3.6)")
    if plan.block_v_bwd > 32 and not (plan.block_v_bwd == 64 and _bvf(plan.head_v_dim) == 64):
        return ("on CUDA block_v_bwd > 32 only as 64 with V <= 64 (64 with V = 128 gave wrong "
                "dk / dg, 128 failed to run, on an H200, Triton 3.6)")
    if plan.store_16bit and dtype != torch.float32 and plan.block_k < 64:
        return ("on CUDA 16-bit intermediates need K > 32 (store_16bit=1 at K = 32 gave a wrong "
                "o and final state with num_warps_prep=4, and wrong dk / dg at V >= 64 with "
                "either warp count, on an H200, Triton 3.6): use store_16bit=0")
    return None


def make_plan(head_k_dim: int, head_v_dim: int, dtype: torch.dtype,
              device: torch.device | str) -> KDADetPlan:
    """Pick the plan for heads of ``head_k_dim`` (K) and ``head_v_dim`` (V) on ``device``.

    Rules (no timing): ``chunk_size = 64``; ``block_k = next_power_of_2(max(K, 16))``,
    ``block_k_inner = min(block_k, 64)`` under the interpreter, ``min(block_k, 32)`` on CUDA
    (fp32 intermediates: the blocks of pair-product operands then fit the 227 KiB of shared
    memory of an sm_90 program; 16-bit: 64 was not repeatable on an H200, see
    :func:`cuda_plan_problem`, and 32 measured 12% faster forward+backward); on
    CUDA ``block_v_bwd = min(32, V rounded up)``, 4
    warps (8 for the output kernel when ``block_k * block_v >= 8192``; **2** for the
    backward chunk kernel when ``block_k >= 64``: its 8-warp (wgmma) build, the rule up to
    session 23, gave dk, dg and dbeta that differed from call to call in 11 of 96 batches of
    12 calls at case a while other processes shared the H200 (9 of 12 on 2026-12-03), the
    2-warp build in 0 of 96, at 12% more forward+backward time (a 4.86 -> 5.44 ms, b 9.39
    -> 10.54, c 19.32 -> 21.63; docs/determinism.md), right against float64 at K, V in
    {64, 100, 128}, bf16, fp16 and fp32 on the H200; sm_90 builds with 4 warps spilled 2-4
    KB per thread at K = V = 128 (and were wrong there: :func:`cuda_plan_problem`); for the
    chunk prep when ``block_k >= 32``
    with fp32 intermediates: 4 were built wrongly at K = 32 on an H200, see
    :func:`cuda_plan_problem`), 16-bit
    intermediates for bf16/fp16 inputs when ``block_k >= 32`` (``>= 64`` on CUDA) and
    V > 16, "tf32" for the fp32 solve then, "tf32x3" otherwise; under the interpreter the
    whole V in one block and ``fp32_dots=1``; ``fwd_split = 1``, ``bwd_split = 1``,
    ``diag_load = 2`` everywhere (the pair products in their own sub-chunk kernels, partners
    loaded: 10.6 ms forward+backward at the benchmark's case a on an H200 against 29.0 ms
    for 0, 0, 0; every configuration of ``shared/gpu/plan_configs.py`` with them matched
    float64 there; the interpreter takes them too, so that the CPU tests run the GPU's
    paths), ``num_warps_intra = 4`` (docs/benchmarks/kda_speed_plan.md);
    ``pairs_diag = 2`` (the diagonal blocks token-parallel: forward at case a 2.27 -> ~1.9
    ms on an H200, session 16; every ``plan_configs.py`` configuration with it matched
    float64) and ``num_warps_pairs = 4`` (docs/benchmarks/kda_fwd_plan.md);
    the state
    kernels' ``block_v_h = min(64, V rounded up)`` on CUDA, the output kernel's ``block_v =
    min(128, V rounded up)`` with 16-bit intermediates (else 64: at case a 203 -> 164 us);
    the forward state kernel 4 warps and 3 stages with 16-bit intermediates (179 -> 158
    us; 8 warps otherwise when ``block_k * block_v_h >= 8192``), the dS kernel
    ``num_warps_dh`` 8 when ``block_k * block_v_h >= 8192`` (4 measured 312 -> 419 us) and
    2 stages with 16-bit intermediates (3 overflows shared memory at K = 128, 1 was
    slower); session 20 took fwd+bwd at case a 5.75 -> 5.46 ms, b 11.00 -> 10.53, c 22.83
    -> 21.49 (one H200, the same run);
    ``bwd_diag = 1`` (the backward's in-sub-chunk terms token-parallel: forward+backward
    at case a 7.79 -> 6.22 ms, case b 15.32 -> 11.99 ms on an H200, session 17; every
    ``plan_configs.py`` configuration with it matched float64 there);
    ``inv_blocked = 1``
    (the prep's inverse with its 16 x 16 diagonal blocks inverted apart: the prep kernel
    481 -> 392 us per forward at case a on an H200, the same bits as 0 at cases a and b,
    every ``plan_configs.py`` configuration with it matched float64 there, session 18);
    ``keep_aqk = 1`` (the forward keeps Aqk beside T, as FLA does, and the backward skips
    its two pairs kernels: forward+backward 6.17 -> 5.81 ms at case a, 11.84 -> 11.06 ms
    at b on an H200, the same bits as 0 at both, every ``plan_configs.py`` configuration
    with it matched float64 there, session 19); ``inv_kernel = 2`` with ``num_warps_inv =
    2`` everywhere (the forward's T in its own kernel, 16 x 16 blocks merged: on an H200 at
    case b the forward's prep 913 us -> inverse 116 + prep 292 us, fwd+bwd 10.51 -> 9.83 ms,
    a 5.63 -> 5.22, c 21.30 -> 20.29 in the same call; 27 ``plan_configs.py``
    configurations matched float64, session 21) and then ``num_warps_prep = 4`` with 16-bit
    intermediates on CUDA (the prep without the inverse: 327 -> 292 us at b, call 4; 329 ->
    287 in call 3; with ``inv_kernel = 0`` 4 prep warps were float64-right at K = V = 128
    bf16 in earlier sessions' ``plan_configs.py`` runs); on CUDA ``tok_heads = 2``,
    ``num_warps_tok = 1``, ``tok_heads_bwd = 1``, ``num_warps_tok_bwd = 1`` (format 11,
    session 29, H200 at case b: the forward token-parallel kernel 624 -> 435 us, other
    bits; the backward's 1247 -> 1229 us; side by side with FLA a 0.961x, b 0.962x, c
    0.955x; the GPU suite and ``plan_configs.py`` float64-right), 4 / 4 / 4 / 4 under the
    interpreter (fewer, larger programs for the CPU tests).
    Gate kernels
    (tiles of tokens x block_k):
    ``4096 // block_k`` tokens per program on CUDA (16 to 128), 256 under the interpreter.

    Known limit (H200, Triton 3.6, 2026-11-30): the backward's dk, dg and dbeta repeat
    bitwise call after call on a GPU that runs nothing else, but did not while another
    process time-shared the same GPU in session 7 (every plan tried;
    ``shared/gpu/repeat_diag.py kda ... --burn``; not reproduced in 56 calls in session 8;
    seen again under mixed load in session 17, for this rule too):
    an intermittent fault of the compiled backward, under investigation (docs/determinism.md).

    Raises:
        ValueError: K or V outside [1, 256], ``dtype`` not fp32/bf16/fp16, or on CUDA the
            limits of :func:`cuda_plan_problem`.
    """
    return make_head_plan(head_k_dim, head_v_dim, dtype, device, max_head_dim=MAX_HEAD_DIM,
                          rule=_rule, cuda_plan_problem=cuda_plan_problem, cache=_PLANS)


def plan_variant(plan: KDADetPlan, **over: int) -> KDADetPlan:
    """``dataclasses.replace(plan, **over)``, except that an override turning ``keep_a`` or
    ``fwd_split`` off also turns ``keep_aqk`` off when ``over`` does not name it
    (``keep_aqk = 1`` needs both): how the benchmark and the GPU tools apply their
    ``key=value`` overrides to the rule's plan. Raises ``ValueError`` as the plan does."""
    if "keep_aqk" not in over and not (over.get("keep_a", 1) and over.get("fwd_split", 1)):
        over = {**over, "keep_aqk": 0}
    return dataclasses.replace(plan, **over)


def _rule(K: int, V: int, dtype: torch.dtype, device: torch.device) -> KDADetPlan:
    cuda = device.type == "cuda"
    block_k = next_power_of_2(max(K, 16))
    block_v_full = _bvf(V)
    block_v_h = min(64, block_v_full) if cuda else block_v_full
    # CUDA: 16-bit intermediates from K = 64 on (Triton 3.6 built K = 32 wrongly on an H200)
    store_16bit = int(block_k >= (64 if cuda else 32) and block_v_full >= 32)
    wide = dtype != torch.float32 and store_16bit
    # the output kernel: up to 128 columns with 16-bit intermediates (session 20)
    block_v = min(128 if wide else 64, block_v_full) if cuda else block_v_full
    big_h = cuda and block_k * block_v_h >= 8192
    return KDADetPlan(
        head_k_dim=K,
        head_v_dim=V,
        chunk_size=CHUNK_SIZE,
        block_k=block_k,
        block_k_inner=min(block_k, 32 if cuda else 64),
        block_v=block_v,
        block_v_bwd=min(32, block_v_full) if cuda else block_v_full,
        # the prep without the inverse (inv_kernel): 4 warps with 16-bit intermediates
        num_warps_prep=8 if cuda and block_k >= 32 and not wide else 4,
        num_warps_h=8 if big_h and not wide else 4,
        num_warps_o=8 if cuda and block_k * block_v >= 8192 else 4,
        # 2 (no wgmma): the 8-warp build did not repeat under shared load (2026-12-03)
        num_warps_bwd=2 if cuda and block_k >= 64 else 4,
        num_stages_h=3 if wide else 1,
        keep_a=1,
        l2norm_block_rows=16 if cuda else 256,
        num_warps_l2norm=4,
        gate_block_t=min(128, max(16, 4096 // block_k)) if cuda else 256,
        num_warps_gate=4,
        fp32_dots=(0 if wide else 2) if cuda else 1,
        store_16bit=store_16bit,
        diag_load=2,
        bwd_split=1,
        fwd_split=1,
        num_warps_intra=4,
        pairs_diag=2,
        num_warps_pairs=4,
        bwd_diag=1,
        inv_blocked=1,
        keep_aqk=1,
        block_v_h=block_v_h,
        num_warps_dh=8 if big_h else 4,
        num_stages_dh=2 if wide else 1,
        inv_kernel=2,
        num_warps_inv=2,
        # the token-parallel kernels on CUDA (H200, case b, session 29, compile-time shapes):
        # forward 2 heads x 1 warp 435 us (4 x 4: 590, format 10's tile form 624; 8 x 4:
        # 464), backward 1 x 1 1229 us (4 x 4: 1247)
        tok_heads=2 if cuda else 4,
        num_warps_tok=1 if cuda else 4,
        tok_heads_bwd=1 if cuda else 4,
        num_warps_tok_bwd=1 if cuda else 4,
    )
