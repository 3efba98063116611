"""MHCDetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode, Plan, check_device, check_float_dtype, check_int
from cake_core.plan import cached_plan
from cake_core.triton_utils import cdiv, next_power_of_2, sm_count

#: Stream counts the kernels are built for (powers of two: the [n, n] matrix is one tile).
N_STREAMS = (2, 4, 8)
#: Largest stream width C.
MAX_HIDDEN = 65536


def n_coeffs(n_streams: int) -> int:
    """Width of one token's logits, ``2n + n^2`` (pre, post, res)."""
    return 2 * n_streams + n_streams * n_streams


@dataclasses.dataclass(frozen=True)
class MHCDetPlan(Plan):
    """Execution plan of the det mHC kernels.

    Fields:
        n_streams: n, the number of residual streams (2, 4 or 8).
        hidden_size: C, the width of one stream.
        block_m: the ``2n + n^2`` logits padded to a power of two >= 16 (the N side of the
            ``tl.dot`` with phi).
        mix_block_t / mix_block_c / mix_warps: tokens per program, channels per step and
            warps of the projection kernel (RMS and x·phi over the n·C row).
        coef_block_t / coef_block_c / coef_warps: the coefficient kernel (sigmoids, Sinkhorn,
            U) and the first backward kernel (dH_pre, the coefficient backward).
        fin_block_t / fin_block_c / fin_warps: the finish kernels (Y forward; dX, dB, dH_post,
            dH_res backward).
        dx_block_t / dx_block_c / dx_warps: the dX / dphi kernel: one program per (stream,
            channel block, token slice).
        dphi_slices: S, the fixed number of token slices. Slice s walks token blocks s,
            s + S, s + 2S, ... in that order and writes its own fp32 partial of dphi; the
            partials are summed in slice order. Another S regroups the sum, so dphi bits are
            promised per plan.
        reduce_block_r / reduce_block_w: rows and columns per step of the ordered row sums
            (dphi partials, per-block dbias/dalpha partials).
        fp32_dots: ``input_precision`` of the fp32 ``tl.dot`` calls on CUDA:
            0 "tf32", 1 "ieee", 2 "tf32x3" (the interpreter always computes in fp32).

    Dtype-agnostic: no field depends on the inputs' dtype (the kernels load X in its dtype,
    compute in fp32 and store U, Y, dX and dB in X's dtype), so one plan serves fp32 and
    bf16 inputs, with the same reduction order; the entry points accept a plan made with
    another dtype. What a plan fixes is (n_streams, hidden_size); a plan for another n or
    C is refused with ``ValueError``.
    """

    family: ClassVar[str] = "cake-mhc-det-train"
    format_version: ClassVar[int] = 1
    #: the mode every plan of this class carries (a nondet sibling's subclass sets
    #: ``Mode.NONDET``)
    expected_mode: ClassVar[Mode] = Mode.DET

    n_streams: int
    hidden_size: int
    block_m: int
    mix_block_t: int
    mix_block_c: int
    mix_warps: int
    coef_block_t: int
    coef_block_c: int
    coef_warps: int
    fin_block_t: int
    fin_block_c: int
    fin_warps: int
    dx_block_t: int
    dx_block_c: int
    dx_warps: int
    dphi_slices: int
    reduce_block_r: int
    reduce_block_w: int
    fp32_dots: int

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_int_fields()
        if self.n_streams not in N_STREAMS:
            self._fail(f"n_streams must be one of {N_STREAMS}, got {self.n_streams}")
        self.require_in_range("hidden_size", 1, MAX_HIDDEN)
        if self.block_m < max(16, n_coeffs(self.n_streams)):
            self._fail(f"block_m must be >= max(16, 2n + n^2), got {self.block_m}")
        self.require_power_of_two("block_m", "mix_block_c", "coef_block_t", "coef_block_c",
                                  "fin_block_t", "fin_block_c", "reduce_block_r",
                                  "reduce_block_w")
        self.require_power_of_two("mix_block_t", "dx_block_t", "dx_block_c", minimum=16)
        if self.mix_block_c < 16:
            self._fail(f"mix_block_c must be >= 16, got {self.mix_block_c}")
        self.require_at_least("dphi_slices")
        self.require_warps("mix_warps", "coef_warps", "fin_warps", "dx_warps")
        self.require_in_range("fp32_dots", 0, 2)
        self.require_mode(self.expected_mode)

    @property
    def dot_precision(self) -> str:
        """``input_precision`` of the kernels' fp32 ``tl.dot`` calls."""
        return ("tf32", "ieee", "tf32x3")[self.fp32_dots]

    @property
    def n_coeffs(self) -> int:
        return n_coeffs(self.n_streams)


_PLANS: dict[tuple, MHCDetPlan] = {}


def make_plan(n_streams: int, hidden_size: int, dtype: torch.dtype,
              device: torch.device | str) -> MHCDetPlan:
    """Pick the plan for tokens of ``n_streams`` streams of width ``hidden_size``.

    Rules (no timing): on CUDA, projection tiles of 64 tokens x 128 channels (each program
    re-reads phi from L2, so more tokens per program mean less L2 traffic), coefficient
    tiles of 16 tokens x 256 channels, finish tiles of 8 tokens x 128 channels, dX/dphi
    tiles of 32 tokens x 128 channels (each program re-reads the token block's dz row, so
    wider channel tiles mean less; 64 channels for n = 8, whose 128-wide phi tiles would
    not fit shared memory) with enough token slices for about four programs per SM,
    fp32 dots as tf32x3 (near-fp32 products on tensor cores). Under the interpreter larger
    token tiles (fewer Python-level programs) and 4 slices. Not yet tuned on a GPU: the
    rules are a first guess for an H200, to be replaced by a measured sweep. ``dtype`` is
    part of the signature for rules to come: today's rules do not read it, so
    ``make_plan(n, C, torch.bfloat16, dev)`` and ``make_plan(n, C, torch.float32, dev)``
    are the same plan, valid for inputs of either dtype (see :class:`MHCDetPlan`).

    Raises:
        ValueError: ``n_streams`` not in (2, 4, 8), ``hidden_size`` outside [1, 65536], a
            bad dtype or device.
    """
    device = check_device(device)
    check_float_dtype(dtype)
    if n_streams not in N_STREAMS or isinstance(n_streams, bool):
        raise ValueError(f"n_streams: must be one of {N_STREAMS}, got {n_streams!r}")
    hidden_size = check_int(hidden_size, "hidden_size", 1, MAX_HIDDEN)
    return cached_plan(_PLANS, (int(n_streams), hidden_size, device.type, device.index),
                       lambda: _rule(int(n_streams), hidden_size, device))


def _rule(n: int, C: int, device: torch.device) -> MHCDetPlan:
    cuda = device.type == "cuda"
    M = n_coeffs(n)
    block_m = max(16, next_power_of_2(M))
    pc = next_power_of_2(C)
    if cuda:
        # phi tiles [block_c, block_m] fp32 live in shared memory (pipelined in the
        # projection, once in the dX kernel): 64 channels once block_m reaches 128 (n = 8)
        wide = 128 if block_m <= 32 else 64
        dx_block_c = max(16, min(wide, pc))
        programs = n * cdiv(C, dx_block_c)
        slices = max(1, min(64, cdiv(4 * sm_count(device), programs)))
        return MHCDetPlan(
            n_streams=n, hidden_size=C, block_m=block_m,
            mix_block_t=64, mix_block_c=max(16, min(wide, pc)), mix_warps=4,
            coef_block_t=16, coef_block_c=min(256, pc), coef_warps=4,
            fin_block_t=8, fin_block_c=min(128, pc), fin_warps=4,
            dx_block_t=32, dx_block_c=dx_block_c, dx_warps=8, dphi_slices=slices,
            reduce_block_r=16, reduce_block_w=256, fp32_dots=2)
    return MHCDetPlan(
        n_streams=n, hidden_size=C, block_m=block_m,
        mix_block_t=64, mix_block_c=max(16, min(64, pc)), mix_warps=4,
        coef_block_t=64, coef_block_c=min(64, pc), coef_warps=4,
        fin_block_t=16, fin_block_c=min(64, pc), fin_warps=4,
        dx_block_t=64, dx_block_c=max(16, min(64, pc)), dx_warps=4, dphi_slices=4,
        reduce_block_r=16, reduce_block_w=256, fp32_dots=1)
