"""cake_core.layer_utils: FLA's layer arguments checked, padding masks to packed documents
and back."""

import pytest
import torch
from cake_core.layer_utils import check_training_call, head_dims, pad, unpad


def test_unpad_packs_each_rows_kept_tokens_and_pad_restores():
    x = torch.randn(3, 5, 4)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    before = x.clone()
    u = unpad(x, 4, mask, None)
    assert torch.equal(x, before)
    assert u.cu_seqlens.tolist() == [0, 3, 8, 9] and u.cu_seqlens.dtype == torch.int32
    assert torch.equal(u.x[0], torch.cat([x[0, 2:], x[1], x[2, 4:]]))
    back = pad(u.x, u.keep, 3, 5)
    assert torch.equal(back, x * mask[..., None])
    ones = unpad(x, 4, torch.ones(3, 5), None)
    assert ones.x is x and ones.keep is None and ones.cu_seqlens is None
    cu = torch.tensor([0, 5], dtype=torch.int32)
    assert unpad(x[:1], 4, None, cu).cu_seqlens is cu and pad(x, None, 3, 5) is x


@pytest.mark.parametrize("call,match", [
    (lambda: unpad(torch.randn(2, 5), 5, None, None), r"expected \[B, T, 5\]"),
    (lambda: unpad(torch.randn(2, 5, 4), 8, None, None), r"expected \[B, T, 8\]"),
    (lambda: unpad(torch.randn(2, 5, 4), 4, torch.ones(2, 6), None), "attention_mask"),
    (lambda: unpad(torch.randn(1, 5, 4), 4, torch.ones(1, 5), torch.tensor([0, 5])),
     "give one"),
    (lambda: head_dims(16, 2, 3, 4), "multiple of num_heads"),
    (lambda: head_dims(16, 0.3, 2, None), "expand_v"),
    (lambda: head_dims(0, 1, 2, None), "head_dim"),
    (lambda: check_training_call("parallel", None, False, False), "mode"),
    (lambda: check_training_call("chunk", None, True, False), "decoding"),
    (lambda: check_training_call("chunk", object(), False, False), "decoding"),
    (lambda: check_training_call("chunk", None, False, True), "attention weights"),
])
def test_refusals(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_head_dims():
    assert head_dims(16, 2, 2, None) == (16, 32, 2)
    assert head_dims(128, 1, 16, 32) == (128, 128, 32)
    assert head_dims(64, 1.5, 1, None) == (64, 96, 1)
