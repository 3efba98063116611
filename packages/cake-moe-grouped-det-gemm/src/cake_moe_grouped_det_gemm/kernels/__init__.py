"""Triton kernels of cake-moe-grouped-det-gemm. Kernels never allocate.

``grouped_mm_kernel`` runs the forward and the dgrad (a tile scheduler computed from the
expert offsets on the device), ``grouped_wgrad_kernel`` the per-expert split-K wgrad; the
partial planes are summed in slice order by cake-core's ``ordered_sum_kernel``.
``grouped_mm_tma_kernel`` / ``grouped_wgrad_tma_kernel``: the same with operands read through
TMA tensor descriptors (plan field ``tma``). ``zero_tail_rows_kernel`` zeroes the rows past the
last expert's end of an output ``torch._grouped_mm`` wrote (plan field ``grouped_mm_fwd_dgrad``).
``gather_sum_kernel`` / ``combine_bwd_kernel``: the MoE layer's combine and the permutation's
backward (token rows gathered from expert rows and summed in slot order). ``row_ends_kernel``,
``schedule_kernel``, ``expert_order_kernel``: the integer metadata built from the offsets.
``route_fwd_kernel`` / ``route_bwd_kernel``: the router's top-k softmax gate.
"""

from cake_core.triton_utils import select_backend

select_backend()  # decide CUDA or interpreter before any @triton.jit below runs

from cake_moe_grouped_det_gemm.kernels.combine import (  # noqa: E402
    combine_bwd_kernel,
    gather_sum_kernel,
)
from cake_moe_grouped_det_gemm.kernels.grouped import (  # noqa: E402
    grouped_mm_kernel,
    grouped_mm_tma_kernel,
    grouped_wgrad_kernel,
    grouped_wgrad_tma_kernel,
    zero_tail_rows_kernel,
)
from cake_moe_grouped_det_gemm.kernels.meta import (  # noqa: E402
    expert_order_kernel,
    row_ends_kernel,
    schedule_kernel,
)
from cake_moe_grouped_det_gemm.kernels.route import (  # noqa: E402
    route_bwd_kernel,
    route_fwd_kernel,
)

__all__ = ["combine_bwd_kernel", "expert_order_kernel", "gather_sum_kernel", "grouped_mm_kernel", "grouped_mm_tma_kernel", "grouped_wgrad_kernel",
           "grouped_wgrad_tma_kernel", "route_bwd_kernel", "route_fwd_kernel", "row_ends_kernel", "schedule_kernel",
           "zero_tail_rows_kernel"]
