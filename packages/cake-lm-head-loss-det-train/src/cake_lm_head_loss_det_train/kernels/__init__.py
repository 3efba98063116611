"""Triton kernels of cake-lm-head-loss-det-train, one file per stage. Kernels never allocate.

The chunk GEMMs (logits, dhidden, dweight) and the ordered dbias sum are cake_core.gemm's.
"""

from cake_core.triton_utils import select_backend

select_backend()  # decide CUDA or interpreter before any @triton.jit below runs
