"""CausalConv1dDetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.plan import cached_plan
from cake_core.triton_utils import next_power_of_2

#: Kernel widths W the kernels take (the tests cover 2, 3, 4 and 5).
MIN_KERNEL_SIZE = 2
MAX_KERNEL_SIZE = 8
#: Largest channel count D (any D in between, not only powers of two).
MAX_HIDDEN = 1 << 20
#: CUDA's limit on grid axis 1, which walks the channel blocks.
_MAX_GRID_Y = 65535


#: How to bring a dict of an older format version to the current one (same launches, bits).
_UPGRADES = {
    1: "version 2 added bwd_window (the SiLU backward's x tiles loaded once per shift) and "
       "weight_tap_major (the taps read from a [W, D] copy); add bwd_window = 0, "
       "weight_tap_major = 0, bwd_da_once = 0, fwd_sub_t = fwd_sub_t_linear = block_t_fwd "
       "and set version = 4 for the same launches and bits",
    2: "version 3 added bwd_da_once (the SiLU backward's dpre formed once per row); add "
       "bwd_da_once = 0, fwd_sub_t = fwd_sub_t_linear = block_t_fwd and set version = 4 for "
       "the same launches and bits",
    3: "version 4 added fwd_sub_t and fwd_sub_t_linear (the forward's token block in "
       "sub-tiles); add fwd_sub_t = fwd_sub_t_linear = block_t_fwd and set version = 4 for "
       "the same launches and bits",
}


@dataclasses.dataclass(frozen=True)
class CausalConv1dDetPlan(Plan):
    """Execution plan of the det causal conv1d kernels.

    Fields:
        hidden_size: D, the channels. kernel_size: W, the taps (2 <= W <= 8).
        block_t_fwd / block_d_fwd / num_warps_fwd: tokens and channels per forward program
            (one program per block of tokens of one sequence and block of channels) and
            its warps.
        block_t_bwd / block_d_bwd / num_warps_bwd: the same for the backward. block_t_bwd
            also fixes the first stage of the dweight / dbias sums: one fp32 partial per
            block of ``block_t_bwd`` tokens of a sequence, summed over the blocks in index
            order. Another block_t_bwd regroups the sum, so dweight / dbias bits are
            promised per plan only. (y, dx and dinitial_state are computed per element in
            an order no field changes; other tile shapes compile to other code, though, so
            equal bits across plans are not promised for them either.)
        reduce_block / num_warps_reduce: elements per program of the ordered sum
            (:func:`cake_core.gemm.ordered_sum`); elementwise, no effect on bits.
        bwd_window: 0 = the SiLU backward recomputes the pre-activation at each of the W
            output shifts tap by tap (W^2 + 1 shifted x tile loads per program); 1 = it
            loads each of the 2W - 1 distinct shifted x tiles once and feeds every shift's
            accumulator from it (W <= 4 only; the same sums in the same order, so the same
            bits under the interpreter; not faster on a GPU, so not in the rule). No effect
            without SiLU.
        weight_tap_major: 0 = the kernels read the taps from the ``[D, W]`` weight (one
            2-byte load per channel and tap); 1 = from a ``[W, D]`` contiguous copy made per
            forward / backward call (a small torch copy; each tap's channels load as
            vectors). The same values, so the same bits; the CUDA rule's choice for W <= 4.
        bwd_da_once: 0 = as above; 1 = the SiLU backward forms dpre = dy * silu'(pre) once
            per row (the tile's rows and its W - 1 halo rows) instead of once per output
            shift, in a persistent kernel that keeps it in a per-program fp32 scratch
            (global memory, L2-resident) and reads the W - 1 shifted views back
            (kernels/bwd_once.py; any W). The same values in the same order, so the same
            bits under the interpreter; the CUDA rule's choice for W <= 4. No effect without
            SiLU (dpre is dy, nothing to repeat); takes the place of bwd_window (not both).
        fwd_sub_t / fwd_sub_t_linear: rows per sub-tile of the forward's token block with
            SiLU / without activation (powers of two; ``min(value, block_t_fwd)`` rows are
            used, so block_t_fwd or more = the whole block at once): each sub-tile is
            loaded, computed and stored before the next (kernels/fwd.py), which bounds the
            registers live at once. Every output element is the same sum in the same order,
            so the same bits for any value.
    """

    family: ClassVar[str] = "cake-causal-conv1d-det-train"
    format_version: ClassVar[int] = 4
    format_upgrades: ClassVar[dict[int, str]] = _UPGRADES
    #: the mode every plan of this class carries (cake-causal-conv1d-nondet-train's
    #: subclass sets ``nondet``)
    expected_mode: ClassVar[Mode] = Mode.DET

    hidden_size: int
    kernel_size: int
    block_t_fwd: int
    block_d_fwd: int
    num_warps_fwd: int
    block_t_bwd: int
    block_d_bwd: int
    num_warps_bwd: int
    reduce_block: int
    num_warps_reduce: int
    bwd_window: int
    weight_tap_major: int
    bwd_da_once: int
    fwd_sub_t: int
    fwd_sub_t_linear: int

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_int_fields()
        self.require_in_range("hidden_size", 1, MAX_HIDDEN)
        self.require_in_range("kernel_size", MIN_KERNEL_SIZE, MAX_KERNEL_SIZE)
        self.require_power_of_two("block_t_fwd", "block_d_fwd", "block_t_bwd", "block_d_bwd",
                                  "reduce_block", "fwd_sub_t", "fwd_sub_t_linear")
        self.require_warps("num_warps_fwd", "num_warps_bwd", "num_warps_reduce")
        for name in ("block_d_fwd", "block_d_bwd"):
            if -(-self.hidden_size // getattr(self, name)) > _MAX_GRID_Y:
                self._fail(f"{name}: {self.hidden_size} channels need more than "
                           f"{_MAX_GRID_Y} channel blocks")
        self.require_flags("bwd_window", "weight_tap_major", "bwd_da_once")
        if self.bwd_window and self.kernel_size > 4:
            self._fail(f"bwd_window=1 takes kernel_size <= 4, got {self.kernel_size}")
        if self.bwd_window and self.bwd_da_once:
            self._fail("bwd_da_once=1 replaces the bwd_window kernel: set one of them")
        self.require_mode(self.expected_mode)


def _int(v: object, name: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= v <= hi:
        raise ValueError(f"{name}: must be an int in [{lo}, {hi}], got {v!r}")
    return int(v)


_PLANS: dict[tuple, CausalConv1dDetPlan] = {}


def make_plan(hidden_size: int, kernel_size: int, dtype: torch.dtype,
              device: torch.device | str, *, varlen: bool = False) -> CausalConv1dDetPlan:
    """Pick the plan for ``hidden_size`` (D) channels, ``kernel_size`` (W) taps, inputs of
    ``dtype`` on ``device``; ``varlen``: whether the calls pass ``cu_seqlens`` (packed
    documents; the entry points ask for that plan when they choose it themselves).

    Rules (no timing at call time; measurements: docs/benchmarks/causal_conv1d.md). CUDA,
    W <= 4: ``weight_tap_major = 1`` (each tap one vector load) and ``bwd_da_once = 1``
    (dpre once per row: the per-shift recompute made the backward instruction-bound);
    backward tiles of 128 tokens x min(64, D') channels (D' = D rounded up to a power of
    two), 4 warps (the fastest tiles timed); forward tiles of 64 tokens x min(128, D')
    channels for fixed-length calls and x min(64, D') when ``varlen`` (128 channels were
    faster fixed-length, slower packed), 8 warps (4 below 2048 elements). Without activation
    the forward runs its block in 32-row sub-tiles (``fwd_sub_t_linear = 32``: fewer live
    registers, more programs per SM, same bits); with SiLU in whole blocks (``fwd_sub_t =
    64``: sub-tiles were slower there).
    CUDA, W > 4 (not timed; no register spills
    for sm_90 in ptxas reports): 64-token blocks, forward tiles 64 x min(32, D') with 8
    warps (4 below 2048 elements), backward tiles 64 x min(16, D') with 8 warps (4 below
    1024 elements; it keeps W^2 taps in flight), 32 channels where 16 would need over 65535
    channel blocks (D > 1048560).
    Under the interpreter (CPU) every program costs Python time: 32-token blocks (short test
    documents still span two) and up to 64 channels; ``varlen`` changes nothing there.
    ``dtype`` is part of the signature for rules to come.

    Raises:
        ValueError: ``hidden_size`` not an int in [1, 2**20], ``kernel_size`` not an int in
            [2, 8], or a bad ``device``.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {e}") from None
    D = _int(hidden_size, "hidden_size", 1, MAX_HIDDEN)
    W = _int(kernel_size, "kernel_size", MIN_KERNEL_SIZE, MAX_KERNEL_SIZE)
    varlen = bool(varlen)
    return cached_plan(_PLANS, (D, W, device.type, varlen), lambda: _rule(D, W, device, varlen))


def _rule(D: int, W: int, device: torch.device, varlen: bool = False) -> CausalConv1dDetPlan:
    d2 = next_power_of_2(D)
    if device.type == "cuda" and W <= 4:
        # the dpre-once persistent backward with 128 x 64 tiles; the forward's taps as [W, D]
        # vectors (measurements: docs/benchmarks/causal_conv1d.md)
        bd_fwd = min(d2, 64 if varlen else 128)
        return CausalConv1dDetPlan(
            hidden_size=D, kernel_size=W,
            block_t_fwd=64, block_d_fwd=bd_fwd, num_warps_fwd=8 if 64 * bd_fwd >= 2048 else 4,
            block_t_bwd=128, block_d_bwd=min(d2, 64), num_warps_bwd=4,
            reduce_block=1024, num_warps_reduce=4, bwd_window=0,
            weight_tap_major=1, bwd_da_once=1, fwd_sub_t=64, fwd_sub_t_linear=32)
    if device.type == "cuda":  # W > 4 (not timed): about 16 (forward) / 4 (backward, W^2
        # taps in flight) elements per thread, from ptxas register reports for sm_90
        bd_fwd = min(d2, 32)
        # at most _MAX_GRID_Y channel blocks: the D > 65535 * 16 backward takes 32 channels
        # (and so 8 warps) rather than an invalid plan
        bd_bwd = max(min(d2, 16), next_power_of_2(-(-D // _MAX_GRID_Y)))
        return CausalConv1dDetPlan(
            hidden_size=D, kernel_size=W,
            block_t_fwd=64, block_d_fwd=bd_fwd, num_warps_fwd=8 if 64 * bd_fwd >= 2048 else 4,
            block_t_bwd=64, block_d_bwd=bd_bwd, num_warps_bwd=8 if 64 * bd_bwd >= 1024 else 4,
            reduce_block=1024, num_warps_reduce=4, bwd_window=0,
            weight_tap_major=0, bwd_da_once=0, fwd_sub_t=64, fwd_sub_t_linear=64)
    bd = min(d2, 64)
    return CausalConv1dDetPlan(
        hidden_size=D, kernel_size=W,
        block_t_fwd=32, block_d_fwd=bd, num_warps_fwd=1,
        block_t_bwd=32, block_d_bwd=bd, num_warps_bwd=1,
        reduce_block=1024, num_warps_reduce=1, bwd_window=0,
        weight_tap_major=0, bwd_da_once=0, fwd_sub_t=32, fwd_sub_t_linear=32)
