"""nn.Module drop-in."""

from __future__ import annotations

from cake_dense_projection_det_gemm.modules import Linear

from cake_dense_projection_nondet_gemm.api import dense_projection_nondet


class LinearNondet(Linear):
    """Drop-in for ``torch.nn.Linear`` on :func:`dense_projection_nondet` (bits not
    promised).

    Constructor (``in_features, out_features, bias=True, device=None, dtype=None, *,
    accumulate_main_grad=False``), ``state_dict``, initialisation, ``main_grad`` fusion and
    errors are those of ``cake_dense_projection_det_gemm.Linear``; only the forward's entry
    differs. The backward raises ``RuntimeError`` under
    ``torch.use_deterministic_algorithms(True)`` (``warn_only=True``: one warning).
    """

    _entry = staticmethod(dense_projection_nondet)
