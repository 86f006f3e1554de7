"""The backward's column walk: the chunks in reverse in one launch per window of chunks
(what calls of the small shapes of ``launch.column_suits`` launch, eager or traced, and
traced calls over fp8 / int4 undo logs; otherwise traced calls launch ``queue_walk``, eager
calls ``step_walk``'s launches per chunk).

``_reverse_kernel``: one program per (stream, column block) walks the chunks from last
to first with ``dB`` (the gradient w.r.t. the bank state at the current chunk's end)
advanced in place, and the bank state itself rebuilt in place on a working copy of the
final bank: before chunk c, the rows c wrote get their chunk-start values back from the
forward's undo log (dequantized in the kernel), so every row c gathers is at its
chunk-start value. Per chunk:

0. restore the chunk's written rows (one store per distinct written row);
1. ``v - r0`` from the chunk-start write rows;  2. ``delta = X u``;
3. ``Dw = dB[written slots]``: ``d coef``, ``Dw . M0w`` and ``d delta = coef Dw + QK^T dy``;
   the ``dQK`` tile;  4. ``du = X^T d delta``: ``dv``, the ``dL`` tile, ``d r0``, ``d ev``;
5. the new ``dB`` of every distinct touched slot, written once by the lane owning its
   group in slot-sorted order (``phase1.Groups``): decay of a written slot + the
   gathers' transposes, summed in the group's fixed order.

Sums over bank columns (``d coef``, ``dQK``, ...) cross column blocks: each program
stores its partial and torch sums the partials in a fixed order (deterministic, no
atomics); ``phase1_grads`` then takes them back to ``k``, ``q`` and the gates.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.tiles import (_group_cols, _group_headers, _group_members, _load_log, _qkt_dy,
                            row_length)
from ..runtime.launch import launch, multiple_of_16, pow2


@triton.jit
def _restore(work_ptr, log_ptr, scale_ptr, run_slot_ptr, rb, lb, hd, width, cols, cm,
             CW: tl.constexpr, NG: tl.constexpr, QMODE: tl.constexpr):
    """Put the chunk-start values of the chunk's written rows back into the working bank
    (each distinct written row once: the lane of its run start, also its log row)."""
    for f0 in range(0, CW, NG):
        pos = f0 + tl.arange(0, NG)
        fm = pos < CW
        sl = tl.load(run_slot_ptr + rb + pos, mask=fm, other=-1)
        x = _load_log(log_ptr, scale_ptr, lb + pos, sl >= 0, width, cols, cm, QMODE)
        tl.store(work_ptr + sl.to(tl.int64)[:, None] * hd + cols[None, :],
                 x.to(work_ptr.dtype.element_ty), mask=(sl >= 0)[:, None] & cm[None, :])


@triton.jit
def _entry_tile(tm, e0, e_hi, EW: tl.constexpr):
    """Entries [e0, e0+EW) below ``e_hi`` of a tile's tokens, and their mask. Made apart from
    ``_load_rows``: the mutation analysis of a traced launch follows the partial sums'
    store offsets (which hold the entries) back through the calls that made them, and
    counts every pointer those calls were handed as written (``slot_ptr``, which Inductor
    would then copy before the launch where it is an input)."""
    ents = e0 + tl.arange(0, EW)
    em = tm[:, None] & (ents < e_hi)[None, :]
    return ents, em


@triton.jit
def _load_rows(work_ptr, slot_ptr, seg, toks, ents, em, hd, cols, cm, E: tl.constexpr):
    """Chunk-start rows [TB, EW, BD] (fp32) of the tile's entries ``ents`` (``_entry_tile``),
    gathered from the working bank (which holds the chunk-start state); also their slots
    (-1: none)."""
    sl = tl.load(slot_ptr + seg + toks[:, None] * E + ents[None, :], mask=em, other=-1)
    x = tl.load(work_ptr + sl.to(tl.int64)[:, :, None] * hd + cols[None, None, :],
                mask=(sl >= 0)[:, :, None] & cm[None, None, :], other=0.0).to(tl.float32)
    return x, sl


@triton.jit
def _dw_tile(pc_ptr, pm_ptr, po, Dw, rows, dl, cf, em):
    """Pass 3 on one tile of write entries: the partial ``d coef`` and ``Dw . M0w`` sums of
    this column block; returns the tile's share of ``d delta``."""
    tl.store(pc_ptr + po, tl.sum(Dw * dl[:, None, :], axis=2), mask=em)
    tl.store(pm_ptr + po, tl.sum(Dw * rows, axis=2), mask=em)
    return tl.sum(cf[:, :, None] * Dw, axis=1)


@triton.jit
def _dev_tile(pe_ptr, off, rows, ents, em, dr0, dyt, W: tl.constexpr):
    """Pass 4 on one tile of entries: the partial ``d ev`` (``d r0`` for writes, ``dy`` for
    reads, against the chunk-start rows) of this column block."""
    vec = tl.where((ents < W)[None, :, None], dr0[:, None, :], dyt[:, None, :])
    tl.store(pe_ptr + off, tl.sum(vec * rows, axis=2), mask=em)


@triton.jit
def _group_head(g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr, g_tok_ptr, g_ev_ptr, gb,
                f0, CE: tl.constexpr, NG: tl.constexpr, KW: tl.constexpr):
    """What a dB tile needs before its row loads, independent of the columns: the headers
    of groups [f0, f0 + NG) (``phase1.Groups``, any layout) and their first ``KW``
    members (``_group_members``)."""
    pos, sl, ln, nw, dec = _group_headers(g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr,
                                          gb, f0, CE, NG)
    tf, wt, mk, isw = _group_members(g_tok_ptr, g_ev_ptr, gb, pos, sl, ln, nw, KW)
    return pos, sl, ln, nw, dec, tf, wt, mk, isw


@triton.jit
def _group_tile(dB_ptr, g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr, g_tok_ptr,
                g_ev_ptr, scr_dr, dy_ptr, gb, f0, p, c, T, hd, cols, cm, sc, C, CE: tl.constexpr,
                NG: tl.constexpr, KW: tl.constexpr, BD: tl.constexpr, DS):
    """dB at the chunk start of groups [f0, f0 + NG), columns ``cols`` (``_group_head``
    then ``_group_cols``; nothing past the last group of packed headers)."""
    pos, sl, ln, nw, dec, tf, wt, mk, isw = _group_head(
        g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr, g_tok_ptr, g_ev_ptr, gb, f0, CE,
        NG, KW)
    if tl.max(sl, axis=0) >= 0:
        _group_cols(dB_ptr, g_tok_ptr, g_ev_ptr, scr_dr, dy_ptr, gb, pos, sl, ln, nw, dec, tf,
                    wt, mk, isw, p, c, T, hd, cols, cm, sc, C, KW, DS, "")


@triton.jit(do_not_specialize=["P", "T", "NC", "B", "C_LO", "N_WIN", "NCW"])
def _reverse_kernel(dB_ptr, work_ptr, log_ptr, scale_ptr, run_slot_ptr, slot_ptr, ev_ptr,
                    coef_ptr,
                    g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr, g_tok_ptr, g_ev_ptr,
                    X_ptr, QK_ptr, beta_ptr, v_ptr, dy_ptr,
                    dv_ptr, pe_ptr, pc_ptr, pm_ptr, pb_ptr, pqk_ptr, pl_ptr, scratch_ptr,
                    P, T, hd, width, NC, B, C_LO, N_WIN, NCW,
                    C: tl.constexpr, W: tl.constexpr, R: tl.constexpr, BD: tl.constexpr,
                    TB: tl.constexpr, EW: tl.constexpr, NG: tl.constexpr, CP: tl.constexpr,
                    QMODE: tl.constexpr, PREC: tl.constexpr, HD16: tl.constexpr,
                    WIDTH16: tl.constexpr, KW: tl.constexpr = 1):
    # one window of chunks, [C_LO, C_LO + N_WIN), in reverse; the partial sums hold NCW
    # chunks per stream (the window), indexed by the chunk's place in the window
    hd = row_length(hd, HD16)
    width = row_length(width, WIDTH16)
    p = tl.program_id(0)
    cb = tl.program_id(1)
    E: tl.constexpr = W + R
    cols = cb * BD + tl.arange(0, BD)
    cm = cols < hd
    sc = tl.arange(0, BD)
    scr = scratch_ptr + (p * tl.num_programs(1) + cb).to(tl.int64) * (4 * CP * BD)
    scr_vmr = scr                    # v - r0
    scr_d = scr + CP * BD            # delta
    scr_dd = scr + 2 * CP * BD       # d delta
    scr_dr = scr + 3 * CP * BD       # d r0
    part = cb.to(tl.int64) * B       # this program's slice of the partial sums (B = P * NCW)
    cc = 0
    while cc < N_WIN:  # chunks in reverse; runtime trip count
        c = C_LO + N_WIN - 1 - cc
        b = p * NC + c
        bw = p * NCW + (c - C_LO)        # the chunk's row of the window's partial sums
        seg = b.to(tl.int64) * C * E
        # 0: the working bank back to this chunk's start state
        _restore(work_ptr, log_ptr, scale_ptr, run_slot_ptr, b.to(tl.int64) * C * W,
                 (c * P + p).to(tl.int64) * C * W, hd, width, cols, cm, C * W, NG, QMODE)
        tl.debug_barrier()
        mat = b.to(tl.int64) * C * C
        # 1: v - r0
        for t0 in range(0, C, TB):
            toks = t0 + tl.arange(0, TB)
            tm = toks < C
            r0 = tl.zeros([TB, BD], tl.float32)
            # the next tile's chunk-start rows in flight while this tile is reduced
            ents, em = _entry_tile(tm, 0, W, EW)
            rows, _ = _load_rows(work_ptr, slot_ptr, seg, toks, ents, em, hd, cols, cm, E)
            wt = tl.load(ev_ptr + seg + toks[:, None] * E + ents[None, :], mask=em, other=0.0)
            for e0 in range(0, W, EW):
                ents_n, em_n = _entry_tile(tm, e0 + EW, W, EW)
                rows_n, _ = _load_rows(work_ptr, slot_ptr, seg, toks, ents_n, em_n, hd,
                                       cols, cm, E)
                wt_n = tl.load(ev_ptr + seg + toks[:, None] * E + ents_n[None, :], mask=em_n,
                               other=0.0)
                r0 += tl.sum(wt[:, :, None] * rows, axis=1)
                rows = rows_n
                wt = wt_n
            tg = c * C + toks
            tv = tm & (tg < T)
            vv = tl.load(v_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
                         mask=tv[:, None] & cm[None, :], other=0.0).to(tl.float32)
            tl.store(scr_vmr + toks[:, None] * BD + sc[None, :], vv - r0, mask=tm[:, None])
        tl.debug_barrier()
        # 2: delta = X (beta (v - r0))
        for t0 in range(0, C, TB):
            toks = t0 + tl.arange(0, TB)
            tm = toks < C
            d = tl.zeros([TB, BD], tl.float32)
            for k0 in range(0, t0 + TB, TB):
                ks = k0 + tl.arange(0, TB)
                km = ks < C
                bk = tl.load(beta_ptr + b.to(tl.int64) * C + ks, mask=km, other=0.0)
                uk = bk[:, None] * tl.load(scr_vmr + ks[:, None] * BD + sc[None, :],
                                           mask=km[:, None], other=0.0)
                xk = tl.load(X_ptr + mat + toks[:, None] * C + ks[None, :],
                             mask=tm[:, None] & km[None, :], other=0.0)
                d += tl.dot(xk, uk, input_precision=PREC)
            tl.store(scr_d + toks[:, None] * BD + sc[None, :], d, mask=tm[:, None])
        tl.debug_barrier()
        # 3: the chunk-end gradients of the written rows; d delta; dQK
        for t0 in range(0, C, TB):
            toks = t0 + tl.arange(0, TB)
            tm = toks < C
            tg = c * C + toks
            tv = tm & (tg < T)
            dl = tl.load(scr_d + toks[:, None] * BD + sc[None, :], mask=tm[:, None], other=0.0)
            dd = tl.zeros([TB, BD], tl.float32)
            # the next tile's slots and chunk-start rows load during this tile's gather
            ents, em = _entry_tile(tm, 0, W, EW)
            rows, sl = _load_rows(work_ptr, slot_ptr, seg, toks, ents, em, hd, cols, cm, E)
            for e0 in range(0, W, EW):
                Dw = tl.load(dB_ptr + sl.to(tl.int64)[:, :, None] * hd + cols[None, None, :],
                             mask=(sl >= 0)[:, :, None] & cm[None, None, :],
                             other=0.0).to(tl.float32)
                cf = tl.load(coef_ptr + seg + toks[:, None] * E + ents[None, :], mask=em,
                             other=0.0)
                ents_n, em_n = _entry_tile(tm, e0 + EW, W, EW)
                rows_n, sl = _load_rows(work_ptr, slot_ptr, seg, toks, ents_n, em_n, hd,
                                        cols, cm, E)
                po = (part + bw) * C * W + toks[:, None] * W + ents[None, :]
                dd += _dw_tile(pc_ptr, pm_ptr, po, Dw, rows, dl, cf, em)
                rows = rows_n
                ents = ents_n
                em = em_n
            for k0 in range(0, C, TB):
                ks = k0 + tl.arange(0, TB)
                km = ks < C
                dd += _qkt_dy(QK_ptr, dy_ptr, mat, p, c, T, hd, toks, tm, ks, km, cols, cm, C,
                              PREC)
                # dQK[toks, ks] = dy[toks] . delta[ks] (j <= i)
                dlk = tl.load(scr_d + ks[:, None] * BD + sc[None, :], mask=km[:, None], other=0.0)
                dyt = tl.load(dy_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
                              mask=tv[:, None] & cm[None, :], other=0.0).to(tl.float32)
                g = tl.dot(dyt, tl.trans(dlk), input_precision=PREC)
                g = tl.where(ks[None, :] <= toks[:, None], g, 0.0)
                tl.store(pqk_ptr + (part + bw) * C * C + toks[:, None] * C + ks[None, :], g,
                         mask=tm[:, None] & km[None, :])
            tl.store(scr_dd + toks[:, None] * BD + sc[None, :], dd, mask=tm[:, None])
        tl.debug_barrier()
        # 4: du = X^T d delta; dv, dL, dbeta, d r0, d ev
        for t0 in range(0, C, TB):
            toks = t0 + tl.arange(0, TB)
            tm = toks < C
            tg = c * C + toks
            tv = tm & (tg < T)
            du = tl.zeros([TB, BD], tl.float32)
            for k0 in range(t0, C, TB):
                ks = k0 + tl.arange(0, TB)
                km = ks < C
                xt = tl.load(X_ptr + mat + ks[None, :] * C + toks[:, None],
                             mask=tm[:, None] & km[None, :], other=0.0)
                ddk = tl.load(scr_dd + ks[:, None] * BD + sc[None, :], mask=km[:, None], other=0.0)
                du += tl.dot(xt, ddk, input_precision=PREC)
            for k0 in range(0, C, TB):
                ks = k0 + tl.arange(0, TB)
                km = ks < C
                dlk = tl.load(scr_d + ks[:, None] * BD + sc[None, :], mask=km[:, None], other=0.0)
                g = -tl.dot(du, tl.trans(dlk), input_precision=PREC)
                g = tl.where(ks[None, :] < toks[:, None], g, 0.0)
                tl.store(pl_ptr + (part + bw) * C * C + toks[:, None] * C + ks[None, :], g,
                         mask=tm[:, None] & km[None, :])
            vmr = tl.load(scr_vmr + toks[:, None] * BD + sc[None, :], mask=tm[:, None], other=0.0)
            tl.store(pb_ptr + (part + bw) * C + toks, tl.sum(vmr * du, axis=1), mask=tm)
            bt = tl.load(beta_ptr + b.to(tl.int64) * C + toks, mask=tm, other=0.0)
            tl.store(dv_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
                     (bt[:, None] * du).to(dv_ptr.dtype.element_ty), mask=tv[:, None] & cm[None, :])
            dr0 = -bt[:, None] * du
            tl.store(scr_dr + toks[:, None] * BD + sc[None, :], dr0, mask=tm[:, None])
            dyt = tl.load(dy_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
                          mask=tv[:, None] & cm[None, :], other=0.0).to(tl.float32)
            ents, em = _entry_tile(tm, 0, E, EW)
            rows, _ = _load_rows(work_ptr, slot_ptr, seg, toks, ents, em, hd, cols, cm, E)
            for e0 in range(0, E, EW):
                ents_n, em_n = _entry_tile(tm, e0 + EW, E, EW)
                rows_n, _ = _load_rows(work_ptr, slot_ptr, seg, toks, ents_n, em_n, hd,
                                       cols, cm, E)
                _dev_tile(pe_ptr, (part + bw) * C * E + toks[:, None] * E + ents[None, :], rows,
                          ents, em, dr0, dyt, W)
                rows = rows_n
                ents = ents_n
                em = em_n
        tl.debug_barrier()
        # 5: dB at the chunk start, each distinct touched slot once (lane = group start)
        gb = b.to(tl.int64) * C * E
        for f0 in range(0, C * E, NG):
            _group_tile(dB_ptr, g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr, g_tok_ptr,
                        g_ev_ptr, scr_dr, dy_ptr, gb, f0, p, c, T, hd, cols, cm, sc, C, C * E, NG,
                        KW, BD, BD)
        tl.debug_barrier()
        cc += 1


def column_reverse(dB, work, log, scales, width: int, pl, gr, v, dy, dv, qmode: int,
                    prec: str, config: dict) -> dict:
    """The chunks in reverse by ``_reverse_kernel`` (one launch per window of chunks, one
    program per stream and column block): advances
    ``dB`` and ``work`` in place, writes ``dv``, returns the cross-column sums
    ``[B, C, n]``."""
    P, C, W, R, NC, B, T = pl.P, pl.C, pl.W, pl.R, pl.NC, pl.B, pl.T
    E = W + R
    hd = dB.shape[1]
    BD, CP = config["BD_BWD"], pow2(C)
    NCB = -(-hd // BD)
    f32 = dict(dtype=torch.float32, device=dB.device)
    # per-column-block partial sums of one window of NCW chunks per stream (a fixed number
    # of windows, so traced code has no length-dependent loop): their memory is 1/windows
    # of the whole sequence's, reduced over the column blocks after each window
    # traced (symbolic T): one window, as padded window slices would put guards on T
    nwin = config["BWD_WINDOWS"] if isinstance(NC, int) else 1
    NCW = NC if nwin == 1 else -(-NC // nwin)
    BW = P * NCW
    widths = dict(ev=E, coef=W, m=W, b=1, qk=C, L=C)   # d ev (d r0 . M0w, dy . M0q), d coef,
    # Dw . M0w, (v - r0) . du, dQK, dL
    parts = {k: torch.empty(NCB, BW, C, n, **f32) for k, n in widths.items()}
    # the reduced sums, padded to whole windows so every window's slice has one width
    if nwin > 1:
        sums = {k: torch.empty(P, nwin * NCW, C, n, **f32) for k, n in widths.items()}
    scratch = torch.empty(P * NCB * 4 * CP * BD, **f32)
    for w in range(nwin - 1, -1, -1):   # windows last to first: the chunks in reverse
        c_lo = w * NCW
        n_win = NC if nwin == 1 else max(0, min(NCW, NC - c_lo))
        launch(_reverse_kernel, (P, NCB), dB, work, log, scales, pl.runs.slot, pl.slot, pl.ev,
               pl.coef, gr.slot, gr.length, gr.n_w, gr.decay, gr.pos, gr.tok, gr.ev, pl.X,
               pl.QK, pl.beta, v, dy, dv,
               parts["ev"], parts["coef"], parts["m"], parts["b"], parts["qk"], parts["L"],
               scratch, P, T, hd, width, NC, BW, c_lo, n_win, NCW, C=C, W=W, R=R,
               BD=BD, TB=min(config["TB"], CP), EW=config["EW_BWD"], NG=config["NG_BWD"], CP=CP,
               QMODE=qmode, PREC=prec, KW=config["KW_BWD"], HD16=multiple_of_16(hd),
               WIDTH16=multiple_of_16(width), num_warps=config["WARPS_BWD"])
        if nwin == 1:   # the whole sequence's sums, [B, C, n] (no [P, NC, ...] view: a
            # traced call would guard on NC being 1 and recompile when a length passes C)
            return {k: part.sum(0) for k, part in parts.items()}
        # cross-column sums of the window, in a fixed order (rows past the window's chunks
        # land in the padding)
        for k, part in parts.items():
            sums[k][:, c_lo:c_lo + NCW] = part.sum(0).view(P, NCW, C, -1)
    # contiguous: with one chunk (T <= C) the narrowed [P, 1, C, n] reshapes to a strided
    # view, and the kernels below index these sums as dense [B, C, n]
    return {k: x.narrow(1, 0, NC).reshape(B, C, n).contiguous()
            for (k, x), n in zip(sums.items(), widths.values())}
