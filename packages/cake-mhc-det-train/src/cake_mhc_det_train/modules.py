"""nn.Module wrapper and the stream helpers of an mHC network."""

from __future__ import annotations

import math
import numbers

import torch
from cake_core import check_int, check_positive_finite
from torch import nn

from cake_mhc_det_train.api import MAX_SINKHORN_ITERS, mhc_det_finish, mhc_det_prepare
from cake_mhc_det_train.plan import N_STREAMS, n_coeffs


def expand_streams(x: torch.Tensor, n: int) -> torch.Tensor:
    """``[..., C] -> [..., n, C]``: n copies of the input (the start of an mHC network).
    Differentiable (the gradient is the sum over the streams). Contiguous output.

    Raises:
        ValueError: ``x`` not a tensor of at least 1 dim, or ``n`` not an int in (2, 4, 8).
    """
    _check_streams_n(n, "n")
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"x: expected a tensor [..., C] of at least 1 dim, got "
                         f"{_describe(x)}")
    return x.unsqueeze(-2).expand(*x.shape[:-1], int(n), x.shape[-1]).contiguous()


def collapse_streams(X: torch.Tensor) -> torch.Tensor:
    """``[..., n, C] -> [..., C]``: the mean of the streams (the end of an mHC network).

    Raises:
        ValueError: ``X`` not a floating-point tensor of at least 2 dims, or its stream dim
            (dim -2) not in (2, 4, 8).
    """
    if not isinstance(X, torch.Tensor) or X.dim() < 2 or not X.dtype.is_floating_point:
        raise ValueError(f"X: expected a floating-point tensor [..., n, C] of at least 2 dims, "
                         f"got {_describe(X)}")
    _check_streams_n(X.shape[-2], "X: the stream dimension (dim -2)")
    return X.mean(dim=-2)


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dim()}-D {x.dtype} {tuple(x.shape)}"
    return type(x).__name__


def _check_streams_n(n: object, name: str) -> None:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n not in N_STREAMS:
        raise ValueError(f"{name}: must be one of {N_STREAMS}, got {n!r}")


class HyperConnection(nn.Module):
    """One manifold-constrained hyper-connection around ``branch`` (DeepSeek mHC,
    arXiv:2512.24880), on cake's deterministic kernels.

    ``forward(X)``: X ``[..., n, C]`` (``[T, n, C]`` or ``[B, S, n, C]``; fp32 or bf16) ->
    Y like X, with U, handle = :func:`mhc_det_prepare`, B = branch(U) (cast to X's dtype
    and made last-dim contiguous when it is not), Y = :func:`mhc_det_finish`.

    Args:
        branch: a module mapping ``[..., C]`` to ``[..., C]`` (attention, MLP, ...),
            registered as the submodule ``branch``; or any other callable (e.g. a bound
            method of a parent that owns the branch's modules), then kept as a plain
            attribute, not registered (its parameters stay with their owner).
        hidden_size: C. n_streams: n in (2, 4, 8). sinkhorn_iters: default 20. eps: the RMS
            epsilon (1e-6).

    Parameters (fp32, cast to fp32 in the forward if the module was cast): ``phi``
    ``[n*C, 2n + n^2]``, ``alpha`` ``[3]`` (pre, post, res), ``bias`` ``[2n + n^2]``.
    Initialisation (ours): phi ~ N(0, 0.02^2), alpha = 0.01, bias_pre = log(1 / (n - 1))
    (H_pre = 1/n), bias_post = 0 (H_post = 1), bias_res = 0 (H_res near uniform). With
    streams made by :func:`expand_streams` the layer then starts close to
    ``x + branch(x)`` in every stream.

    Not twice differentiable (double backward raises ``RuntimeError``, as in every cake
    family).

    Raises:
        ValueError: bad n_streams, hidden_size, sinkhorn_iters or eps here; bad inputs as
            :func:`mhc_det_prepare` in the forward.
    """

    #: the entries the forward calls (the nondet sibling's subclass sets its own)
    _prepare = staticmethod(mhc_det_prepare)
    _finish = staticmethod(mhc_det_finish)

    def __init__(self, branch: nn.Module, hidden_size: int, n_streams: int = 4, *,
                 sinkhorn_iters: int = 20, eps: float = 1e-6, device=None):
        super().__init__()
        _check_streams_n(n_streams, "n_streams")
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
            raise ValueError(f"hidden_size: expected an int >= 1, got {hidden_size!r}")
        check_int(sinkhorn_iters, "sinkhorn_iters", 1, MAX_SINKHORN_ITERS)
        check_positive_finite(eps, "eps")
        if not callable(branch):
            raise ValueError(f"branch: expected a module or callable, got {type(branch).__name__}")
        self.branch = branch
        self.hidden_size = hidden_size
        self.n_streams = int(n_streams)
        self.sinkhorn_iters = sinkhorn_iters
        self.eps = eps
        M = n_coeffs(n_streams)
        kw = {"device": device, "dtype": torch.float32}
        self.phi = nn.Parameter(torch.empty(n_streams * hidden_size, M, **kw))
        self.alpha = nn.Parameter(torch.empty(3, **kw))
        self.bias = nn.Parameter(torch.empty(M, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        n = self.n_streams
        with torch.no_grad():
            nn.init.normal_(self.phi, std=0.02)
            self.alpha.fill_(0.01)
            self.bias.zero_()
            self.bias[:n] = math.log(1.0 / (n - 1))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        phi, alpha, bias = (p if p.dtype == torch.float32 else p.float()
                            for p in (self.phi, self.alpha, self.bias))
        U, handle = self._prepare(X, phi, alpha, bias, eps=self.eps,
                                  sinkhorn_iters=self.sinkhorn_iters)
        B = self.branch(U)
        if B.dtype != X.dtype:
            B = B.to(X.dtype)
        if B.dim() and B.stride(-1) != 1 and B.shape[-1] > 1:
            B = B.contiguous()  # the finish reads B's channels with a unit stride
        return self._finish(X, B, handle)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, n_streams={self.n_streams}, "
                f"sinkhorn_iters={self.sinkhorn_iters}")
