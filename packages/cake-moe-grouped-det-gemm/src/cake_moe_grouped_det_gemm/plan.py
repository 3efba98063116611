"""MoEGroupedDetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.plan import cached_plan
from cake_core.triton_utils import next_power_of_2, sm_count

#: Largest TMA box edge (elements) a ``tma = 1`` plan's tiles may have.
TMA_MAX_BOX = 256
#: Most wgrad slices per expert a plan may ask for (the workspace holds S fp32 [E, N, K]).
MAX_WGRAD_SPLITS = 16
#: CPU (interpreter) tiles: next power of two of the dim, clamped to these bounds.
CPU_TILE_MIN, CPU_TILE_MAX = 16, 128
#: CPU (interpreter): most rows per forward/dgrad row tile and per wgrad step.
CPU_ROWS_MAX = 64
#: Least rows per wgrad slice (per expert, on average) before the rule splits: CUDA, CPU.
CUDA_MIN_SLICE, CPU_MIN_SLICE = 4096, 64

_POW2_FIELDS = ("block_m", "block_n", "block_k", "wgrad_block_m", "wgrad_block_n",
                "wgrad_block_k", "reduce_block")


#: How to bring a dict of an older format version to the current one (same launches).
_UPGRADES = {
    1: "version 2 added tma, version 3 grouped_mm_fwd_dgrad and version 4 wgrad_order; add "
       "tma = 0, grouped_mm_fwd_dgrad = 0 and wgrad_order = 0 and set version = 4 for the "
       "same launches",
    2: "version 3 added grouped_mm_fwd_dgrad (forward and dgrad on torch._grouped_mm) and "
       "version 4 wgrad_order; add grouped_mm_fwd_dgrad = 0 and wgrad_order = 0 and set "
       "version = 4 for the same launches",
    3: "version 4 added wgrad_order (the wgrad's expert tile order); add wgrad_order = 0 "
       "and set version = 4 for the same launches",
}


@dataclasses.dataclass(frozen=True)
class MoEGroupedDetPlan(Plan):
    """Execution plan of the det MoE grouped GEMM ``y[rows of e] = x[rows of e] · W[e]ᵀ``.

    All fields are ints, so a plan crosses a custom op as ``list[int]``. A plan serves any
    token count M and any split of the tokens among the experts (M only steers the rule).

    Fields:
        num_experts / out_features / in_features: E, N and K of weight ``[E, N, K]``.
        block_m / block_n / block_k, num_warps, num_stages: tiles of the token-major GEMMs,
            forward ``y[rows, N] = x[rows, K] · W[e]ᵀ`` and dgrad ``dx[rows, K] =
            dy[rows, N] · W[e]`` (block_m rows of one expert per tile; block_n the output
            column tile, block_k the reduction step of both; unused when
            ``grouped_mm_fwd_dgrad = 1``).
        wgrad_block_m / wgrad_block_n / wgrad_block_k, wgrad_num_warps, wgrad_num_stages:
            tiles of ``dW[e][N, K] = dy[rows of e]ᵀ · x[rows of e]`` (wgrad_block_k rows per
            step of the reduction).
        wgrad_splits: S, the fixed number of row slices per expert of the wgrad reduction.
            Expert e's m_e rows are cut into S slices of ``cdiv(cdiv(m_e, S),
            wgrad_block_k) · wgrad_block_k`` rows (on the device); slice s writes an fp32
            partial plane ``[E, N, K]`` to the workspace and the planes are summed in slice
            order (deterministic split-K). S = 1: one pass per expert, written (or added
            into ``main_grad``) directly. Another S regroups the sum, so dW bits are
            promised only for equal plans.
        reduce_block: elements per program of the ordered sum of the S planes.
        allow_tf32: 1 lets fp32 inputs multiply as tf32 (not exact); 0 (default) keeps
            fp32 products exact. No effect on bf16/fp16.
        tma: operand loads of all three GEMMs. 0 (default) = the pointer kernels
            ``grouped_mm_kernel`` / ``grouped_wgrad_kernel`` (masked ``tl.load``); 1 = the
            TMA kernels ``grouped_mm_tma_kernel`` / ``grouped_wgrad_tma_kernel``: x / dy
            rows through 2-D host-side TMA tensor descriptors, the weight through a 3-D
            descriptor over ``[E, N, K]`` (``[1, ., .]`` boxes, so reads past N or K of one
            expert are zeros, never the next expert's rows); masked pointer stores as with
            0. Same tiles, schedule, slices, step order and ordered sum; bits fixed per
            plan, not promised equal between 0 and 1 (the compiler may order a dot's inner
            products differently). Needs ``N`` and ``K`` times the element size to be
            multiples of 16 bytes and tiles <= 256 (:func:`tma_problem`); x / dy / weight
            views whose layout TMA cannot read are copied contiguous first. The rule picks 1
            on Hopper for 16-bit inputs with aligned N and K (see :func:`make_plan`). With
            ``grouped_mm_fwd_dgrad = 1`` it steers the wgrad only.
        grouped_mm_fwd_dgrad: 1 routes the forward and dgrad GEMMs to
            ``torch._grouped_mm`` (``_grouped_mm(x, weight.transpose(-2, -1), offs=ends)``
            and ``_grouped_mm(dy, weight, offs=ends)``, ``ends`` the device-side clamped
            row ends, int32), then a Triton kernel (``zero_tail_rows_kernel``) writes zeros to
            the rows past the last expert's end, which torch leaves unwritten; no host sync.
            On one H200 (torch 2.11.0+cu130, bf16, balanced and skewed routing) torch's
            kernels repeated bitwise over 5 runs and across two processes, with the bf16
            output rounding's error against float64, as cake's kernels
            (docs/benchmarks/moe.md). 0 keeps them on cake's kernels (the rule's choice
            everywhere but Hopper with bf16 and aligned N and K, see :func:`make_plan`). The wgrad
            (fixed-order split-K, ``main_grad``-fused) is always cake's. With 1 the
            forward/dgrad tile fields (block_m / _n / _k, num_warps, num_stages) stay in the
            plan but are unused. Needs ``torch._grouped_mm``, bf16 inputs, N and K multiples
            of 8, and on CUDA compute capability 9.x or 10.x (:func:`grouped_mm_problem`);
            x / dy / weight views torch cannot read as row-major are copied contiguous
            first. Bits fixed per plan and torch build (torch's kernels), not promised equal
            between 0 and 1.

        wgrad_order: the launch order of the wgrad's expert tiles. 0 = expert order (tile
            ``pid`` belongs to expert ``pid // (tiles per expert)``); 1 = experts with more
            rows first (a stable descending sort of the row counts, on the device, no host
            sync), so that the longest reductions start first and the short ones fill the
            tail (longest-processing-time order, for skewed routing). Every tile is still
            computed by one program with the same steps: **the same bits** for 0 and 1
            (tested). Costs a sort of E ints per backward. The rule: 1 on CUDA (faster on
            skewed routing, no slower on balanced; measurements: docs/benchmarks/moe.md), 0
            on the CPU.

    Format version 4 added ``wgrad_order``, 3 ``grouped_mm_fwd_dgrad``, 2 ``tma``. An older
    dict is refused by ``from_dict``: re-make the plan, or add the missing fields as 0 and
    set ``version = 4`` for the same launches.
    """

    family: ClassVar[str] = "cake-moe-grouped-det-gemm"
    format_version: ClassVar[int] = 4
    format_upgrades: ClassVar[dict[int, str]] = _UPGRADES
    #: the mode every plan of this class carries (a nondet sibling's subclass sets
    #: ``Mode.NONDET``)
    expected_mode: ClassVar[Mode] = Mode.DET

    num_experts: int
    out_features: int
    in_features: int
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    wgrad_block_m: int
    wgrad_block_n: int
    wgrad_block_k: int
    wgrad_num_warps: int
    wgrad_num_stages: int
    wgrad_splits: int
    reduce_block: int
    allow_tf32: int
    tma: int
    grouped_mm_fwd_dgrad: int
    wgrad_order: int

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_int_fields()
        self.require_at_least("num_experts", "out_features", "in_features")
        self.require_power_of_two(*_POW2_FIELDS, minimum=16)
        self.require_at_least("num_stages", "wgrad_num_stages")
        self.require_warps("num_warps", "wgrad_num_warps")
        self.require_in_range("wgrad_splits", 1, MAX_WGRAD_SPLITS)
        self.require_flags("allow_tf32", "tma", "grouped_mm_fwd_dgrad", "wgrad_order")
        if self.tma and max(getattr(self, n) for n in _POW2_FIELDS[:6]) > TMA_MAX_BOX:
            self._fail(f"tma needs block_m / _n / _k and wgrad_block_m / _n / _k <= "
                       f"{TMA_MAX_BOX} (a TMA box edge)")
        self.require_mode(self.expected_mode)


#: Input dtypes the ``grouped_mm_fwd_dgrad = 1`` route accepts: torch._grouped_mm's CUDA
#: fast path (CUTLASS, sm_90 / sm_100) is bf16 only; other dtypes go to its per-expert
#: fallback, which copies the offsets to the host (a sync) on CUDA.
GROUPED_MM_DTYPES = (torch.bfloat16,)


def tma_problem(plan: MoEGroupedDetPlan, dtype: torch.dtype) -> str | None:
    """Why ``plan`` (with ``tma = 1``) cannot run the TMA kernels for inputs of ``dtype``
    (None when it can, or when ``tma = 0``): TMA reads rows of x ``[M, K]``, dy ``[M, N]``
    and weight ``[E, N, K]`` whose byte lengths must be multiples of 16, in boxes whose
    edges are at most 256."""
    if not plan.tma:
        return None
    if not tma_available():
        return "tma=1 needs Triton >= 3.4 (triton.tools.tensor_descriptor); use tma=0"
    es = torch.tensor([], dtype=dtype).element_size()
    bad = [f"{n}={v}" for n, v in (("N", plan.out_features), ("K", plan.in_features))
           if (v * es) % 16]
    if bad:
        return (f"tma=1 needs out_features N and in_features K to be multiples of "
                f"{16 // es} for {str(dtype)[6:]} (TMA reads 16-byte aligned rows of x [M, K], "
                f"dy [M, N] and weight [E, N, K]), got {', '.join(bad)}; use tma=0")
    big = [f"{n}={getattr(plan, n)}" for n in _POW2_FIELDS[:6]
           if getattr(plan, n) > TMA_MAX_BOX]
    if big:
        return f"tma=1 needs tiles <= {TMA_MAX_BOX} (a TMA box edge), got {', '.join(big)}"
    return None


_PLANS: dict[tuple, MoEGroupedDetPlan] = {}


def _int(v, name: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise ValueError(f"{name}: must be an int >= {lo}, got {v!r}")
    return int(v)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def make_plan(M: int, E: int, N: int, K: int, dtype: torch.dtype,
              device: torch.device | str) -> MoEGroupedDetPlan:
    """Pick the plan for ``M`` tokens over ``E`` experts of weight ``[E, N, K]`` in ``dtype``
    on ``device``.

    Rules (read M, E, N, K, dtype and the SM count; never timing, never the offsets):

    - CUDA: forward/dgrad tiles 128×128, 64 reduction steps (32 for fp32), 8 warps, 3
      stages; wgrad 128×128 output tiles, 64 rows per step (32 for fp32), 8 warps, 3
      stages, and 128×256 output tiles where the wgrad is the TMA kernel (``tma = 1``) on
      compute capability 9.x / 10.x (the tile of the wgrad sweep in
      docs/benchmarks/moe.md; 144 KiB of shared memory, more than consumer GPUs have).
    - CPU (Triton interpreter, where every program and step costs Python time):
      ``fit(d)`` = next power of two of d clamped to [16, 128]; forward/dgrad
      ``block_m = min(64, fit(cdiv(M, E)))`` (one expert's average rows),
      ``block_n = block_k = fit(max(N, K))``; wgrad ``fit(max(N, K))`` square tiles and
      ``min(64, fit(cdiv(M, E)))`` rows per step.
    - Split rule: with T = ``E · cdiv(N, wgrad_block_m) · cdiv(K, wgrad_block_n)`` wgrad
      output tiles, ``S = 1`` when T >= SMs, else ``S = clamp(min(SMs // T,
      (M // E) // MIN_SLICE), 1, 16)`` with MIN_SLICE 4096 rows on CUDA and 64 on the CPU
      (4 "SMs"). The average rows per expert steers S; the actual split of each expert is
      computed on the device from its own row count.
    - ``allow_tf32 = 0``; ``reduce_block`` 1024 (4096 on the CPU).
    - ``tma = 1`` on CUDA devices of compute capability >= 9 (Hopper) for bf16/fp16 with N
      and K multiples of 8 (TMA reads 16-byte rows); 0 elsewhere (CPU, fp32, older GPUs,
      unaligned N or K): pipelined TMA loads made every phase faster than masked pointer
      loads (measurements: docs/benchmarks/moe.md).
    - ``grouped_mm_fwd_dgrad = 1`` (forward and dgrad on ``torch._grouped_mm``, the wgrad
      still cake's) on CUDA devices of compute capability 9.x (Hopper) for bf16 with N and K
      multiples of 8, when this torch has ``torch._grouped_mm``; 0 elsewhere (CPU, fp16,
      fp32, other GPUs, unaligned N or K): torch's kernels were faster than cake's forward
      and dgrad and repeated bitwise across runs and processes (measurements:
      docs/benchmarks/moe.md). The forward/dgrad tiles above stay in the plan, unused by
      those phases.
    - ``wgrad_order = 1`` (the wgrad's experts launched most rows first; the same bits) on
      CUDA (a skewed expert's long reduction no longer starts last), 0 on the CPU.

    Equal arguments give the equal plan (cached; a pure function of its key).

    Raises:
        ValueError: M < 0, E, N or K < 1 (or not ints), dtype not fp32/bf16/fp16, bad device.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: a CUDA plan reads the device (SM count, compute capability), "
                         "but CUDA is not available here")
    M, E = _int(M, "M", 0), _int(E, "E", 1)
    N, K = _int(N, "N", 1), _int(K, "K", 1)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype: expected float32, bfloat16 or float16, got {dtype}")
    return cached_plan(_PLANS, (M, E, N, K, dtype, device.type, device.index),
                       lambda: _rule(M, E, N, K, dtype, device))


def grouped_mm_available() -> bool:
    """Whether this torch has ``torch._grouped_mm`` and is not a ROCm build (whose
    ``_grouped_mm`` may take a fallback that copies the offsets to the host). A rule input;
    tests patch it."""
    return getattr(torch, "_grouped_mm", None) is not None and torch.version.hip is None


def grouped_mm_problem(plan: MoEGroupedDetPlan, dtype: torch.dtype,
                       device: torch.device) -> str | None:
    """Why ``plan`` (with ``grouped_mm_fwd_dgrad = 1``) cannot route the forward and dgrad
    to ``torch._grouped_mm`` for inputs of ``dtype`` on ``device`` (None when it can, or
    when the flag is 0): torch must have it; bf16 only (``GROUPED_MM_DTYPES``: its fp16 /
    fp32 path loops over the experts after copying the offsets to the host, a sync);
    N and K multiples of 8 (16-byte rows of x, dy, weight and of the outputs, which torch
    pads otherwise); on CUDA compute capability 9.x or 10.x (torch's CUTLASS grouped GEMM;
    elsewhere the same host-syncing fallback). On the CPU torch runs a per-expert loop: the
    route is allowed there when a caller forces it (tests), the rule never picks it."""
    if not plan.grouped_mm_fwd_dgrad:
        return None
    if not grouped_mm_available():
        return (f"grouped_mm_fwd_dgrad=1 needs torch._grouped_mm in a CUDA (not ROCm) build, "
                f"which torch {torch.__version__} is not; use grouped_mm_fwd_dgrad=0")
    if dtype not in GROUPED_MM_DTYPES:
        return (f"grouped_mm_fwd_dgrad=1 needs bfloat16 inputs (torch._grouped_mm's fast "
                f"path; other dtypes copy the offsets to the host), got {str(dtype)[6:]}; "
                "use grouped_mm_fwd_dgrad=0")
    bad = [f"{n}={v}" for n, v in (("N", plan.out_features), ("K", plan.in_features)) if v % 8]
    if bad:
        return (f"grouped_mm_fwd_dgrad=1 needs out_features N and in_features K to be "
                f"multiples of 8 (torch._grouped_mm reads and writes 16-byte aligned rows), "
                f"got {', '.join(bad)}; use grouped_mm_fwd_dgrad=0")
    if device.type == "cuda" and cuda_capability(device)[0] not in (9, 10):
        major, minor = cuda_capability(device)
        return (f"grouped_mm_fwd_dgrad=1 needs a CUDA device of compute capability 9.x or "
                f"10.x (torch._grouped_mm's CUTLASS kernels; elsewhere it copies the offsets "
                f"to the host), got {major}.{minor}; use grouped_mm_fwd_dgrad=0")
    return None


def tma_available() -> bool:
    """Whether this Triton has host-side TMA descriptors (Triton >= 3.4; imports Triton, so
    called only where a CUDA rule is evaluated or a TMA plan is resolved)."""
    from cake_core.gemm import tma_available as available

    return available()


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (a rule input; tests patch it)."""
    return torch.cuda.get_device_capability(device)


def _rule(M: int, E: int, N: int, K: int, dtype: torch.dtype, device: torch.device):
    sms = sm_count(device)
    fp32 = dtype == torch.float32
    if device.type == "cuda":
        bm, bn, bk = 128, 128, 32 if fp32 else 64
        wbm, wbn, wbk = 128, 128, 32 if fp32 else 64
        warps = wwarps = 8
        stages = wstages = 3
        min_slice, reduce_block = CUDA_MIN_SLICE, 1024
        tma = int(not fp32 and tma_available() and cuda_capability(device)[0] >= 9
                  and (N * 2) % 16 == 0 and (K * 2) % 16 == 0)
        gmm = int(dtype == torch.bfloat16 and cuda_capability(device)[0] == 9
                  and grouped_mm_available() and N % 8 == 0 and K % 8 == 0)
        if tma and cuda_capability(device)[0] in (9, 10):
            wbn = 256  # 3 stages of 128 x 64 + 64 x 256 boxes: 144 KiB of shared memory
    else:
        def fit(d: int) -> int:
            return max(CPU_TILE_MIN, min(CPU_TILE_MAX, next_power_of_2(d)))

        rows = min(CPU_ROWS_MAX, fit(_cdiv(M, E)))
        bm, bn = rows, fit(max(N, K))
        bk = wbm = wbn = bn
        wbk = rows
        warps = wwarps = 4
        stages = wstages = 1
        min_slice, reduce_block = CPU_MIN_SLICE, 4096
        tma = gmm = 0
    tiles = E * _cdiv(N, wbm) * _cdiv(K, wbn)
    splits = 1 if tiles >= sms else \
        max(1, min(sms // tiles, (M // E) // min_slice, MAX_WGRAD_SPLITS))
    return MoEGroupedDetPlan(
        num_experts=E, out_features=N, in_features=K,
        block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages,
        wgrad_block_m=wbm, wgrad_block_n=wbn, wgrad_block_k=wbk,
        wgrad_num_warps=wwarps, wgrad_num_stages=wstages, wgrad_splits=splits,
        reduce_block=reduce_block, allow_tf32=0, tma=tma, grouped_mm_fwd_dgrad=gmm,
        wgrad_order=int(device.type == "cuda"),
    )
