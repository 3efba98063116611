"""LMHeadLossDetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.plan import cached_plan
from cake_core.triton_utils import next_power_of_2

#: Largest hidden size and vocabulary the plan rule accepts (int32-safe chunk offsets).
MAX_HIDDEN = 65536
MAX_VOCAB = 1 << 22

REDUCTIONS = ("none", "mean", "sum")

#: logits elements per chunk the rule aims for: fp32 logits (+ low-precision dlogits) of
#: ``chunk_tokens x V`` are the extra memory (README, "Memory").
CHUNK_BUDGET_CUDA = 1 << 26
CHUNK_BUDGET_CPU = 1 << 16


@dataclasses.dataclass(frozen=True)
class LMHeadLossDetPlan(Plan):
    """Execution plan of the det LM-head loss.

    Fields (all ints; booleans as 0/1 so the plan crosses a custom op as ``list[int]``):
        hidden_size, vocab_size: H and V.
        chunk_tokens: tokens per chunk. Chunk ``c`` covers tokens ``[c*C, (c+1)*C)``; the
            chunks run in increasing order and dweight / dbias are summed over them in
            that order, so changing ``chunk_tokens`` changes their bits.
        block_m, block_v, num_warps: the softmax/CE kernel's tile (rows x vocab columns per
            step; the vocabulary is walked in fixed ``block_v`` steps) and warps.
        loss_block: tokens per step of the fixed-order loss sum.
        logits_block_{m,n,k}, dh_block_{m,n,k}, dw_block_{m,n,k}: tiles of the three chunk
            GEMMs (cake_core.gemm.matmul): logits = h_c @ W^T (M=chunk, N=V, K=H),
            dhidden_c = dlogits @ W (M=chunk, N=H, K=V), dweight += dlogits^T @ h_c
            (M=V, N=H, K=chunk). gemm_group_m, gemm_warps, gemm_stages: shared by all three.
        dh_split: fixed split of the vocabulary (the reduction dim of dhidden = dlogits @ W)
            into fp32 partial planes summed in order (1: no split).
        check_labels: 1 to check labels are in [0, V) or ignore_index before any launch
            (``ValueError``; on a GPU one host sync), 0 to skip: an out-of-range label then
            makes its row's loss and gradients NaN (never a bad access).
        grad_in_forward: 1 to compute the gradients in the forward (one logits pass; mean
            and sum only), 0 to recompute the logits in the backward.
        cublas_gemms: 1 routes the two plain GEMMs of a chunk to cuBLAS: the logits
            (``torch.mm(h_c, W^T, out_dtype=float32)``, fp32 logits from 16-bit operands;
            a bias is then added in fp32) and dhidden (``torch.mm(dlogits, W)``, only with
            ``dh_split == 1``). The dweight GEMM, which sums over chunks in chunk order,
            always stays cake's. CUDA with bf16/fp16 only; cuBLAS repeats bitwise on the
            H200 (GPU test ``test_cuda_cublas_route_repeats_bitwise``).
        defer_dw_tokens: with ``grad_in_forward`` and 16-bit inputs, calls of at most this
            many tokens keep every chunk's dlogits (``[T, V]`` in the inputs' dtype)
            instead of summing ``dweight`` chunk by chunk into an fp32 ``[V, H]``; the
            backward then computes ``dweight = g · dlogitsᵀ · hidden`` in one GEMM over all
            T tokens (in token order) with the upstream gradient g applied in its epilogue
            and writes the weight's dtype directly (or adds into ``main_grad``). Less
            memory when ``2·T·V < 4·V·H`` and no per-chunk read-modify-write of the fp32
            sum. 0: never.

    One field with a default (keyword only; a dict without it loads as 0, the launches of
    every plan made before it):
        dw_tma: 1 reads the dweight GEMM's operands (each chunk's dlogits, transposed, and
            the hidden rows) through TMA tensor descriptors (``cake_core.gemm.matmul(...,
            tma=True)``) instead of masked pointer loads; the same tiles, K order and
            chunk order. Needs H and V times the element size to be multiples of 16 bytes
            and ``dw_block_{m,n,k} <= 256`` (a TMA box edge; else ``ValueError`` before any
            launch); a hidden or kept dlogits whose layout TMA cannot read (an unaligned
            view) is copied contiguous first. 0: pointer loads.
    """

    family: ClassVar[str] = "cake-lm-head-loss-det-train"
    format_version: ClassVar[int] = 2
    #: the mode every plan of this class carries (cake-lm-head-loss-nondet-train's subclass
    #: sets ``nondet``)
    expected_mode: ClassVar[Mode] = Mode.DET

    hidden_size: int
    vocab_size: int
    chunk_tokens: int
    block_m: int
    block_v: int
    num_warps: int
    loss_block: int
    logits_block_m: int
    logits_block_n: int
    logits_block_k: int
    dh_block_m: int
    dh_block_n: int
    dh_block_k: int
    dw_block_m: int
    dw_block_n: int
    dw_block_k: int
    gemm_group_m: int
    gemm_warps: int
    gemm_stages: int
    dh_split: int
    check_labels: int
    grad_in_forward: int
    cublas_gemms: int
    defer_dw_tokens: int
    dw_tma: int = dataclasses.field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_int_fields()
        self.require_in_range("hidden_size", 1, MAX_HIDDEN)
        self.require_in_range("vocab_size", 1, MAX_VOCAB)
        self.require_at_least("chunk_tokens", "dh_split", "gemm_group_m", "gemm_stages")
        self.require_at_least("defer_dw_tokens", minimum=0)
        self.require_power_of_two("block_m", "block_v", "loss_block")
        self.require_power_of_two(
            *[f"{g}_block_{d}" for g in ("logits", "dh", "dw") for d in "mnk"], minimum=16)
        self.require_warps("num_warps", "gemm_warps")
        self.require_flags("check_labels", "grad_in_forward", "cublas_gemms", "dw_tma")
        self.require_mode(self.expected_mode)

def _prev_power_of_2(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def _int_arg(v, name: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= v <= hi:
        raise ValueError(f"{name}: must be an int in [{lo}, {hi}], got {v!r}")
    return int(v)


_PLANS: dict[tuple, LMHeadLossDetPlan] = {}


def make_plan(hidden_size: int, vocab_size: int, dtype: torch.dtype,
              device: torch.device | str, *, reduction: str = "mean") -> LMHeadLossDetPlan:
    """Pick the plan for rows of ``hidden_size`` against a ``vocab_size`` vocabulary,
    ``dtype`` inputs on ``device``, for ``reduction``. The token count is not an input: one
    plan serves every batch (chunk buffers are sized ``min(T, chunk_tokens)`` rows when no
    workspace is given), and ``torch.compile`` with dynamic shapes needs no guard on it.

    Rules (no timing): on CUDA ``chunk_tokens`` is the largest multiple of 128 with
    ``chunk_tokens * V <= max(2**26, V * H / 3)`` logits elements, clamped to
    ``[128, 4096]`` (at H = 4096: 2048 tokens for V = 32000, 1280 for V = 128256 and
    151936): a larger floor's chunk buffers raise the peak memory at small vocabularies, a
    smaller one costs time (each chunk re-reads and re-writes the fp32 dweight sum;
    measurements: docs/benchmarks/lm_head_loss.md); under the interpreter the largest
    power of two with ``chunk_tokens * V <= 2**16``, clamped to ``[16, 4096]``. CE tile: 1 row x
    ``min(4096, next_power_of_2(V))`` columns, 8 warps on CUDA; 16 rows x
    ``min(2048, next_power_of_2(V))`` on the CPU. On CUDA with bf16/fp16 the logits and
    dhidden GEMMs go to cuBLAS (``cublas_gemms = 1``; faster than cake's tiles on GEMMs of
    this size, docs/benchmarks/dense_projection.md) and
    the dweight GEMM uses 128x256x64 tiles (8 warps, 3 stages; the sweep's best for a
    weight gradient); the cake tiles of the other two stay 128x128x64. fp32 on CUDA:
    64x64x32 (4 warps) for the three, no cuBLAS; on
    the CPU each GEMM's tile follows its dims (``next_power_of_2`` of M, N, K clamped to
    [16, 256]: fewer, fuller interpreted programs). No split of the dhidden GEMM. Labels
    are checked on the host on the CPU only (``check_labels``): on CUDA that check would sync
    the host every call (and forbid CUDA-graph capture), so an out-of-range label there
    gives a NaN loss instead of a ``ValueError``, as torch's cross entropy asserts on the
    device instead of raising. ``grad_in_forward`` is 1 for "mean" and "sum", 0 for "none"
    (per-token upstream gradients exist only at backward time) and for fp16 (whose dlogits,
    rounded before the upstream gradient, e.g. a loss scale, multiplies them, would lose
    small probabilities: fp16 keeps 5 exponent bits). ``defer_dw_tokens = 2·H`` for 16-bit
    inputs (the kept dlogits, 2·T·V bytes, then never exceed the 4·V·H bytes of the fp32
    dweight sum they replace), 0 for fp32. ``dw_tma = 1`` on CUDA devices of compute
    capability 9.x / 10.x (Hopper, datacenter Blackwell: read from the device; 0 where CUDA
    is not available) for bf16/fp16
    with H and V multiples of 8 and Triton's host TMA descriptors: pipelined TMA loads
    made the dweight GEMM faster at T 4096, H 4096, V 128256 (docs/benchmarks/
    lm_head_loss.md); 0 elsewhere.

    Raises:
        ValueError: a size out of range, a dtype other than fp32 / bf16 / fp16, an unknown
            reduction or device.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {e}") from None
    hidden_size = _int_arg(hidden_size, "hidden_size", 1, MAX_HIDDEN)
    vocab_size = _int_arg(vocab_size, "vocab_size", 1, MAX_VOCAB)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: must be one of {REDUCTIONS}, got {reduction!r}")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype: expected float32, bfloat16 or float16, got {dtype!r}")
    cap = cuda_capability(device) if device.type == "cuda" else (0, 0)
    key = (hidden_size, vocab_size, dtype, device.type, reduction, cap)
    return cached_plan(_PLANS, key, lambda: _rule(*key))


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device, ``(0, 0)`` where CUDA is not
    available (a rule input; tests patch it)."""
    if not torch.cuda.is_available():
        return (0, 0)
    return tuple(torch.cuda.get_device_capability(device))


def _tma_available() -> bool:
    from cake_core.gemm import tma_available  # imports Triton: only for a CUDA rule

    return tma_available()


def _rule(hidden_size: int, vocab_size: int, dtype: torch.dtype, device_type: str,
          reduction: str, cap: tuple[int, int] = (0, 0)) -> LMHeadLossDetPlan:
    cuda = device_type == "cuda"
    half = dtype in (torch.bfloat16, torch.float16)
    budget = CHUNK_BUDGET_CUDA if cuda else CHUNK_BUDGET_CPU
    if cuda:
        # a multiple of 128 tokens; the budget grows to V*H/3 elements where that is more
        # (the chunk buffers, 6 bytes per logit, then stay within the 2*V*H bytes of the
        # 16-bit dweight the backward returns anyway), so large vocabularies are not cut
        # into many chunks, each of which re-reads and re-writes the fp32 dweight sum
        budget = max(budget, vocab_size * hidden_size // 3)
        chunk = max(128, min(4096, budget // vocab_size // 128 * 128))
    else:
        chunk = max(16, min(4096, _prev_power_of_2(budget // vocab_size)))
    vp2 = next_power_of_2(vocab_size)
    gm = 8
    if cuda:
        block_m, block_v, warps, loss_block = 1, min(4096, vp2), 8, 1024
        bm, bn, bk, gw, gs = (64, 64, 32, 4, 3) if dtype == torch.float32 else \
            (128, 128, 64, 8, 3)
        tiles = {g: (bm, bn, bk) for g in ("logits", "dh", "dw")}
        if dtype != torch.float32:
            tiles["dw"] = (128, 256, 64)
    else:
        block_m, block_v, warps, loss_block = 16, min(2048, vp2), 4, 4096
        gw, gs = 4, 1
        fit = lambda d: max(16, min(256, next_power_of_2(d)))
        tiles = {"logits": (fit(chunk), fit(vocab_size), fit(hidden_size)),
                 "dh": (fit(chunk), fit(hidden_size), fit(vocab_size)),
                 "dw": (fit(vocab_size), fit(hidden_size), fit(chunk))}
    return LMHeadLossDetPlan(
        hidden_size=hidden_size, vocab_size=vocab_size, chunk_tokens=chunk,
        block_m=block_m, block_v=block_v, num_warps=warps, loss_block=loss_block,
        **{f"{g}_block_{d}": v for g, t in tiles.items() for d, v in zip("mnk", t, strict=True)},
        gemm_group_m=gm, gemm_warps=gw, gemm_stages=gs, dh_split=1, check_labels=int(not cuda),
        # fp16: the forward's dlogits (for an upstream gradient of 1, divided by the token
        # count for "mean") are rounded to fp16 before a loss scale multiplies them, and
        # small probabilities flush to 0; computed in the backward, they carry the scale
        grad_in_forward=0 if reduction == "none" or dtype == torch.float16 else 1,
        cublas_gemms=int(cuda and dtype in (torch.bfloat16, torch.float16)),
        defer_dw_tokens=2 * hidden_size if dtype in (torch.bfloat16, torch.float16) else 0,
        dw_tma=int(cuda and half and cap[0] in (9, 10) and hidden_size % 8 == 0
                   and vocab_size % 8 == 0 and _tma_available()),
    )
