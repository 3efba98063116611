"""Triton kernels of cake-gqa-det-train: the forward (fwd.py) and the backward (bwd.py)."""
