"""Triton kernels of cake-dense-projection-det-gemm. Kernels never allocate.

The GEMMs are cake-core's shared kernels (:mod:`cake_core.gemm`): ``matmul_kernel`` runs the
forward, dgrad, wgrad (split-K over tokens) and dbias (a ones row times dy),
``matmul_tma_kernel`` the wgrad instead when the plan sets ``wgrad_tma`` (TMA-descriptor
operand loads; the rule's choice on Hopper for 16-bit inputs), and
``ordered_sum_kernel`` adds the wgrad/dbias partial planes in slice order.
"""

from cake_core.triton_utils import select_backend

select_backend()  # decide CUDA or interpreter before any @triton.jit below runs

from cake_core.gemm import matmul_kernel, matmul_tma_kernel, ordered_sum_kernel  # noqa: E402

__all__ = ["matmul_kernel", "matmul_tma_kernel", "ordered_sum_kernel"]
