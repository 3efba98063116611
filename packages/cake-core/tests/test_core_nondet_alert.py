"""cake_core.nondet_alert: the deterministic-algorithms alert of every nondet backward."""

import warnings

import pytest
import torch
from cake_core import mode, nondet_alert


@pytest.fixture
def restore():
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(was, warn_only=was_warn)
    mode._ALERTED.discard("x's backward")


def test_silent_without_deterministic_algorithms(restore):
    torch.use_deterministic_algorithms(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nondet_alert("x's backward", "x_det.f")


def test_raises_naming_the_det_entry(restore):
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match=r"x's backward .*use x_det\.f"):
        nondet_alert("x's backward", "x_det.f")


def test_warn_only_warns_once(restore):
    torch.use_deterministic_algorithms(True, warn_only=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        nondet_alert("x's backward", "x_det.f")
        nondet_alert("x's backward", "x_det.f")
    assert sum("x_det.f" in str(x.message) for x in w) == 1
