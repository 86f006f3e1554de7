"""Phase 2 of the chunked form: the sequential walk over the chunks, in one launch.

Every quantity of Phase 2 is separable by bank column (SDM_SPEC section 3), so one
program owns (stream ``p``, column block ``cb``) and walks all chunks of its stream
inside the kernel (a runtime loop: a new ``T`` needs no new compilation). Per chunk:

- pass A: gather the chunk-start rows of the write entries, ``r0``, ``u = beta (v - r0)``;
- pass B: gather the read rows (``inter``), ``delta = X u`` and ``y = inter + QKX u``
  (two small matmuls over the chunk's tokens; both matrices are lower triangular, so
  only the blocks on or below the diagonal are multiplied);
- pass C: each distinct written slot is written once, by the program's lanes of the
  first write entry of its group: ``exp(gend) M0[s] + sum_j coef_j delta_j``, the sum
  walked in the group's fixed order (deterministic, no atomics).

``u`` and ``delta`` go through a per-program scratch (L1/L2 resident) because a lane
needs other lanes' tokens; ``tl.debug_barrier`` orders the passes. A program's rows are
touched by no other program (streams own disjoint slots), so the walk needs no
inter-program synchronisation. With ``SAVE`` the chunk-start rows of every entry are
stored for the backward (cast to the snapshot dtype).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _gather_rows(bank_ptr, slot_ptr, w_ptr, saved_ptr, seg, sv, toks, tm, e0, e_end, hd, cols, cm,
                 E: tl.constexpr, EW: tl.constexpr, SAVE: tl.constexpr):
    """rows [TB, EW, BD] of entries [e0, e0+EW) of tokens ``toks``; returns sum_e w * row."""
    ents = e0 + tl.arange(0, EW)
    em = tm[:, None] & (ents < e_end)[None, :]
    off = seg + toks[:, None] * E + ents[None, :]
    sl = tl.load(slot_ptr + off, mask=em, other=-1)
    wt = tl.load(w_ptr + off, mask=em, other=0.0)
    rm = (sl >= 0)[:, :, None] & cm[None, None, :]
    rows = tl.load(bank_ptr + sl.to(tl.int64)[:, :, None] * hd + cols[None, None, :],
                   mask=rm, other=0.0)
    if SAVE:
        so = ((sv + toks[:, None]) * E + ents[None, :])[:, :, None] * hd + cols[None, None, :]
        tl.store(saved_ptr + so, rows.to(saved_ptr.dtype.element_ty),
                 mask=em[:, :, None] & cm[None, None, :])
    return tl.sum(wt[:, :, None] * rows.to(tl.float32), axis=1)


@triton.jit
def _forward_kernel(bank_ptr, slot_ptr, ev_ptr, coef_ptr, decay_ptr, perm_ptr, gs_ptr, nw_ptr,
                    X_ptr, QKX_ptr, v_ptr, beta_ptr, out_ptr, scratch_ptr, saved_ptr,
                    P, T, hd, NC, C: tl.constexpr,
                    W: tl.constexpr, R: tl.constexpr, BD: tl.constexpr, TB: tl.constexpr,
                    EW: tl.constexpr, NG: tl.constexpr, CP: tl.constexpr,
                    SAVE: tl.constexpr, PREC: tl.constexpr):
    p = tl.program_id(0)
    cb = tl.program_id(1)
    E: tl.constexpr = W + R
    cols = cb * BD + tl.arange(0, BD)
    cm = cols < hd
    sc = tl.arange(0, BD)
    scr_u = scratch_ptr + (p * tl.num_programs(1) + cb).to(tl.int64) * (2 * CP * BD)
    scr_d = scr_u + CP * BD
    c = 0
    while c < NC:  # runtime trip count: one compile for every T
        b = p * NC + c
        seg = b.to(tl.int64) * C * E
        sv = (c * P + p).to(tl.int64) * C          # saved position of the chunk's token 0
        # pass A: u = beta (v - r0)
        for t0 in range(0, C, TB):
            toks = t0 + tl.arange(0, TB)
            tm = toks < C
            r0 = tl.zeros([TB, BD], tl.float32)
            for e0 in range(0, W, EW):
                r0 += _gather_rows(bank_ptr, slot_ptr, ev_ptr, saved_ptr, seg, sv, toks, tm,
                                   e0, W, hd, cols, cm, E, EW, SAVE)
            tg = c * C + toks
            tv = tm & (tg < T)
            vv = tl.load(v_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
                         mask=tv[:, None] & cm[None, :], other=0.0).to(tl.float32)
            bt = tl.load(beta_ptr + b.to(tl.int64) * C + toks, mask=tm, other=0.0)
            u = bt[:, None] * (vv - r0)
            tl.store(scr_u + toks[:, None] * BD + sc[None, :], u, mask=tm[:, None])
        tl.debug_barrier()
        # pass B: readings and deltas
        for t0 in range(0, C, TB):
            toks = t0 + tl.arange(0, TB)
            tm = toks < C
            y = tl.zeros([TB, BD], tl.float32)
            for e0 in range(W, E, EW):
                y += _gather_rows(bank_ptr, slot_ptr, ev_ptr, saved_ptr, seg, sv, toks, tm,
                                  e0, E, hd, cols, cm, E, EW, SAVE)
            d = tl.zeros([TB, BD], tl.float32)
            for k0 in range(0, t0 + TB, TB):
                ks = k0 + tl.arange(0, TB)
                km = ks < C
                uk = tl.load(scr_u + ks[:, None] * BD + sc[None, :], mask=km[:, None], other=0.0)
                xo = b.to(tl.int64) * C * C + toks[:, None] * C + ks[None, :]
                xm = tm[:, None] & km[None, :]
                d += tl.dot(tl.load(X_ptr + xo, mask=xm, other=0.0), uk, input_precision=PREC)
                y += tl.dot(tl.load(QKX_ptr + xo, mask=xm, other=0.0), uk, input_precision=PREC)
            tl.store(scr_d + toks[:, None] * BD + sc[None, :], d, mask=tm[:, None])
            tg = c * C + toks
            tv = tm & (tg < T)
            tl.store(out_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
                     y.to(out_ptr.dtype.element_ty), mask=tv[:, None] & cm[None, :])
        tl.debug_barrier()
        # pass C: each distinct written slot once, by its group's first write entry
        for f0 in range(0, C * W, NG):
            fi = f0 + tl.arange(0, NG)
            fm = fi < C * W
            own = (fi // W) * E + fi % W                # flat entry index in the segment
            sl = tl.load(slot_ptr + seg + own, mask=fm, other=-1)
            gs = tl.load(gs_ptr + seg + own, mask=fm, other=0)
            nw = tl.load(nw_ptr + seg + own, mask=fm, other=0)
            lead = (sl >= 0) & (tl.load(perm_ptr + seg + gs, mask=sl >= 0, other=-1) == own)
            acc = tl.zeros([NG, BD], tl.float32)
            m = 0
            while m < tl.max(tl.where(lead, nw, 0), axis=0):  # data-dependent trip count
                mm = lead & (m < nw)
                f = tl.load(perm_ptr + seg + gs + m, mask=mm, other=0)
                cf = tl.load(coef_ptr + seg + f, mask=mm, other=0.0)
                dd = tl.load(scr_d + (f // E)[:, None] * BD + sc[None, :], mask=mm[:, None],
                             other=0.0)
                acc += cf[:, None] * dd
                m += 1
            dec = tl.load(decay_ptr + seg + own, mask=lead, other=0.0)
            ro = sl.to(tl.int64)[:, None] * hd + cols[None, :]
            wm = lead[:, None] & cm[None, :]
            old = tl.load(bank_ptr + ro, mask=wm, other=0.0).to(tl.float32)
            tl.store(bank_ptr + ro, (dec[:, None] * old + acc).to(bank_ptr.dtype.element_ty),
                     mask=wm)
        tl.debug_barrier()
        c += 1
