"""GQADetPlan and the rule that picks it (head dim, dtype, device; never timing)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode, Plan, check_device, check_float_dtype
from cake_core.plan import cached_plan
from cake_core.triton_utils import (
    A100_SHARED_MEMORY,
    HOPPER_SHARED_MEMORY,
    SMALL_SHARED_MEMORY,
    rule_shared_memory,
)

#: Head dims the kernels are built for (q's and v's head dim are equal).
HEAD_DIMS = (64, 128, 256)


@dataclasses.dataclass(frozen=True)
class GQADetPlan(Plan):
    """Execution plan of the det GQA kernels. Every field has a default (the CUDA rule's
    plan at head dim 128); :func:`make_plan` picks them by head dim and device.

    Fields:
        elem_bytes: bytes of an input element the tiles are sized for: 2 (bf16, fp16) or
            4 (fp32, whose tiles take twice the shared memory); a call refuses a plan made
            for the other size.
        head_dim: D, the head dim of q, k and v (64, 128 or 256).
        fwd_block_m / fwd_block_n / fwd_warps / fwd_stages: the forward's query rows per
            program, keys per step, warps and software-pipeline stages.
        dkdv_block_m / dkdv_block_n / dkdv_warps / dkdv_stages: the dK/dV kernel's query
            rows per step and keys per program (the program sums its KV head's query heads
            in head order and their query blocks in block order: the bits may depend on
            dkdv_block_m).
        dq_block_m / dq_block_n / dq_warps / dq_stages: the dQ kernel's query rows per
            program and keys per step (its sum runs over key blocks in order: the bits
            may depend on dq_block_n).
        delta_block_m: rows per program of rowsum(dO * O).

    The forward's bits may depend on fwd_block_n (the online softmax's steps). Token and
    head counts are no fields: one plan serves every shape of its head dim and element
    size.
    """

    family: ClassVar[str] = "cake-gqa-det-train"
    format_version: ClassVar[int] = 1

    head_dim: int = 128
    elem_bytes: int = 2
    fwd_block_m: int = 128
    fwd_block_n: int = 128
    fwd_warps: int = 8
    fwd_stages: int = 3
    dkdv_block_m: int = 64
    dkdv_block_n: int = 64
    dkdv_warps: int = 4
    dkdv_stages: int = 2
    dq_block_m: int = 128
    dq_block_n: int = 64
    dq_warps: int = 8
    dq_stages: int = 3
    delta_block_m: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_int_fields()
        if self.head_dim not in HEAD_DIMS:
            self._fail(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.elem_bytes not in (2, 4):
            self._fail(f"elem_bytes must be 2 or 4, got {self.elem_bytes}")
        self.require_power_of_two("fwd_block_m", "fwd_block_n", "dkdv_block_m",
                                  "dkdv_block_n", "dq_block_m", "dq_block_n", minimum=16)
        self.require_power_of_two("delta_block_m")
        self.require_warps("fwd_warps", "dkdv_warps", "dq_warps")
        for n in ("fwd_stages", "dkdv_stages", "dq_stages"):
            self.require_in_range(n, 1, 6)
        self.require_mode(Mode.DET)


_PLANS: dict[tuple, GQADetPlan] = {}


def make_plan(head_dim: int, dtype: torch.dtype, device: torch.device | str) -> GQADetPlan:
    """The plan for heads of dim ``head_dim`` in ``dtype`` on ``device``.

    Rules (no timing at run time; from sweeps on an H200 at the benchmark shapes,
    docs/benchmarks/gqa.md): on CUDA, forward programs of 128 query rows with 8 warps
    stepping 128 keys in 3 stages at D <= 128, 64 keys in 2 stages at D = 256 (more
    overflows shared memory). Backward: dK/dV programs of 64 keys stepping 64 query rows
    in 2 stages with 4 warps at D <= 128; at D = 256 programs of 32 keys stepping 128 query
    rows with 8 warps in 2 stages (the 32 x 256 fp32 dK and dV accumulators spill a
    seventh of the 64-key ones; faster than 64 x 64 at Qwen3-Next's shape); dQ programs of
    128 rows with 8 warps
    in 3 stages stepping 64 keys at D <= 128, 32 at D = 256. Under
    the interpreter 32 x 32 tiles (fewer Python-level programs than 16; loops still cross
    blocks in the tests). fp32 inputs on CUDA (dots in TF32) take smaller tiles and
    single-stage loops, as their tiles take twice the shared memory (not tuned for speed).

    Those CUDA tiles need Hopper's shared memory per block (227 KiB; up to 224 KiB at D 128).
    The rule reads the device's limit (:func:`shared_memory`): with less than Hopper's, the
    tiles of ``_SMALLER_16BIT`` / ``_SMALLER_FP32`` for its class, 163 KiB (A100) or 99 KiB
    (consumer Ampere, Ada and Blackwell): fewer stages, then smaller tiles, each kernel's
    shared memory read from Triton compiles for sm_80, sm_86 and sm_120 under the class's
    limit (docs/benchmarks/gqa.md; correct, not timed on such GPUs).

    Raises:
        ValueError: head_dim not in (64, 128, 256), a bad dtype or device.
    """
    device = check_device(device)
    check_float_dtype(dtype)
    if isinstance(head_dim, bool) or head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim: must be one of {HEAD_DIMS}, got {head_dim!r}")
    smem = shared_memory(device)
    return cached_plan(_PLANS, (int(head_dim), dtype, device.type, smem),
                       lambda: _rule(int(head_dim), dtype, device, smem))


def shared_memory(device: torch.device) -> int:
    """The rule's shared memory input, :func:`cake_core.triton_utils.rule_shared_memory`:
    the CUDA device's per-block limit; Hopper's where there is no CUDA (a CUDA plan made on
    a machine without a GPU is Hopper's, as the rule's tiles were before they read the
    device) and on the CPU (unused there)."""
    return rule_shared_memory(device)


def _rule(D: int, dtype: torch.dtype, device: torch.device, smem: int) -> GQADetPlan:
    return dataclasses.replace(_tiles(D, dtype, device, smem), elem_bytes=dtype.itemsize)


#: The shared memory classes (cake_core.triton_utils): Hopper's, which the CUDA rule's
#: tiles are sized for; A100's; consumer Ampere, Ada and Blackwell's.
HOPPER_SMEM, A100_SMEM, SMALL_SMEM = HOPPER_SHARED_MEMORY, A100_SHARED_MEMORY, SMALL_SHARED_MEMORY

#: 16-bit tiles where the device has less shared memory than Hopper, by (class, D): the
#: fields replaced in the Hopper plan. Each kernel's shared memory at these tiles was
#: read from Triton 3.6 compiles for sm_80 (A100 class) and sm_86 / sm_120 (the small
#: class), all under the class's limit (docs/benchmarks/gqa.md); not tuned for speed.
_SMALLER_16BIT = {
    (A100_SMEM, 128): {"fwd_stages": 2},
    (A100_SMEM, 256): {"dkdv_block_m": 64, "dkdv_block_n": 16, "dq_block_m": 64,
                       "dq_stages": 2},
    (SMALL_SMEM, 64): {"fwd_stages": 2},
    (SMALL_SMEM, 128): {"fwd_block_n": 64, "fwd_stages": 2, "dq_stages": 2},
    (SMALL_SMEM, 256): {"fwd_block_m": 64, "fwd_block_n": 32, "fwd_warps": 4,
                        "dkdv_block_m": 32, "dkdv_block_n": 32, "dkdv_warps": 4,
                        "dq_block_m": 64, "dq_block_n": 16, "dq_warps": 4, "dq_stages": 2},
}


#: fp32 tiles where the device has less shared memory than Hopper (as ``_SMALLER_16BIT``).
_SMALLER_FP32 = {
    (A100_SMEM, 256): {"dkdv_block_m": 16, "dkdv_block_n": 16},
    (SMALL_SMEM, 128): {"fwd_block_m": 64, "fwd_block_n": 32, "fwd_warps": 4, "fwd_stages": 1,
                        "dkdv_block_m": 16, "dkdv_block_n": 32, "dq_block_m": 32,
                        "dq_block_n": 32},
    (SMALL_SMEM, 256): {"fwd_block_m": 32, "fwd_block_n": 16, "fwd_warps": 4, "fwd_stages": 1,
                        "dkdv_block_m": 16, "dkdv_block_n": 16, "dq_block_m": 16,
                        "dq_block_n": 16},
}


def _tiles(D: int, dtype: torch.dtype, device: torch.device, smem: int) -> GQADetPlan:
    plan = _hopper_tiles(D, dtype, device)
    if device.type != "cuda" or smem >= HOPPER_SMEM:
        return plan
    cls = A100_SMEM if smem >= A100_SMEM else SMALL_SMEM
    if dtype == torch.float32:
        return dataclasses.replace(plan, **_SMALLER_FP32.get((cls, D), {}))
    return dataclasses.replace(plan, **_SMALLER_16BIT.get((cls, D), {}))


def _hopper_tiles(D: int, dtype: torch.dtype, device: torch.device) -> GQADetPlan:
    if device.type != "cuda":
        return GQADetPlan(head_dim=D, fwd_block_m=32, fwd_block_n=32, fwd_warps=4,
                          fwd_stages=1, dkdv_block_m=32, dkdv_block_n=32, dkdv_warps=4,
                          dkdv_stages=1, dq_block_m=32, dq_block_n=32, dq_warps=4,
                          dq_stages=1, delta_block_m=32)
    if dtype == torch.float32:  # twice the bytes a tile: fewer stages, smaller tiles
        wide = D == 256
        return GQADetPlan(head_dim=D, fwd_block_m=64 if wide else 128, fwd_block_n=64,
                          fwd_warps=4 if wide else 8, fwd_stages=1 if wide else 2,
                          dkdv_block_m=32, dkdv_block_n=32 if wide else 64, dkdv_warps=4,
                          dkdv_stages=1, dq_block_m=32 if wide else 64,
                          dq_block_n=32 if wide else 64, dq_warps=4, dq_stages=1,
                          delta_block_m=32)
    if D == 256:
        return GQADetPlan(head_dim=D, fwd_block_m=128, fwd_block_n=64, fwd_warps=8,
                          fwd_stages=2, dkdv_block_m=128, dkdv_block_n=32, dkdv_warps=8,
                          dkdv_stages=2, dq_block_m=128, dq_block_n=32, dq_warps=8,
                          dq_stages=3, delta_block_m=32)
    return GQADetPlan(head_dim=D)
