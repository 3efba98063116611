"""nn.Module drop-ins."""

from __future__ import annotations

import torch
from torch import nn

from cake_dense_projection_det_gemm.api import dense_projection_det


class Linear(nn.Module):
    """Drop-in for ``torch.nn.Linear`` running cake's deterministic GEMMs.

    Same constructor arguments (``in_features, out_features, bias=True, device=None,
    dtype=None``), ``state_dict`` keys (``weight`` ``[out, in]``, ``bias`` ``[out]``) and
    initialisation (``reset_parameters``: Kaiming-uniform weight with ``a = sqrt(5)``,
    bias uniform in ``±1/sqrt(in_features)``) as torch's.

    ``accumulate_main_grad=True`` (keyword only; Megatron's gradient-accumulation fusion):
    the weight gradient is added, in fp32 and in the fixed order, into
    ``weight.main_grad`` (fp32 ``[out, in]``; zeros allocated on the first forward that
    records a graph for the weight if the attribute is absent or None; under
    ``torch.compile`` it must exist before tracing, else ``ValueError``) and ``weight.grad``
    stays None. The bias gradient goes to
    ``bias.grad`` as usual. Not twice differentiable (double backward raises
    ``RuntimeError``).

    Raises:
        ValueError: as :func:`cake_dense_projection_det_gemm.dense_projection_det` (e.g. an
            input dtype other than the weight's, where torch raises ``RuntimeError``), and if
            x's last dim is not ``in_features``.
    """

    __constants__ = ["in_features", "out_features"]
    #: the entry the forward calls (the nondet sibling's subclass sets its own)
    _entry = staticmethod(dense_projection_det)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, *, accumulate_main_grad: bool = False):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.accumulate_main_grad = accumulate_main_grad
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **kw))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **kw))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.Linear.reset_parameters(self)  # torch's own init (reads only weight and bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.in_features:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: last dim must be in_features={self.in_features}, got {got}")
        main_grad = None
        if self.accumulate_main_grad and self.weight.requires_grad and torch.is_grad_enabled():
            main_grad = getattr(self.weight, "main_grad", None)
            if main_grad is None:
                if torch.compiler.is_compiling():
                    raise ValueError(
                        "Linear(accumulate_main_grad=True): weight.main_grad must exist before "
                        "torch.compile traces the module (allocate fp32 zeros [out, in], or "
                        "run one eager training step first)")
                main_grad = torch.zeros(self.weight.shape, dtype=torch.float32,
                                        device=self.weight.device)
                self.weight.main_grad = main_grad
        return self._entry(x, self.weight, self.bias, main_grad=main_grad)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}"
                + (", accumulate_main_grad=True" if self.accumulate_main_grad else ""))
