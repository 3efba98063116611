"""Triton kernels of cake-gqa-train: dK / dV per query head summed by atomic adds
(bwd.py); the forward, delta and dQ kernels are cake-gqa-det-train's."""
