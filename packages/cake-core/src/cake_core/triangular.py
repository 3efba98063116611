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

