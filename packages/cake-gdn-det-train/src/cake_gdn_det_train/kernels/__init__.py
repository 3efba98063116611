"""Triton kernels of cake-gdn-det-train, one file per stage. Kernels never allocate."""

from cake_core.triton_utils import select_backend

select_backend()  # decide CUDA or interpreter before any @triton.jit below runs

# Every tl.dot in these kernels takes fp32 operands (inputs are upcast on load), so the
# interpreter's bf16 tl.dot problem (see cake_core.triton_utils.dot) cannot arise, and the
# precision is chosen by the plan (DOT_PRECISION: "ieee" or "tf32" on CUDA; the interpreter
# always computes in fp32). Calling tl.dot directly also avoids a nested @triton.jit call per
# dot, which the interpreter re-patches each time (a large share of its run time here).
