"""cake_core.support: the support answer and the size helpers."""

import torch
from cake_core.support import Support, nbytes_of, owned_nbytes, support_of


def test_support_truthiness_and_reason():
    assert Support(True) and not Support(False, "x: bad")
    assert support_of(lambda: None) == (True, "")

    def bad():
        raise ValueError("x: expected a CUDA tensor")

    s = support_of(bad)
    assert not s and s.reason == "x: expected a CUDA tensor" and s.ok is False


def test_nbytes_of():
    assert nbytes_of([((2, 3), torch.float32), ((5,), torch.bfloat16), ((0, 7), torch.int64)]) \
        == 2 * 3 * 4 + 5 * 2


def test_owned_nbytes_counts_storages_once_and_skips_inputs():
    x = torch.empty(4, 8)
    a = torch.empty(10, dtype=torch.bfloat16)
    views = [a[:5], a[5:], a]  # one storage
    assert owned_nbytes([x, *views, None], exclude=[x]) == 20
    assert owned_nbytes([x.view(-1)], exclude=[x]) == 0  # a view of an input
