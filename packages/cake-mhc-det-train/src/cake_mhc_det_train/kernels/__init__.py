"""Triton kernels of cake-mhc-det-train, one file per stage. Kernels never allocate."""

from cake_core.triton_utils import select_backend

select_backend()  # decide CUDA or interpreter before any @triton.jit below runs
