"""nn.Module drop-ins."""

from __future__ import annotations

import math

import torch
from torch import nn

from cake_causal_conv1d_det_train.api import _ACTIVATIONS, causal_conv1d_det


class ShortConvolution(nn.Conv1d):
    """Drop-in for FLA's ``ShortConvolution`` (a depthwise causal ``nn.Conv1d``) running
    cake's deterministic kernels.

    Same constructor arguments (``hidden_size``, ``kernel_size``, ``bias=False``,
    ``activation='silu'``, ``backend``, ``device``, ``dtype``), the same ``nn.Conv1d``
    parameters and initialisation (``weight`` ``[D, 1, W]``, ``bias`` ``[D]``), so FLA
    and ``nn.Conv1d(D, D, W, groups=D, padding=W - 1)`` state_dicts load as they are.
    ``backend`` is accepted for call compatibility and ignored ("triton", "cuda" or None):
    cake's kernels always run.

    Differences from FLA: the state (``cache`` / ``initial_state`` and the returned final
    state) is ``[N, D, W - 1]`` (Dao-AILab's layout; FLA keeps ``[N, D, W]`` whose first
    slot the convolution never reads); no in-place single-token decode step (a one-token
    call runs the same kernels and returns the new state); ``mask`` multiplies out of place.

    Raises:
        ValueError: at construction, a kernel size outside [2, 8], an unknown activation
            or backend; in forward, as :func:`causal_conv1d_det`, and if x's trailing dims
            do not flatten to ``hidden_size``, or ``mask`` comes with ``cu_seqlens``, or
            both ``cache`` and ``initial_state`` are given, or ``residual`` is not shaped
            like x or ``mask`` not ``[B, T]`` (before the conv runs).
    """

    #: the entry forward calls (cake-causal-conv1d-nondet-train's subclass sets its own)
    _conv = staticmethod(causal_conv1d_det)

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False,
                 activation: str | None = "silu", backend: str | None = None,
                 device=None, dtype=None):
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or \
                not 2 <= kernel_size <= 8:
            raise ValueError(f"kernel_size: must be an int in [2, 8], got {kernel_size!r}")
        if not (activation is None or isinstance(activation, str)) or \
                activation not in _ACTIVATIONS:
            raise ValueError(f"activation: expected None, 'silu' or 'swish', got "
                             f"{activation!r}")
        if backend not in (None, "triton", "cuda"):
            raise ValueError(f"backend: expected None, 'triton' or 'cuda', got {backend!r}")
        super().__init__(hidden_size, hidden_size, kernel_size, padding=kernel_size - 1,
                         groups=hidden_size, bias=bias, device=device, dtype=dtype)
        self.hidden_size = hidden_size
        self.activation = activation
        self.backend = backend

    def extra_repr(self) -> str:
        return (f"{self.hidden_size}, kernel_size={self.kernel_size[0]}, "
                f"bias={self.bias is not None}, activation={self.activation}")

    @property
    def state_size(self) -> int:
        """Elements of one sequence's state: ``hidden_size * (kernel_size - 1)``."""
        return self.hidden_size * (self.kernel_size[0] - 1)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, cache: torch.Tensor | None = None,
                output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                chunk_indices: torch.Tensor | None = None, *,
                initial_state: torch.Tensor | None = None):
        """``(y, final_state)``.

        Args:
            x: ``[B, T, D]`` (or ``[B, T, ...]`` whose trailing dims flatten to D), packed
                ``[1, T, D]`` with ``cu_seqlens``.
            residual: optional, x's shape: added to the output (after the activation).
            mask: optional ``[B, T]`` (x's first two dims): x is multiplied by it first
                (padding masks; not with ``cu_seqlens``).
            cache / initial_state: ``[N, D, W - 1]`` state before each sequence (either
                name; not both).
            output_final_state: also return ``final_state`` ``[N, D, W - 1]``.
            cu_seqlens: ``[N + 1]`` offsets of packed sequences (B must be 1).
            chunk_indices: accepted for FLA call compatibility and ignored (FLA's
                precomputed block table; cake builds its own from ``cu_seqlens``).
        """
        if cache is not None and initial_state is not None:
            raise ValueError("cache / initial_state: give one of them, not both")
        h0 = cache if cache is not None else initial_state
        if not isinstance(x, torch.Tensor) or x.dim() < 3:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: expected [B, T, D] (FLA's layout; channel-first [B, D, T] is "
                             f"not served), got {got}")
        shape = x.shape
        # checked here, before the conv runs: torch would raise a RuntimeError (the residual's
        # after the launch) or broadcast a smaller one silently
        if residual is not None and (not isinstance(residual, torch.Tensor) or
                                     residual.shape != shape):
            got = tuple(residual.shape) if isinstance(residual, torch.Tensor) else \
                type(residual).__name__
            raise ValueError(f"residual: expected x's shape {tuple(shape)}, got {got}")
        if mask is not None and (not isinstance(mask, torch.Tensor) or
                                 mask.shape != shape[:2]):
            got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"mask: expected [B, T] = {tuple(shape[:2])}, got {got}")
        D = self.hidden_size
        if x.shape[-1] != D or x.dim() != 3:
            if math.prod(shape[2:]) != D:
                raise ValueError(f"x: trailing dims must flatten to hidden_size={D}, got "
                                 f"{tuple(shape)}")
            x = x.reshape(shape[0], shape[1], D)
        if mask is not None:
            if cu_seqlens is not None:
                raise ValueError("mask: cannot be given with cu_seqlens")
            x = x * mask.unsqueeze(-1).to(x.dtype)
        w = self.weight.reshape(D, self.kernel_size[0])
        b = self.bias
        if w.dtype not in (torch.float32, x.dtype):
            w = w.to(x.dtype)
        if b is not None and b.dtype not in (torch.float32, x.dtype):
            b = b.to(x.dtype)
        y, final_state = self._conv(
            x, w, b, activation=self.activation, cu_seqlens=cu_seqlens, initial_state=h0,
            output_final_state=output_final_state)
        y = y.view(shape)
        if residual is not None:
            y = y + residual
        return y, final_state
