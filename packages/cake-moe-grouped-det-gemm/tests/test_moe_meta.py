"""The grouped GEMM's integer metadata kernels (row ends, tile schedule, expert order)
against their definitions in torch ops, on offsets and sizes of every kind: out of range,
decreasing, negative, ties, many experts (several blocks of the one-program kernels)."""

import cake_moe_grouped_det_gemm.api as api
import pytest
import torch
from _moe_cases import DEV


def ref_ends(offs, m_sizes, M):
    v = torch.cumsum(m_sizes.to(torch.int64), 0) if offs is None else offs.to(torch.int64)
    return torch.cummax(v.clamp(0, M), 0).values.to(torch.int32)


def ref_schedule(ends, M, bm):
    e = ends.to(torch.int64)
    hi = torch.cat([e, e.new_full((1,), M)])
    lo = torch.cat([e.new_zeros((1,)), e])
    tiles = torch.div(hi - lo + (bm - 1), bm, rounding_mode="floor")
    return torch.stack([lo, hi, torch.cumsum(tiles, 0)]).to(torch.int32)


def ref_order(ends):
    e = ends.to(torch.int64)
    rows = e - torch.cat([e.new_zeros((1,)), e[:-1]])
    return torch.sort(rows, descending=True, stable=True).indices.to(torch.int32)


def cases():
    g = torch.Generator().manual_seed(0)
    yield "sorted", torch.tensor([3, 3, 8, 20]), None, 20
    yield "ragged past M", torch.tensor([5, 2, 40, 7, 12]), None, 30
    yield "negative", torch.tensor([-4, 3, -1, 9]), None, 9
    yield "sizes", None, torch.tensor([4, 0, 7, 7, 1]), 16
    yield "sizes over M", None, torch.tensor([10, 10, 10]), 25
    yield "one expert", torch.tensor([0]), None, 0
    for E in (63, 64, 65, 1500, 2049):   # block edges of the order and the one-program kernels
        sizes = torch.randint(0, 5, (E,), generator=g)   # many ties
        yield f"sizes E={E}", None, sizes, int(sizes.sum()) - 3
        yield f"offs E={E}", torch.cumsum(sizes, 0), None, int(sizes.sum())


@pytest.mark.parametrize("name,offs,m_sizes,M", list(cases()), ids=[c[0] for c in cases()])
@pytest.mark.parametrize("block_m", [16, 64])
def test_metadata_kernels_equal_their_torch_definitions(name, offs, m_sizes, M, block_m):
    offs = None if offs is None else offs.to(torch.int32).to(DEV)
    m_sizes = None if m_sizes is None else m_sizes.to(torch.int32).to(DEV)
    ends = api._row_ends(offs, m_sizes, M)
    assert torch.equal(ends.cpu(), ref_ends(offs, m_sizes, M).cpu())
    assert torch.equal(api._schedule(ends, M, block_m).cpu(),
                       ref_schedule(ends, M, block_m).cpu())
    assert torch.equal(api._expert_order(ends).cpu(), ref_order(ends).cpu())


@pytest.mark.parametrize("kind", ["offs", "m_sizes"])
def test_row_ends_of_a_strided_view(kind):
    # a non-contiguous [E] view (every other entry) reads its own entries, not its neighbours
    full = torch.tensor([0, 9, 3, 9, 5, 9, 8, 9, 12, 9], dtype=torch.int32, device=DEV)
    if kind == "m_sizes":
        full = torch.tensor([1, 7, 2, 7, 0, 7, 4, 7, 3, 7], dtype=torch.int32, device=DEV)
    v = full[::2]
    offs, m_sizes = (v, None) if kind == "offs" else (None, v)
    ends = api._row_ends(offs, m_sizes, 12)
    assert torch.equal(ends.cpu(), ref_ends(offs, m_sizes, 12).cpu())


def test_grouped_gemm_with_strided_offs_equals_contiguous():
    from _moe_cases import make
    from cake_moe_grouped_det_gemm import moe_grouped_det_gemm
    x, w, offs, _ = make([3, 0, 5], N=8, K=16)
    strided = torch.stack([offs, torch.zeros_like(offs)], 1)[:, 0]
    assert not strided.is_contiguous()
    assert torch.equal(moe_grouped_det_gemm(x, w, strided), moe_grouped_det_gemm(x, w, offs))
