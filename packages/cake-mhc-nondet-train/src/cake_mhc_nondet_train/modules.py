"""nn.Module wrapper of an mHC layer on the nondet entries."""

from __future__ import annotations

from cake_mhc_det_train.modules import HyperConnection

from cake_mhc_nondet_train.api import mhc_nondet_finish, mhc_nondet_prepare


class HyperConnectionNondet(HyperConnection):
    """One manifold-constrained hyper-connection around ``branch`` (DeepSeek mHC,
    arXiv:2512.24880) on :func:`mhc_nondet_prepare` / :func:`mhc_nondet_finish` (bits not
    promised).

    Constructor (``branch, hidden_size, n_streams=4, *, sinkhorn_iters=20, eps=1e-6,
    device=None``), parameters (``phi``, ``alpha``, ``bias``), initialisation, forward
    (X ``[..., n, C]`` -> Y like X) and errors are those of
    ``cake_mhc_det_train.HyperConnection``; streams are made and collapsed with that
    package's ``expand_streams`` / ``collapse_streams``. The backward raises
    ``RuntimeError`` under ``torch.use_deterministic_algorithms(True)`` (``warn_only=True``:
    one warning).
    """

    _prepare = staticmethod(mhc_nondet_prepare)
    _finish = staticmethod(mhc_nondet_finish)
