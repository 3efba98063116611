"""Parity of out, lse, dq, dk, dv with the float64 reference on fresh random inputs:
batched and packed (empty, length-1, 63, 64, 65 and long documents), seqlen_q != seqlen_k
under causal, GQA ratios 1, 2 and 8, every head dim, windows, softcap, fully masked rows."""

import sys

import pytest
import torch
from _gqa_cases import (
    DEV,  # noqa: E402
    GRADS,
    make,
    reference,
    run,
)
from cake_core.testing import assert_close_to_reference
from cake_gqa_det_train import gqa_det, gqa_reference

# fp32 inputs: fp32 dots under the interpreter, TF32 dots on CUDA
TOL = 2e-5 if DEV.type == "cpu" else 5e-3


def _check(case, tol=TOL, **kw):
    got = run(gqa_det, case, **kw)
    want = reference(case, **kw)
    for n in GRADS:
        g, w = got[n], want[n]
        assert g.shape == w.shape, n
        if n == "lse":
            fin = torch.isfinite(w)
            assert torch.equal(torch.isfinite(g), fin), "lse: -inf rows differ"
            assert bool((g[~fin] == float("-inf")).all()), "lse: masked rows are not -inf"
            g, w = g[fin], w[fin]
        assert_close_to_reference(g, w, torch.float32, n, tol=tol)
    return got


def test_reference_matches_torch_sdpa():
    """The reference itself against torch's math SDPA (no GQA, causal, square)."""
    case = make(B=2, Sq=40, Hq=2, Hkv=2, D=64, seed=1)
    q, k, v = (case[n].double() for n in ("q", "k", "v"))
    out, _ = gqa_reference(q, k, v, causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    torch.testing.assert_close(out, want.transpose(1, 2))


@pytest.mark.parametrize("D", [64, 128, 256])
def test_packed_ragged_each_head_dim(D):
    _check(make(lens_q=[0, 1, 63, 64, 65, 130], Hq=4, Hkv=2, D=D, seed=D))


@pytest.mark.parametrize("Hq,Hkv", [(2, 2), (4, 2), (8, 1)])
def test_gqa_ratios_batched(Hq, Hkv):
    _check(make(B=2, Sq=70, Hq=Hq, Hkv=Hkv, D=64, seed=Hq * 10 + Hkv))


def test_seqlen_q_ne_k_causal_bottom_right():
    # fewer queries than keys (bottom-right alignment), more queries than keys (rows with
    # no visible key: O = 0, lse = -inf), a document with queries and no keys
    _check(make(lens_q=[5, 70, 33, 4, 1], lens_k=[40, 20, 33, 0, 65], Hq=4, Hkv=2, D=64,
                seed=3))


def test_batched_seqlen_q_ne_k():
    _check(make(B=2, Sq=20, Sk=50, Hq=2, Hkv=1, D=64, seed=4))
    _check(make(B=1, Sq=50, Sk=20, Hq=2, Hkv=1, D=64, seed=5))


def test_not_causal():
    _check(make(lens_q=[17, 64, 3], lens_k=[9, 80, 1], D=64, seed=6), causal=False)


@pytest.mark.parametrize("window", [(16, 0), (5, 7), (-1, 3), (40, -1)])
def test_windows(window):
    _check(make(lens_q=[1, 65, 100], lens_k=[1, 65, 90], D=64, seed=7), causal=False,
           window_size=window)


@pytest.mark.parametrize("window,causal,same_as", [
    ((2**31 - 1, 2**31 - 1), False, (-1, -1)), ((sys.maxsize, 0), False, (-1, 0)),
    ((2**31 - 1, -1), True, (-1, -1)), ((166, 156), False, (-1, -1)),
    ((2**40, 5), False, (-1, 5)), ((7, 2**31 - 1), False, (7, -1))])
def test_windows_past_every_document_are_unbounded(window, causal, same_as):
    # as flash-attn: a side at least as long as the sequence hides nothing; bounds near
    # int32's limit must not overflow the kernels' index arithmetic
    case = make(lens_q=[1, 65, 100], lens_k=[1, 65, 90], D=64, seed=12)
    got = _check(case, causal=causal, window_size=window)
    want = run(gqa_det, case, causal=causal, window_size=same_as)
    for n in GRADS:
        assert torch.equal(got[n], want[n]), n


@pytest.mark.parametrize("B,Sq,Sk", [(2, 30, 30), (1, 20, 45)])
def test_batched_window_longer_than_the_rows(B, Sq, Sk):
    case = make(B=B, Sq=Sq, Sk=Sk, D=64, seed=13)
    _check(case, causal=False, window_size=(Sk, Sq))
    _check(case, causal=False, window_size=(2**31 - 1, 2**31 - 1))
    _check(case, causal=False, window_size=(Sk - 2, Sq - 2))  # bounded: still right


def test_window_with_causal():
    _check(make(B=2, Sq=90, D=64, seed=8), causal=True, window_size=(33, 5))


def test_softcap_and_scale():
    _check(make(lens_q=[64, 37], D=128, seed=9), softcap=2.5, softmax_scale=0.3)


@pytest.mark.parametrize("cap", [1e4, 1e6])
def test_large_soft_caps_stay_exact(cap):
    # softcap * tanh(s / softcap) ~ s: tanh near 0 without cancellation
    _check(make(lens_q=[40, 17], D=64, seed=14), softcap=cap, tol=TOL)


def test_softcap_not_causal_window():
    _check(make(B=1, Sq=48, Sk=70, D=64, seed=10), causal=False, softcap=1.0,
           window_size=(20, 10))


@pytest.mark.parametrize("window", [(9, 4), (1, 0), (3, -1)])
def test_window_past_the_document_seqlen_q_ne_k(window):
    """Windows under which whole query blocks see no key block and whole key blocks no
    query block (Sq > Sk and Sq < Sk, a keyless document): the loops over the blocks whose
    mask is all-true get empty ranges there, never negative ones."""
    case = make(lens_q=[5, 70, 4, 1], lens_k=[40, 20, 0, 65], seed=3)
    _check(case, causal=False, window_size=window, softcap=3.0 if window == (9, 4) else 0.0)


def test_fully_masked_rows_window():
    """A window that leaves some rows without keys (left < -(shift))."""
    got = _check(make(lens_q=[40], lens_k=[10], D=64, seed=11), causal=True,
                 window_size=(3, 0))
    assert bool((got["out"][:30] == 0).all())
    assert bool((got["dq"][:30] == 0).all())


@pytest.mark.parametrize("D", [64, 256])
def test_bf16_close(D):
    # D 256 in bf16: the CUDA rule's own dK/dV tiles for Qwen3-Next's head dim
    case = make(lens_q=[0, 1, 65, 100], Hq=4, Hkv=1, D=D, dtype=torch.bfloat16, seed=12)
    got = run(gqa_det, case)
    want = reference(case)
    for n in ("out", "dq", "dk", "dv"):
        assert_close_to_reference(got[n].float(), want[n].float(), torch.bfloat16, n)


def test_int64_offsets():
    case = make(lens_q=[3, 64, 0, 20], D=64, seed=13)
    case["cu_q"] = case["cu_q"].long()
    case["cu_k"] = case["cu_k"].long()
    _check(case)


def _smaller_tiles():
    from cake_gqa_det_train import plan as gp

    rows = {("bf16", D, tuple(sorted(f.items()))) for (_, D), f in gp._SMALLER_16BIT.items()}
    rows |= {("fp32", D, tuple(sorted(f.items()))) for (_, D), f in gp._SMALLER_FP32.items()}
    return sorted(rows)


@pytest.mark.parametrize("kind,D,fields", _smaller_tiles(), ids=str)
def test_tiles_for_less_shared_memory(kind, D, fields):
    """The smaller tiles the CUDA rule takes on GPUs with less shared memory than Hopper
    (A100, consumer GPUs), here with this device's plan of their dtype (bf16 tiles: bf16
    inputs on CUDA; the interpreter runs every row in fp32): the same parity."""
    import dataclasses

    from cake_gqa_det_train import make_plan

    dtype = torch.bfloat16 if kind == "bf16" and DEV.type == "cuda" else torch.float32
    plan = dataclasses.replace(make_plan(D, dtype, DEV), **dict(fields))
    case = make(lens_q=[0, 1, 17, 40, 130], Hq=4, Hkv=2, D=D, dtype=dtype, seed=D + 7)
    got, want = run(gqa_det, case, plan=plan), reference(case)
    for n in ("out", "dq", "dk", "dv"):
        if dtype == torch.float32:
            assert_close_to_reference(got[n], want[n], torch.float32, n, tol=TOL)
        else:
            assert_close_to_reference(got[n].float(), want[n].float(), dtype, n)
