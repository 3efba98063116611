"""The chunked delta rule's output stage, shared by GDN (a scalar log decay per value head)
and KDA (a per-channel one), as one Triton kernel and its launch helper.

Per 64-token chunk, value head and V block, with S = h[c] the state at the chunk's start
(:mod:`cake_core.chunk_state`), G the chunk's cumulative log decay and v_new the chunk's
delta-rule values::

    o = scale (q exp(G)) @ S + A @ v_new,    A = scale L * (q k^T) exp(G_i - G_j)

(L the lower triangle including the diagonal). Each output row is computed by one program
(no atomics), dots take ``DT`` operands with fp32 accumulation, the result is cast once to
o's dtype. Compile-time form (each a fixed rounding):

- ``GK = False`` (GDN): G ``[B*T, HV]``; A is formed here from q and k ``[B*T, H, K]``
  and the whole sum is scaled at the end.
- ``GK = True`` (KDA): G ``[B*T, HV, K]``; A is the chunk prep's Aqk ``[B*T, HV, 64]``
  (scale included) and the scale is folded into q exp(G).

The shape (H, HV, GROUP, K, V) is compile-time: one build per shape.
"""

from __future__ import annotations

from cake_core.triton_utils import cdiv, select_backend, tl, triton

select_backend()

__all__ = ["chunk_output", "chunk_output_kernel"]


@triton.jit
def chunk_output_kernel(
    Qp, Kp, GCUM, AQK, VNEW, HBUF, CHUNK_START, CHUNK_END, O,
    scale, H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    VD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, GK: tl.constexpr,
):
    """o of one (chunk, value head, V block); ``Kp`` is read without ``GK`` only,
    ``AQK`` with it only."""
    c = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    hk = hv // GROUP
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    rows = tl.arange(0, BT)
    tok = start + rows
    tmask = tok < end
    ck = tl.arange(0, BK)
    cv = iv * BV + tl.arange(0, BV)
    kcol = ck < KD
    vcol = cv < VD
    kmask = tmask[:, None] & kcol[None, :]
    vmask = tmask[:, None] & vcol[None, :]

    # each form's loads and dots in the order its family's kernel had before the merge
    if GK:
        qb = tl.load(Qp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask,
                     other=0.0).to(tl.float32)
        gc = tl.load(GCUM + tok[:, None] * (HV * KD) + hv * KD + ck[None, :], mask=kmask,
                     other=0.0)
        qg = tl.where(kmask, qb * tl.exp(tl.where(kmask, gc, 0.0)), 0.0) * scale
        s = tl.load(HBUF + (c * HV + hv) * KD * VD + ck[:, None] * VD + cv[None, :],
                    mask=kcol[:, None] & vcol[None, :], other=0.0)
        o = tl.zeros([BT, BV], dtype=tl.float32)
        o = tl.dot(qg.to(DT), s.to(DT), o, input_precision=PREC)
        att = tl.load(AQK + tok[:, None] * (HV * BT) + hv * BT + rows[None, :],
                      mask=tmask[:, None], other=0.0)
        vn = tl.load(VNEW + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], mask=vmask,
                     other=0.0)
        o = tl.dot(att.to(DT), vn.to(DT), o, input_precision=PREC)
    else:
        qb = tl.load(Qp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask,
                     other=0.0)
        kb = tl.load(Kp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask,
                     other=0.0)
        gc = tl.load(GCUM + tok * HV + hv, mask=tmask, other=0.0)
        s = tl.load(HBUF + (c * HV + hv) * KD * VD + ck[:, None] * VD + cv[None, :],
                    mask=kcol[:, None] & vcol[None, :], other=0.0)
        vn = tl.load(VNEW + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], mask=vmask,
                     other=0.0)
        o = tl.zeros([BT, BV], dtype=tl.float32)
        o = tl.dot((qb * tl.exp(gc)[:, None]).to(DT), s.to(DT), o, input_precision=PREC)
        qk = tl.zeros([BT, BT], dtype=tl.float32)
        qk = tl.dot(qb.to(DT), tl.trans(kb.to(DT)), qk, input_precision=PREC)
        incl = (rows[:, None] >= rows[None, :]) & tmask[:, None]  # past-the-end rows: G = 0
        att = tl.where(incl, qk * tl.exp(tl.where(incl, gc[:, None] - gc[None, :], 0.0)), 0.0)
        o = tl.dot(att.to(DT), vn.to(DT), o, input_precision=PREC)
        o = o * scale
    tl.store(O + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], o.to(O.dtype.element_ty),
             mask=vmask)


def chunk_output(q, k, g_cumsum, aqk, v_new, h, chunk_start, chunk_end, o, scale: float, *,
                 chunks: int, H: int, HV: int, K: int, V: int, dot_dtype, precision: str,
                 block_k: int, block_v: int, per_channel: bool, num_warps: int = 4,
                 chunk_size: int = 64) -> None:
    """Launch :func:`chunk_output_kernel` on checked, contiguous tensors (no checks), on the
    grid ``(chunks, HV, ceil(V / block_v))`` (``chunks``: NC, the chunks of the tables).

    Args:
        q: ``[B*T, H, K]``. k: GDN's keys ``[B*T, H, K]`` (unused, None, with
            ``per_channel``). g_cumsum: fp32 ``[B*T, HV]`` or (``per_channel``)
            ``[B*T, HV, K]``. aqk: KDA's Aqk ``[B*T, HV, 64]`` (unused, None, without
            ``per_channel``). v_new: ``[B*T, HV, V]``. h: ``[NC, HV, K, V]``.
        chunk_start, chunk_end: int32 ``[NC]`` token ranges of the chunks.
        o: out, ``[B*T, HV, V]``.
        dot_dtype / precision: ``DT`` (a ``tl`` dtype) and ``input_precision`` of the dots.
        block_k: K rounded up to a power of two >= 16. block_v: V columns per program.
        per_channel: the kernel's ``GK``.
    """
    chunk_output_kernel[(chunks, HV, cdiv(V, block_v))](
        q, k if k is not None else q, g_cumsum, aqk if aqk is not None else g_cumsum, v_new,
        h, chunk_start, chunk_end, o, scale, H, HV, HV // H, K, V,
        DT=dot_dtype, PREC=precision, BT=chunk_size, BK=block_k, BV=block_v, GK=per_channel,
        num_warps=num_warps)
