"""In-tile inverse of a unit lower-triangular matrix (a Triton jit helper).

The chunked delta-rule families (GDN, KDA) solve ``T = (I + A)^-1`` on each chunk's
``BT x BT`` strictly lower matrix A (the WY/UT form of Yang et al., 2024, "Parallelizing
Linear Transformers with the Delta Rule over Sequence Length", arXiv:2406.06484).
:func:`unit_lower_inverse` does it by recursive block doubling in a fixed order: with T the
inverse of the s x s diagonal blocks and E the strictly-lower s x s blocks inside each
2s x 2s diagonal block, ``(D + E)^-1 = T - T E T`` (exact: E T E = 0), for
s = 1, 2, ..., BT/2: ``log2(BT)`` steps of two dots, fp32 at ``PREC``.
"""

from cake_core.triton_utils import select_backend

select_backend()

import triton  # noqa: E402  (after the backend rule)
import triton.language as tl  # noqa: E402


@triton.jit
def unit_lower_inverse(a, BT: tl.constexpr, LOG2_BT: tl.constexpr, PREC: tl.constexpr):
    """``(I + a)^-1`` for ``a`` fp32 ``[BT, BT]``, zero on and above the diagonal."""
    rows = tl.arange(0, BT)
    tm = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    return _doubling_steps(a, tm, 1, LOG2_BT, BT, PREC)


@triton.jit
def _doubling_steps(a, tm, s0, STEPS: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr):
    """``STEPS`` block-doubling steps on the whole ``[BT, BT]`` tile from block size ``s0``:
    ``tm`` (the inverse of the ``s0 x s0`` diagonal blocks) becomes the inverse of the
    ``s0 * 2^STEPS`` ones."""
    rows = tl.arange(0, BT)
    s = s0
    for _ in range(STEPS):
        e_mask = ((rows[:, None] // (2 * s)) == (rows[None, :] // (2 * s))) & \
            ((rows[:, None] // s) > (rows[None, :] // s))
        e = tl.where(e_mask, a, 0.0)
        et = tl.zeros([BT, BT], dtype=tl.float32)
        et = tl.dot(e, tm, et, input_precision=PREC)
        tet = tl.zeros([BT, BT], dtype=tl.float32)
        tet = tl.dot(tm, et, tet, input_precision=PREC)
        tm = tm - tet
        s = s * 2
    return tm


@triton.jit
def unit_lower_inverse_blocked(a, BT: tl.constexpr, LOG2_BT: tl.constexpr, PREC: tl.constexpr,
                               BD: tl.constexpr, LOG2_BD: tl.constexpr):
    """:func:`unit_lower_inverse` with the first ``LOG2_BD`` doubling steps (those inside
    the ``BD x BD`` diagonal blocks) on the ``BT / BD`` diagonal blocks alone, as batched
    ``[BT / BD, BD, BD]`` dots, then the remaining ``LOG2_BT - LOG2_BD`` steps on the whole
    tile: ``BD = 16`` at ``BT = 64`` does 4 of the 12 whole-tile 64^3 dots (FLA solves the
    16 x 16 diagonal blocks apart too, then merges). Same math; other bits than
    :func:`unit_lower_inverse` (the block steps sum over 16, not 64, terms)."""
    tl.static_assert((1 << LOG2_BD) == BD, "LOG2_BD must be log2(BD)")
    tl.static_assert((BD >= 16) & (BD <= BT), "BD must be in [16, BT]")
    NB: tl.constexpr = BT // BD
    bi = tl.arange(0, NB)
    on_diag = (bi[:, None] == bi[None, :])[:, :, None, None]  # [NB, NB, 1, 1]
    a4 = tl.permute(tl.reshape(a, (NB, BD, NB, BD)), (0, 2, 1, 3))  # [i, j, r, c]
    d = tl.sum(tl.where(on_diag, a4, 0.0), axis=1)  # the diagonal blocks [NB, BD, BD]
    r = tl.arange(0, BD)
    tm = tl.zeros([NB, BD, BD], dtype=tl.float32) + \
        tl.where(r[:, None] == r[None, :], 1.0, 0.0)[None, :, :]
    s = 1
    for _ in range(LOG2_BD):
        e_mask = ((r[:, None] // (2 * s)) == (r[None, :] // (2 * s))) & \
            ((r[:, None] // s) > (r[None, :] // s))
        e = tl.where(e_mask[None, :, :], d, 0.0)
        et = tl.zeros([NB, BD, BD], dtype=tl.float32)
        et = tl.dot(e, tm, et, input_precision=PREC)
        tet = tl.zeros([NB, BD, BD], dtype=tl.float32)
        tet = tl.dot(tm, et, tet, input_precision=PREC)
        tm = tm - tet
        s = s * 2
    t4 = tl.where(on_diag, tl.expand_dims(tm, 1), 0.0)  # block diagonal [i, j, r, c]
    t = tl.reshape(tl.permute(t4, (0, 2, 1, 3)), (BT, BT))
    return _doubling_steps(a, t, BD, LOG2_BT - LOG2_BD, BT, PREC)
