"""GQAPlan (mode ``nondet``) and the rule that picks it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode, Plan, check_device, check_float_dtype
from cake_core.plan import cached_plan
from cake_gqa_det_train.plan import HEAD_DIMS


@dataclasses.dataclass(frozen=True)
class GQAPlan(Plan):
    """Execution plan of the non-deterministic GQA kernels (``mode`` is ``nondet``). Every
    field has a default (the CUDA rule's plan at head dim 128).

    Fields:
        elem_bytes: bytes of an input element the tiles are sized for: 2 (bf16, fp16) or
            4 (fp32, whose tiles take twice the shared memory); a call refuses a plan made
            for the other size.
        head_dim: D (64, 128 or 256).
        fwd_block_m / fwd_block_n / fwd_warps / fwd_stages: the forward (cake-gqa-det-train's
            kernel): query rows per program, keys per step, warps, pipeline stages.
        bwd_atomic: 1: dK / dV by the atomic kernel (one program per key block and query
            head; GQA's heads added atomically); 0: by cake-gqa-det-train's kernel (one
            program per key block and KV head), the CUDA rule's: on an H200 the atomic
            kernel was no faster at any benchmark shape (docs/benchmarks/gqa.md).
        bwd_block_m / bwd_block_n / bwd_warps / bwd_stages: the dK / dV kernel: query rows
            per step, keys per program.
        dq_block_m / dq_block_n / dq_warps / dq_stages: the dQ kernel (cake-gqa-det-train's).
        delta_block_m: rows per program of rowsum(dO * O).
    """

    family: ClassVar[str] = "cake-gqa-train"
    format_version: ClassVar[int] = 1

    head_dim: int = 128
    elem_bytes: int = 2
    fwd_block_m: int = 128
    fwd_block_n: int = 128
    fwd_warps: int = 8
    fwd_stages: int = 3
    bwd_atomic: int = 0
    bwd_block_m: int = 64
    bwd_block_n: int = 64
    bwd_warps: int = 4
    bwd_stages: int = 2
    dq_block_m: int = 128
    dq_block_n: int = 64
    dq_warps: int = 8
    dq_stages: int = 3
    delta_block_m: int = 64
    mode: Mode = dataclasses.field(default=Mode.NONDET, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_int_fields()
        if self.head_dim not in HEAD_DIMS:
            self._fail(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.elem_bytes not in (2, 4):
            self._fail(f"elem_bytes must be 2 or 4, got {self.elem_bytes}")
        self.require_power_of_two("fwd_block_m", "fwd_block_n", "bwd_block_m", "bwd_block_n",
                                  "dq_block_m", "dq_block_n", minimum=16)
        self.require_power_of_two("delta_block_m")
        self.require_warps("fwd_warps", "bwd_warps", "dq_warps")
        self.require_in_range("bwd_atomic", 0, 1)
        for n in ("fwd_stages", "bwd_stages", "dq_stages"):
            self.require_in_range(n, 1, 6)
        self.require_mode(Mode.NONDET)


_PLANS: dict[tuple, GQAPlan] = {}


def make_plan(head_dim: int, dtype: torch.dtype, device: torch.device | str) -> GQAPlan:
    """The plan for heads of dim ``head_dim`` in ``dtype`` on ``device`` (a rule of head
    dim, element size and device: every tile as cake-gqa-det-train's rule picks it, the
    dK / dV programs one per query head instead of one per KV head).

    Raises:
        ValueError: head_dim not in (64, 128, 256), a bad dtype or device.
    """
    device = check_device(device)
    check_float_dtype(dtype)
    if isinstance(head_dim, bool) or head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim: must be one of {HEAD_DIMS}, got {head_dim!r}")
    from cake_gqa_det_train.plan import shared_memory

    return cached_plan(_PLANS, (int(head_dim), dtype, device.type, shared_memory(device)),
                       lambda: _rule(int(head_dim), dtype, device))


def _rule(D: int, dtype: torch.dtype, device: torch.device) -> GQAPlan:
    from cake_gqa_det_train.plan import make_plan as det_rule

    f = det_rule(D, dtype, device)  # the forward and dQ are the det package's kernels
    keep = ("elem_bytes", "fwd_block_m", "fwd_block_n", "fwd_warps", "fwd_stages",
            "delta_block_m", "dq_block_m", "dq_block_n", "dq_warps", "dq_stages")
    # CUDA: the det kernel, no slower than the atomic one at any benchmark shape on an H200
    # (measurements: docs/benchmarks/gqa.md); the interpreter runs the atomic kernel
    atomic = int(device.type != "cuda")
    return GQAPlan(head_dim=D, bwd_atomic=atomic, bwd_block_m=f.dkdv_block_m,
                   bwd_block_n=f.dkdv_block_n, bwd_warps=f.dkdv_warps, bwd_stages=f.dkdv_stages,
                   **{n: getattr(f, n) for n in keep})
