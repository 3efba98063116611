"""GDNDetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.plan import cached_plan
from cake_core.triton_utils import next_power_of_2

#: Tokens per chunk (fixed: the WY/UT triangular system is solved on 64 x 64 tiles).
CHUNK_SIZE = 64
#: Largest head dims K and V (a whole state row block stays in registers).
MAX_HEAD_DIM = 256


@dataclasses.dataclass(frozen=True)
class GDNDetPlan(Plan):
    """Execution plan of the det chunked Gated DeltaNet kernels.

    Fields:
        head_k_dim / head_v_dim: K and V, the q/k and v head dims.
        chunk_size: tokens per chunk (64; the only value the kernels take today).
        block_k: K padded to a power of two >= 16 (the whole K per program).
        block_v: columns of V per program in the state and output kernels (power of two
            >= 16); V is split into ``ceil(V / block_v)`` independent column blocks (the
            recurrence never mixes columns of V). Bits are promised per plan only.
        num_warps_prep / num_warps_h / num_warps_o / num_warps_local: warps of the
            chunk-prep (cumulative decay, triangular solve, w and u), state-recurrence
            (forward and backward), output and backward chunk-local kernels.
        l2norm_block_rows / num_warps_l2norm: rows per program of the q/k L2-norm kernel.
        gate_block_t / num_warps_gate: tokens per program of the in-kernel gate / beta
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
            fp32 either way. fp32 inputs ignore it.
    """

    family: ClassVar[str] = "cake-gdn-det-train"
    format_version: ClassVar[int] = 3

    head_k_dim: int
    head_v_dim: int
    chunk_size: int
    block_k: int
    block_v: int
    num_warps_prep: int
    num_warps_h: int
    num_warps_o: int
    num_warps_local: int
    l2norm_block_rows: int
    num_warps_l2norm: int
    fp32_dots: int
    store_16bit: int
    gate_block_t: int
    num_warps_gate: int

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_int_fields()
        self.require_in_range("head_k_dim", 1, MAX_HEAD_DIM)
        self.require_in_range("head_v_dim", 1, MAX_HEAD_DIM)
        if self.chunk_size != CHUNK_SIZE:
            self._fail(f"chunk_size must be {CHUNK_SIZE}, got {self.chunk_size}")
        self.require_power_of_two("block_k", "block_v", minimum=16)
        self.require_power_of_two("l2norm_block_rows", "gate_block_t")
        if self.block_k < self.head_k_dim:
            self._fail("block_k must be >= head_k_dim")
        if self.block_v > next_power_of_2(max(16, self.head_v_dim)):
            self._fail("block_v must be <= head_v_dim rounded up to a power of two (>= 16)")
        self.require_in_range("fp32_dots", 0, 2)
        self.require_flags("store_16bit")
        self.require_warps("num_warps_prep", "num_warps_h", "num_warps_o", "num_warps_local",
                           "num_warps_l2norm",
                           "num_warps_gate")
        self.require_mode(Mode.DET)

    @property
    def dot_precision(self) -> str:
        """``input_precision`` of the kernels' fp32 ``tl.dot`` calls."""
        return ("tf32", "ieee", "tf32x3")[self.fp32_dots]


_PLANS: dict[tuple, GDNDetPlan] = {}


def _check_dim(v: object, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 1 <= v <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: must be an int in [1, {MAX_HEAD_DIM}], got {v!r}")
    return int(v)


def make_plan(head_k_dim: int, head_v_dim: int, dtype: torch.dtype,
              device: torch.device | str) -> GDNDetPlan:
    """Pick the plan for heads of ``head_k_dim`` (K) and ``head_v_dim`` (V) on ``device``.

    Rules (no timing): ``chunk_size = 64``; ``block_k = next_power_of_2(max(K, 16))``;
    on CUDA ``block_v = min(64, next_power_of_2(max(V, 16)))`` with 4 warps per kernel
    (8 for the state kernel when ``block_k * block_v >= 8192``); under the interpreter the
    whole V in one block (fewer programs, each costing Python time). The gate kernels take
    128 tokens per program on CUDA, 256 under the interpreter. On CUDA fp32 dots are
    "tf32x3" (``fp32_dots=2``; "ieee" spills registers and compiles for minutes) and 16-bit
    inputs keep 16-bit intermediates (``store_16bit=1``); under the interpreter
    ``fp32_dots=1`` (it computes fp32 regardless) and ``store_16bit=1``.

    Raises:
        ValueError: if K or V is outside [1, 256], or ``dtype`` is not fp32/bf16/fp16.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {e}") from None
    K = _check_dim(head_k_dim, "head_k_dim")
    V = _check_dim(head_v_dim, "head_v_dim")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype: expected float32, bfloat16 or float16, got {dtype}")
    return cached_plan(_PLANS, (K, V, dtype, device.type), lambda: _rule(K, V, dtype, device))


def _rule(K: int, V: int, dtype: torch.dtype, device: torch.device) -> GDNDetPlan:
    cuda = device.type == "cuda"
    block_k = next_power_of_2(max(K, 16))
    block_v_full = next_power_of_2(max(V, 16))
    block_v = min(64, block_v_full) if cuda else block_v_full
    return GDNDetPlan(
        head_k_dim=K,
        head_v_dim=V,
        chunk_size=CHUNK_SIZE,
        block_k=block_k,
        block_v=block_v,
        num_warps_prep=4,
        num_warps_h=8 if cuda and block_k * block_v >= 8192 else 4,
        num_warps_o=4,
        num_warps_local=8 if cuda else 4,
        l2norm_block_rows=16 if cuda else 256,
        num_warps_l2norm=4,
        fp32_dots=2 if cuda else 1,
        store_16bit=1,
        gate_block_t=128 if cuda else 256,
        num_warps_gate=4,
    )

