"""Parity of nondet mHC (Y and every gradient) with the float64 reference on the det
package's smallest cases (T = 0 and 1, each stream count), and the same values as the det
package today."""

import pytest
import torch
from _mhc_nd_cases import NAMES, make, reference, run
from cake_core.testing import assert_close_to_reference
from cake_mhc_det_train import mhc_det_finish, mhc_det_prepare
from cake_mhc_nondet_train import mhc_nondet_finish, mhc_nondet_prepare


@pytest.mark.parametrize("T,n", [(0, 4), (1, 2), (1, 8), (33, 4)])
def test_against_float64(T, n):
    case = make(T, n, 20, seed=n + T)
    got = run(mhc_nondet_prepare, mhc_nondet_finish, case)
    want = reference(case)
    for name in NAMES:
        g, w = got[name], want[name]
        assert g.shape == w.shape and bool(torch.isfinite(g).all()), name
        if T == 0:
            assert bool((g == 0).all()), name
            continue
        tol = 3e-5 if name in ("dphi", "dalpha", "dbias", "dX") else 1e-5
        assert_close_to_reference(g, w, torch.float32, name, tol=tol)


def test_same_values_as_det_today():
    case = make(9, 4, 16, seed=3)
    got = run(mhc_nondet_prepare, mhc_nondet_finish, case)
    want = run(mhc_det_prepare, mhc_det_finish, case)
    for name in NAMES:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)
