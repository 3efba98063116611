"""nn.Module drop-ins."""

from __future__ import annotations

from cake_rmsnorm_det_train.modules import _RMSNormLayer

from cake_rmsnorm_nondet_train.api import rmsnorm_nondet


class RMSNormNondet(_RMSNormLayer):
    """Drop-in for ``torch.nn.RMSNorm`` on :func:`~cake_rmsnorm_nondet_train.rmsnorm_nondet`
    (bits not promised; under ``torch.use_deterministic_algorithms(True)`` its backward
    raises ``RuntimeError``).

    Same constructor arguments and ``state_dict`` keys (``weight``) as torch's and as
    cake-rmsnorm-det-train's ``RMSNorm`` (the same layer code with this package's entry;
    not an ``RMSNorm`` instance): normalizes over the trailing ``normalized_shape`` dims;
    ``eps=None`` takes ``torch.finfo(x.dtype).eps``; without ``elementwise_affine`` a ones
    vector stands in for the weight. Not twice differentiable.

    Raises:
        ValueError: as :func:`~cake_rmsnorm_nondet_train.rmsnorm_nondet`, and if x's
            trailing dims do not equal ``normalized_shape``.
    """

    _entry = staticmethod(rmsnorm_nondet)
