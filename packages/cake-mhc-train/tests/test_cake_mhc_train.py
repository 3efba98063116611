"""cake-mhc-train (legacy name): the old import name gives the canonical objects."""

import pytest
from cake_core import legacy_checks

LEGACY = "cake_mhc_train"


@pytest.mark.parametrize("check", legacy_checks.CHECKS, ids=lambda c: c.__name__)
def test_legacy_name(check):
    check(LEGACY)
