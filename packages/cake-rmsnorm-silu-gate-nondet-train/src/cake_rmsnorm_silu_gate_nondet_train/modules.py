"""nn.Module drop-ins."""

from __future__ import annotations

from cake_rmsnorm_silu_gate_det_train.modules import _RMSNormGatedLayer

from cake_rmsnorm_silu_gate_nondet_train.api import rmsnorm_silu_gate_nondet


class RMSNormGatedNondet(_RMSNormGatedLayer):
    """Gated RMSNorm (SiLU or sigmoid gate) on
    :func:`~cake_rmsnorm_silu_gate_nondet_train.rmsnorm_silu_gate_nondet` (bits not
    promised; under ``torch.use_deterministic_algorithms(True)`` its backward raises
    ``RuntimeError``).

    Drop-in for FLA's ``FusedRMSNormGated`` and Mamba2's ``RMSNormGated``, with the
    constructor arguments (``hidden_size, eps=1e-6, *, norm_before_gate=True,
    group_size=None, activation="swish", device=None, dtype=None``), ``state_dict``
    (``weight``) and ``forward(x, z)`` of cake-rmsnorm-silu-gate-det-train's
    ``RMSNormGated`` (the same layer code with this package's entry; not an
    ``RMSNormGated`` instance). Not twice differentiable.

    Raises:
        ValueError: bad constructor arguments; in ``forward``, as
            :func:`~cake_rmsnorm_silu_gate_nondet_train.rmsnorm_silu_gate_nondet`, and if
            x's last dim is not ``hidden_size``.
    """

    _entry = staticmethod(rmsnorm_silu_gate_nondet)
