"""DenseProjectionDetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.plan import cached_plan
from cake_core.triton_utils import next_power_of_2, sm_count

#: Most wgrad slices a plan may ask for (the workspace holds S fp32 [N, K] planes).
MAX_WGRAD_SPLITS = 16
#: CPU (interpreter) tiles follow the GEMM dims: next power of two, clamped to these bounds.
CPU_TILE_MIN, CPU_TILE_MAX = 16, 256
#: CPU (interpreter): most tokens per step of the wgrad reduction (a split slice is a
#: whole number of steps, so short steps keep a split's regrouping visible in the tests).
CPU_WGRAD_TOKENS = 128
#: CPU (interpreter): least tokens per wgrad slice.
CPU_MIN_SLICE = 128

_POW2_FIELDS = ("block_m", "block_n", "block_k", "wgrad_block_m", "wgrad_block_n",
                "wgrad_block_k", "reduce_block")


@dataclasses.dataclass(frozen=True)
class DenseProjectionDetPlan(Plan):
    """Execution plan of the det dense projection ``y = x · weightᵀ + bias``.

    All fields are ints, so a plan crosses a custom op as ``list[int]``.

    Fields:
        out_features / in_features: N and K, weight ``[N, K]``; a plan serves any token
            count M (M only steers the rule).
        block_m / block_n / block_k, group_m, num_warps, num_stages: tiles and launch
            parameters of the token-major GEMMs, forward ``y[M, N] = x[M, K] · Wᵀ`` and
            dgrad ``dx[M, K] = dy[M, N] · W`` (block_n is the output column tile of both).
        wgrad_block_m / wgrad_block_n / wgrad_block_k, wgrad_group_m, wgrad_num_warps,
            wgrad_num_stages: tiles of the wgrad GEMM ``dW[N, K] = dyᵀ[N, M] · x[M, K]``
            (wgrad_block_k runs over tokens).
        wgrad_splits: S, the fixed number of token slices of the wgrad (and dbias)
            reduction. Slice s writes an fp32 partial ``[N, K]`` plane to the workspace and
            the planes are summed in slice order (deterministic split-K). S = 1: one pass,
            written (or added into ``main_grad``) directly. Another S regroups the sum, so
            dweight bits are promised only for equal plans.
        reduce_block: elements per program of the ordered sum of the S planes.
        allow_tf32: 1 lets fp32 inputs multiply as tf32 (not exact), whatever
            ``fp32_dots`` says; 0 leaves it to ``fp32_dots``. No effect on bf16/fp16.
        cublas_fwd_dgrad: 1 routes the forward and dgrad GEMMs to cuBLAS (``torch.addmm`` /
            ``torch.mm``; deterministic per cuBLAS's own rules, with
            ``torch.use_deterministic_algorithms(True)``). 0 (default) keeps them on cake's
            kernels. The wgrad (split-K and ``main_grad``-fused) is always cake's.
        wgrad_tma: operand loads of the wgrad GEMM. 0 = the
            pointer kernel ``cake_core.gemm.matmul_kernel`` (masked ``tl.load``); 1 = the
            TMA kernel ``matmul_tma_kernel`` (``matmul(..., tma=True)``: dy and x read
            through host-side TMA tensor descriptors, dy as ``[wgrad_block_k, wgrad_block_m]``
            tiles of the row-major dy transposed in registers; one program per output tile
            and slice); 2 = the same TMA kernel persistent (one program per SM walking the
            (tile, slice) items in a fixed order; same bits as 1). Same tiles, slices and
            ordered sum; bits fixed per plan, not promised equal across the three values.
            1 and 2 need ``N`` and ``K`` times the element size to be multiples of 16 bytes
            (:func:`wgrad_tma_problem`); dy / x views whose layout TMA cannot read are
            copied contiguous first. The rule picks 1 on Hopper or newer for 16-bit
            inputs with aligned N and K (see :func:`make_plan`), 0 elsewhere.

    One field with a default (keyword only; a dict without it loads as "ieee", the
    products every plan made before it had):
        fp32_dots: how fp32 inputs multiply in cake's GEMMs, an index into
            ``cake_core.gemm.FP32_DOTS``: 0 "tf32" (not exact), 1 "ieee" (default: exact
            fp32 products on the CUDA cores), 2 "tf32x3", 3 "bf16x6" (each operand split
            into three bf16 parts, the six leading cross products summed in fp32 on tensor
            cores; needs compute capability >= 8). The interpreter computes every one in
            fp32. No effect on bf16/fp16.

    Format version 2 added ``wgrad_tma``; a version-1 dict is refused by ``from_dict``
    (re-make the plan, or add ``wgrad_tma = 0`` and ``version = 2`` for the same launches).
    """

    family: ClassVar[str] = "cake-dense-projection-det-gemm"
    format_version: ClassVar[int] = 2
    #: the mode every plan of this class carries (a nondet sibling's subclass sets
    #: ``Mode.NONDET``)
    expected_mode: ClassVar[Mode] = Mode.DET

    out_features: int
    in_features: int
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    wgrad_block_m: int
    wgrad_block_n: int
    wgrad_block_k: int
    wgrad_group_m: int
    wgrad_num_warps: int
    wgrad_num_stages: int
    wgrad_splits: int
    reduce_block: int
    allow_tf32: int
    cublas_fwd_dgrad: int
    wgrad_tma: int
    fp32_dots: int = dataclasses.field(default=1, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_int_fields()
        self.require_at_least("out_features", "in_features")
        self.require_power_of_two(*_POW2_FIELDS, minimum=16)
        self.require_at_least("group_m", "wgrad_group_m", "num_stages", "wgrad_num_stages")
        self.require_warps("num_warps", "wgrad_num_warps")
        self.require_in_range("wgrad_splits", 1, MAX_WGRAD_SPLITS)
        self.require_flags("allow_tf32", "cublas_fwd_dgrad")
        self.require_in_range("wgrad_tma", 0, 2)
        self.require_in_range("fp32_dots", 0, 3)  # cake_core.gemm.FP32_DOTS's indices
        if self.wgrad_tma and max(self.wgrad_block_m, self.wgrad_block_n,
                                  self.wgrad_block_k) > 256:
            self._fail("wgrad_tma needs wgrad_block_m / _n / _k <= 256 (a TMA box edge)")
        self.require_mode(self.expected_mode)


def wgrad_tma_problem(plan: DenseProjectionDetPlan, dtype: torch.dtype) -> str | None:
    """Why ``plan`` (with ``wgrad_tma`` > 0) cannot run the TMA wgrad for inputs of
    ``dtype`` (None when it can, or when ``wgrad_tma = 0``): TMA reads rows of dy ``[M, N]``
    and x ``[M, K]`` whose byte lengths must be multiples of 16."""
    if not plan.wgrad_tma:
        return None
    if not tma_available():
        return (f"wgrad_tma={plan.wgrad_tma} needs Triton >= 3.4 "
                "(triton.tools.tensor_descriptor); use wgrad_tma=0")
    es = torch.tensor([], dtype=dtype).element_size()
    bad = [f"{n}={v}" for n, v in (("N", plan.out_features), ("K", plan.in_features))
           if (v * es) % 16]
    if bad:
        return (f"wgrad_tma={plan.wgrad_tma} needs out_features N and in_features K to be "
                f"multiples of {16 // es} for {str(dtype)[6:]} (TMA reads 16-byte aligned rows "
                f"of dy [M, N] and x [M, K]), got {', '.join(bad)}; use wgrad_tma=0")
    return None

_PLANS: dict[tuple, DenseProjectionDetPlan] = {}


def tma_available() -> bool:
    """Whether this Triton has host-side TMA descriptors (Triton >= 3.4; imports Triton, so
    called only where a CUDA rule is evaluated or a TMA plan is resolved)."""
    from cake_core.gemm import tma_available as available

    return available()


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (a rule input; tests patch it)."""
    return torch.cuda.get_device_capability(device)


def _int(v, name: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise ValueError(f"{name}: must be an int >= {lo}, got {v!r}")
    return int(v)


def make_plan(M: int, N: int, K: int, dtype: torch.dtype,
              device: torch.device | str) -> DenseProjectionDetPlan:
    """Pick the plan for ``y[M, N] = x[M, K] · W[N, K]ᵀ`` in ``dtype`` on ``device``.

    Rules (read M, N, K, dtype and the SM count; never timing; measurements:
    docs/benchmarks/dense_projection.md):

    - CUDA, bf16/fp16, forward and dgrad: routed to cuBLAS (``cublas_fwd_dgrad = 1``): it
      was faster than every cake tile configuration tried, and it repeats bitwise (tested
      on the GPU by ``test_cuda_cublas_route_repeats_bitwise``). The cake tiles below stay
      in the plan for fp32 and for callers who set ``cublas_fwd_dgrad = 0``.
    - CUDA cake forward/dgrad tiles: 128×256×64 (8 warps, 3 stages, group_m 8) when the
      output ``[M, max(N, K)]`` fills at least one wave of SMs with them, else 128×128×64
      (4 stages), else 64×128×64 (4 warps, 4 stages). fp32: block_k 32 (64 with "bf16x6"
      on compute capability 9.x / 10.x), 3 stages.
    - CUDA wgrad ``dW[N, K]`` (always cake: fixed order): 128×256 output tiles, 64 tokens
      per step, 8 warps, 3 stages when ``cdiv(N, 128) · cdiv(K, 256)`` fills the SMs (the
      sweep's best on the large shapes), else 128×128 tiles.
      fp32: 32 tokens per step (64 with "bf16x6" on compute capability 9.x / 10.x), 128×128.
    - Split rule (wgrad and dbias): with T = number of wgrad output tiles,
      ``S = 1`` when T >= SMs, else ``S = clamp(min(SMs // T, M // MIN_SLICE), 1, 16)``,
      MIN_SLICE = 4096 tokens on CUDA (shorter slices did not pay for their partial
      planes).
    - CPU (Triton interpreter; every launch, program and K step costs Python time, while
      numpy multiplies a whole block in one call): tiles follow the GEMM dims, ``fit(d)`` =
      the next power of two of d clamped to [16, 256] (``CPU_TILE_MIN``, ``CPU_TILE_MAX``).
      Forward and dgrad: ``block_m = fit(M)``, ``block_n = block_k = fit(max(N, K))`` (the
      forward's output columns are N and its reduction K, the dgrad's the other way round);
      wgrad: ``fit(max(N, K))`` square output tiles and ``min(128, fit(M))`` tokens per step
      (``CPU_WGRAD_TOKENS``; a split slice is a whole number of steps). So a projection
      whose dims are all <= 256 (and M <= 128) runs each GEMM as one program of one step.
      The split rule counts these wgrad tiles with 4 "SMs" and MIN_SLICE 128 tokens
      (``CPU_MIN_SLICE``); no cuBLAS.
    - ``allow_tf32 = 0`` always; ``reduce_block`` 1024 (4096 on the CPU).
    - fp32 on CUDA with bf16 tensor cores (compute capability >= 8): ``fp32_dots = 3``
      ("bf16x6"), with 64-deep K steps on Hopper and datacenter Blackwell (compute
      capability 9.x / 10.x: 3 stages of 128×64 fp32 operand tiles, 128-176 KiB, fit their
      227 KiB of shared memory per block; consumer Blackwell, 12.x, has 99 KiB and keeps
      32-deep steps): at the tinylm main job's projections every GEMM ran
      faster than the exact kernel, together faster than cuBLAS SGEMM, and nearer the
      float64 product than either (docs/benchmarks/dense_projection.md). Elsewhere (CPU,
      older GPUs) ``fp32_dots = 1`` ("ieee").
    - CUDA wgrad on Hopper or newer (compute capability >= 9), bf16/fp16, N and K multiples
      of 8 (TMA reads 16-byte rows): ``wgrad_tma = 1`` (TMA-descriptor operand loads) with 4
      stages: pipelined TMA loads brought the wgrad to about cuBLAS's time, where pointer
      loads took a quarter more (4 stages help the ``main_grad`` epilogue). When even
      128×128 tiles leave SMs idle (``cdiv(N, 128) · cdiv(K, 128) < SMs``): 64×128 tiles,
      128 tokens per step, 4 warps, 4 stages (more programs on a skinny GEMM). The
      persistent form (``wgrad_tma = 2``) was not faster and is slower on the skinny shape;
      it stays opt-in. Elsewhere
      (CPU, fp32, older GPUs, unaligned N or K): ``wgrad_tma = 0``, the pointer kernel.

    Equal arguments give the equal plan (cached; a pure function of its key).

    Raises:
        ValueError: M < 0, N or K < 1 (or not ints), dtype not fp32/bf16/fp16, bad device.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: a CUDA plan reads the device (SM count, compute capability), "
                         "but CUDA is not available here")
    M, N, K = _int(M, "M", 0), _int(N, "N", 1), _int(K, "K", 1)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype: expected float32, bfloat16 or float16, got {dtype}")
    return cached_plan(_PLANS, (M, N, K, dtype, device.type, device.index),
                       lambda: _rule(M, N, K, dtype, device))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _rule(M: int, N: int, K: int, dtype: torch.dtype, device: torch.device):
    cuda = device.type == "cuda"
    sms = sm_count(device)
    fp32 = dtype == torch.float32
    if cuda:
        wide = max(N, K)
        cap = cuda_capability(device)[0]
        split32 = fp32 and cap >= 8  # "bf16x6" products on bf16 tensor cores
        # 64-deep fp32 steps: 128 KiB of shared memory at 128x128 (3 stages), more than the
        # 99 KiB per block of consumer Blackwell (12.x); Hopper / datacenter Blackwell hold it
        bk = 32 if fp32 and not (split32 and cap in (9, 10)) else 64
        if _cdiv(M, 128) * _cdiv(wide, 256) >= sms and not fp32:
            bm, bn, warps, stages = 128, 256, 8, 3
        elif _cdiv(M, 128) * _cdiv(wide, 128) >= sms:
            bm, bn, warps, stages = 128, 128, 8, 3 if fp32 else 4
        else:
            bm, bn, warps, stages = 64, 128, 4, 3 if fp32 else 4
        if not fp32 and _cdiv(N, 128) * _cdiv(K, 256) >= sms:
            wbm, wbn = 128, 256
        else:
            wbm, wbn = 128, 128
        wbk, wwarps, wstages = bk, 8, 3
        min_slice, reduce_block = 4096, 1024
        es = 2 if not fp32 else 4
        tma = int(not fp32 and tma_available() and cap >= 9
                  and (N * es) % 16 == 0 and (K * es) % 16 == 0)
        if tma:
            wstages = 4
            if (wbm, wbn) == (128, 128) and _cdiv(N, 128) * _cdiv(K, 128) < sms:
                # too few 128x128 tiles for the SMs: 64x128 tiles, 128 tokens per step
                wbm, wbk, wwarps = 64, 128, 4
    else:
        def fit(d: int) -> int:
            return max(CPU_TILE_MIN, min(CPU_TILE_MAX, next_power_of_2(d)))

        bm, bn = fit(M), fit(max(N, K))
        bk = wbm = wbn = bn
        wbk = min(CPU_WGRAD_TOKENS, fit(M))
        warps = wwarps = 4
        stages = wstages = 1
        min_slice, reduce_block = CPU_MIN_SLICE, 4096
        tma = split32 = 0
    tiles = _cdiv(N, wbm) * _cdiv(K, wbn)
    splits = 1 if tiles >= sms else max(1, min(sms // tiles, M // min_slice, MAX_WGRAD_SPLITS))
    return DenseProjectionDetPlan(
        out_features=N, in_features=K,
        block_m=bm, block_n=bn, block_k=bk, group_m=8, num_warps=warps, num_stages=stages,
        wgrad_block_m=wbm, wgrad_block_n=wbn, wgrad_block_k=wbk, wgrad_group_m=8,
        wgrad_num_warps=wwarps, wgrad_num_stages=wstages, wgrad_splits=splits,
        reduce_block=reduce_block, allow_tf32=0, cublas_fwd_dgrad=int(cuda and not fp32),
        wgrad_tma=tma, fp32_dots=3 if split32 else 1,
    )
