"""Triton kernels of cake-gqa-train: the backward with atomic dQ (bwd.py); the forward and
the delta kernel are cake-gqa-det-train's."""
