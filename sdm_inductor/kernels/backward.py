"""Backward of the chunked form: the chunks in reverse, then Phase 1 backwards.

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
atomics). ``_pair_grads_kernel`` / ``_gate_grads_kernel`` then take the Gram matrices
and per-entry weights back to ``k``, ``q`` and the gates by walking each entry's group,
the transpose of ``phase1._pairs_kernel``; every output element has one writer.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from torch import Tensor

from .launch import launch, pow2, step_walks
from .phase1 import Groups, entry_groups, plan
from .pipeline import ahead, behind, token_windows
from .sources import chunk_start_sources

# snapshot_quant modes as the kernel decodes the undo log
_QMODE = {"none": 0, "bf16": 0, "fp8": 1, "int4": 2}


@triton.jit
def _fp8_e4m3_to_f32(byte):
    """float8 e4m3fn bits -> fp32 (decoded by hand: no fp8 type needed, e.g. in the interpreter)."""
    b = byte.to(tl.int32)
    sign = tl.where((b & 0x80) != 0, -1.0, 1.0)
    ex = (b >> 3) & 0xF
    man = (b & 0x7).to(tl.float32)
    mag = tl.where(ex == 0, man * 0.001953125, (8.0 + man) * tl.exp2((ex - 10).to(tl.float32)))
    return sign * mag


@triton.jit
def _load_log(log_ptr, scale_ptr, row, m, width, cols, cm, QMODE: tl.constexpr):
    """Undo-log rows ``row`` [NG] (mask ``m``), columns ``cols``, dequantized to fp32."""
    m2 = m[:, None] & cm[None, :]
    if QMODE == 0:
        x = tl.load(log_ptr + row[:, None] * width + cols[None, :], mask=m2,
                    other=0.0).to(tl.float32)
    else:
        scale = tl.load(scale_ptr + row, mask=m, other=0.0)
        if QMODE == 1:
            byte = tl.load(log_ptr + row[:, None] * width + cols[None, :], mask=m2, other=0)
            x = _fp8_e4m3_to_f32(byte)
        else:
            byte = tl.load(log_ptr + row[:, None] * width + (cols // 2)[None, :], mask=m2,
                           other=0).to(tl.int32)
            x = (((byte >> ((cols % 2) * 4)[None, :]) & 0xF) - 8).to(tl.float32)
        x = x * scale[:, None]
    return x


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
def _load_rows(work_ptr, slot_ptr, seg, toks, tm, e0, e_hi, hd, cols, cm, E: tl.constexpr,
               EW: tl.constexpr):
    """Chunk-start rows [TB, EW, BD] (fp32) of entries [e0, e0+EW) below ``e_hi``, gathered
    from the working bank (which holds the chunk-start state); also the entries, their
    mask and their slots (-1: none)."""
    ents = e0 + tl.arange(0, EW)
    em = tm[:, None] & (ents < e_hi)[None, :]
    sl = tl.load(slot_ptr + seg + toks[:, None] * E + ents[None, :], mask=em, other=-1)
    x = tl.load(work_ptr + sl.to(tl.int64)[:, :, None] * hd + cols[None, None, :],
                mask=(sl >= 0)[:, :, None] & cm[None, None, :], other=0.0).to(tl.float32)
    return x, ents, em, sl


@triton.jit
def _dw_tile(pc_ptr, pm_ptr, po, Dw, rows, dl, cf, em):
    """Pass 3 on one tile of write entries: the partial ``d coef`` and ``Dw . M0w`` sums of
    this column block; returns the tile's share of ``d delta``."""
    tl.store(pc_ptr + po, tl.sum(Dw * dl[:, None, :], axis=2), mask=em)
    tl.store(pm_ptr + po, tl.sum(Dw * rows, axis=2), mask=em)
    return tl.sum(cf[:, :, None] * Dw, axis=1)


@triton.jit
def _qkt_dy(QK_ptr, dy_ptr, mat, p, c, T, hd, toks, tm, ks, km, cols, cm, C,
            PREC: tl.constexpr):
    """``QK[ks, toks]^T @ dy[ks]``: key block ``ks``'s share of ``d delta`` for tokens
    ``toks`` (columns ``cols``; ``mat``: the chunk's first Gram matrix element)."""
    kg = c * C + ks
    dyk = tl.load(dy_ptr + (p.to(tl.int64) * T + kg)[:, None] * hd + cols[None, :],
                  mask=(km & (kg < T))[:, None] & cm[None, :], other=0.0).to(tl.float32)
    qkt = tl.load(QK_ptr + mat + ks[None, :] * C + toks[:, None],
                  mask=tm[:, None] & km[None, :], other=0.0)
    return tl.dot(qkt, dyk, input_precision=PREC)


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
def _group_headers(g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr, gb, f0,
                   CE: tl.constexpr, NG: tl.constexpr):
    """The headers of groups [f0, f0 + NG): first position, slot, members, write members,
    decay."""
    gi = f0 + tl.arange(0, NG)
    fm = gi < CE
    sl = tl.load(g_slot_ptr + gb + gi, mask=fm, other=-1)
    ln = tl.load(g_len_ptr + gb + gi, mask=fm, other=0)
    nw = tl.load(g_nw_ptr + gb + gi, mask=fm, other=0)
    dec = tl.load(g_decay_ptr + gb + gi, mask=fm, other=1.0)
    pos = tl.load(g_pos_ptr + gb + gi, mask=fm, other=-1)
    return pos, sl, ln, nw, dec


@triton.jit
def _group_members(g_tok_ptr, g_ev_ptr, gb, pos, sl, ln, nw, KW: tl.constexpr):
    """The first ``KW`` members of each group (token, weight, which are live and which are
    write members)."""
    ks = tl.arange(0, KW)
    mpos = pos[:, None] + ks[None, :]
    mk = (sl >= 0)[:, None] & (ks[None, :] < ln[:, None])
    tf = tl.load(g_tok_ptr + gb + mpos, mask=mk, other=0)
    wt = tl.load(g_ev_ptr + gb + mpos, mask=mk, other=0.0)
    isw = ks[None, :] < nw[:, None]
    return tf, wt, mk, isw


@triton.jit
def _group_cols(dB_ptr, g_tok_ptr, g_ev_ptr, scr_dr, dy_ptr, gb, pos, sl, ln, nw, dec, tf, wt,
                mk, isw, p, c, T, hd, cols, cm, sc, C, KW: tl.constexpr, DS, CG: tl.constexpr):
    """dB of one tile's groups (``_group_head``) in the columns ``cols``: decay of a written
    slot plus the members' terms (``d r0`` of write members, ``dy`` of read members) in the
    group's order. The first ``KW`` members are gathered in one round trip with the old
    rows; only groups longer than ``KW`` (rare for sparse slots) take the loop, one member
    per round trip. ``scr_dr + tok * DS + sc`` holds token ``tok``'s ``d r0`` for ``cols``.
    ``CG``: the cache modifier of the loads of what the walk writes (``dB``, ``d r0``)."""
    ro = sl.to(tl.int64)[:, None] * hd + cols[None, :]
    wm = (sl >= 0)[:, None] & cm[None, :]
    old = tl.load(dB_ptr + ro, mask=wm, other=0.0, cache_modifier=CG)
    dr = tl.load(scr_dr + tf[:, :, None] * DS + sc[None, None, :],
                 mask=(mk & isw)[:, :, None] & cm[None, None, :], other=0.0, cache_modifier=CG)
    fg = c * C + tf
    dyf = tl.load(dy_ptr + (p.to(tl.int64) * T + fg)[:, :, None] * hd + cols[None, None, :],
                  mask=(mk & (~isw) & (fg < T))[:, :, None] & cm[None, None, :],
                  other=0.0).to(tl.float32)
    acc = tl.sum(wt[:, :, None] * (dr + dyf), axis=1)
    m = KW
    n_max = tl.max(ln, axis=0)  # largest group
    while m < n_max:  # data-dependent trip count
        mm = m < ln
        tfm = tl.load(g_tok_ptr + gb + pos + m, mask=mm, other=0)
        wtm = tl.load(g_ev_ptr + gb + pos + m, mask=mm, other=0.0)
        is_w = m < nw
        drm = tl.load(scr_dr + tfm[:, None] * DS + sc[None, :],
                      mask=(mm & is_w)[:, None] & cm[None, :], other=0.0, cache_modifier=CG)
        fgm = c * C + tfm
        dym = tl.load(dy_ptr + (p.to(tl.int64) * T + fgm)[:, None] * hd + cols[None, :],
                      mask=(mm & (~is_w) & (fgm < T))[:, None] & cm[None, :],
                      other=0.0).to(tl.float32)
        acc += wtm[:, None] * (drm + dym)
        m += 1
    new = dec[:, None] * old.to(tl.float32) + acc
    tl.store(dB_ptr + ro, new.to(dB_ptr.dtype.element_ty), mask=wm)


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
                    QMODE: tl.constexpr, PREC: tl.constexpr, KW: tl.constexpr = 1,
                    AHEAD: tl.constexpr = 0):
    # one window of chunks, [C_LO, C_LO + N_WIN), in reverse; the partial sums hold NCW
    # chunks per stream (the window), indexed by the chunk's place in the window
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
            if AHEAD:   # the next tile's chunk-start rows in flight while this tile is reduced
                rows, ents, em, _ = _load_rows(work_ptr, slot_ptr, seg, toks, tm, 0, W, hd,
                                               cols, cm, E, EW)
                wt = tl.load(ev_ptr + seg + toks[:, None] * E + ents[None, :], mask=em, other=0.0)
                for e0 in range(0, W, EW):
                    rows_n, ents_n, em_n, _ = _load_rows(work_ptr, slot_ptr, seg, toks, tm,
                                                         e0 + EW, W, hd, cols, cm, E, EW)
                    wt_n = tl.load(ev_ptr + seg + toks[:, None] * E + ents_n[None, :], mask=em_n,
                                   other=0.0)
                    r0 += tl.sum(wt[:, :, None] * rows, axis=1)
                    rows = rows_n
                    wt = wt_n
            else:
                for e0 in range(0, W, EW):
                    rows, ents, em, _ = _load_rows(work_ptr, slot_ptr, seg, toks, tm, e0, W, hd,
                                                   cols, cm, E, EW)
                    wt = tl.load(ev_ptr + seg + toks[:, None] * E + ents[None, :], mask=em,
                                 other=0.0)
                    r0 += tl.sum(wt[:, :, None] * rows, axis=1)
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
            if AHEAD:   # the next tile's slots and chunk-start rows load during this tile's gather
                rows, ents, em, sl = _load_rows(work_ptr, slot_ptr, seg, toks, tm, 0, W, hd,
                                                cols, cm, E, EW)
                for e0 in range(0, W, EW):
                    Dw = tl.load(dB_ptr + sl.to(tl.int64)[:, :, None] * hd + cols[None, None, :],
                                 mask=(sl >= 0)[:, :, None] & cm[None, None, :],
                                 other=0.0).to(tl.float32)
                    cf = tl.load(coef_ptr + seg + toks[:, None] * E + ents[None, :], mask=em,
                                 other=0.0)
                    rows_n, ents_n, em_n, sl = _load_rows(work_ptr, slot_ptr, seg, toks, tm,
                                                          e0 + EW, W, hd, cols, cm, E, EW)
                    po = (part + bw) * C * W + toks[:, None] * W + ents[None, :]
                    dd += _dw_tile(pc_ptr, pm_ptr, po, Dw, rows, dl, cf, em)
                    rows = rows_n
                    ents = ents_n
                    em = em_n
            else:
                for e0 in range(0, W, EW):
                    rows, ents, em, sl = _load_rows(work_ptr, slot_ptr, seg, toks, tm, e0, W, hd,
                                                    cols, cm, E, EW)
                    off = seg + toks[:, None] * E + ents[None, :]
                    Dw = tl.load(dB_ptr + sl.to(tl.int64)[:, :, None] * hd + cols[None, None, :],
                                 mask=(sl >= 0)[:, :, None] & cm[None, None, :],
                                 other=0.0).to(tl.float32)
                    cf = tl.load(coef_ptr + off, mask=em, other=0.0)
                    po = (part + bw) * C * W + toks[:, None] * W + ents[None, :]
                    dd += _dw_tile(pc_ptr, pm_ptr, po, Dw, rows, dl, cf, em)
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
            if AHEAD:
                rows, ents, em, _ = _load_rows(work_ptr, slot_ptr, seg, toks, tm, 0, E, hd,
                                               cols, cm, E, EW)
                for e0 in range(0, E, EW):
                    rows_n, ents_n, em_n, _ = _load_rows(work_ptr, slot_ptr, seg, toks, tm,
                                                         e0 + EW, E, hd, cols, cm, E, EW)
                    _dev_tile(pe_ptr, (part + bw) * C * E + toks[:, None] * E + ents[None, :], rows,
                              ents, em, dr0, dyt, W)
                    rows = rows_n
                    ents = ents_n
                    em = em_n
            else:
                for e0 in range(0, E, EW):
                    rows, ents, em, _ = _load_rows(work_ptr, slot_ptr, seg, toks, tm, e0, E, hd,
                                                   cols, cm, E, EW)
                    _dev_tile(pe_ptr, (part + bw) * C * E + toks[:, None] * E + ents[None, :], rows,
                              ents, em, dr0, dyt, W)
        tl.debug_barrier()
        # 5: dB at the chunk start, each distinct touched slot once (lane = group start)
        gb = b.to(tl.int64) * C * E
        for f0 in range(0, C * E, NG):
            _group_tile(dB_ptr, g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr, g_tok_ptr,
                        g_ev_ptr, scr_dr, dy_ptr, gb, f0, p, c, T, hd, cols, cm, sc, C, C * E, NG,
                        KW, BD, BD)
        tl.debug_barrier()
        cc += 1


@triton.jit
def _pair_grads_kernel(val_ptr, gam_ptr, gend_ptr, perm_ptr, gs_ptr, nw_ptr, na_ptr, slot_ptr,
                       decay_ptr, beta_ptr, dev_ptr, dcoef_ptr, dm_ptr, dL_ptr, dQK_ptr,
                       dval_ptr, dgam_ptr, dgend_ptr, C,
                       W: tl.constexpr, R: tl.constexpr, EB: tl.constexpr):
    """Per entry: d val (k or q), d gam (gamq for reads), d gend, by walking its group.
    ``dA = beta dL`` (row-wise) and the chunk decay's part of d gend (``decay * dm`` for
    the first member of each written slot's group) are formed here from their factors,
    the same products the torch ops before this kernel once made."""
    pid = tl.program_id(0)            # b * C + i
    b = pid // C
    i = pid % C
    E: tl.constexpr = W + R
    seg = b.to(tl.int64) * C * E
    mat = b.to(tl.int64) * C * C
    beta_i = tl.load(beta_ptr + b.to(tl.int64) * C + i)
    for e0 in range(0, E, EB):
        e = e0 + tl.arange(0, EB)
        em = e < E
        off = seg + i * E + e
        is_w = e < W
        val = tl.load(val_ptr + off, mask=em, other=0.0)
        gam = tl.load(gam_ptr + off, mask=em, other=0.0)
        gend = tl.load(gend_ptr + off, mask=em, other=0.0)
        dev = tl.load(dev_ptr + off, mask=em, other=0.0)
        dco = tl.load(dcoef_ptr + pid.to(tl.int64) * W + e, mask=em & is_w, other=0.0)
        gs = tl.load(gs_ptr + off, mask=em, other=0)
        nw = tl.load(nw_ptr + off, mask=em, other=0)
        na = tl.load(na_ptr + off, mask=em, other=0)
        # the group's first member in sorted order is this entry: its slot's chunk decay
        lead = is_w & (tl.load(perm_ptr + seg + gs, mask=em, other=-1) == i * E + e)
        lead = lead & (tl.load(slot_ptr + off, mask=em, other=-1) >= 0)
        dm = tl.load(dm_ptr + pid.to(tl.int64) * W + e, mask=em & lead, other=0.0)
        dgd = tl.where(lead, tl.load(decay_ptr + off, mask=em & lead, other=0.0) * dm, 0.0)
        eg = tl.exp(gam)
        ec = tl.where(is_w, tl.exp(gend - gam), 0.0)
        dv = dev * eg + dco * ec
        dg = dev * val * eg - dco * val * ec
        dge = dgd + dco * val * ec
        # reads pair with write members only; writes with all members
        n = tl.where(is_w, na, nw)
        m = 0
        while m < tl.max(tl.where(em, n, 0), axis=0):  # data-dependent trip count
            mm = em & (m < n)
            f = tl.load(perm_ptr + seg + gs + m, mask=mm, other=0)
            tf = f // E
            vf = tl.load(val_ptr + seg + f, mask=mm, other=0.0)
            gf = tl.load(gam_ptr + seg + f, mask=mm, other=0.0)
            f_w = m < nw
            # write e, earlier write f: A[i, tf]; later write f: A[tf, i]
            # write e, read f at tf >= i: QK[tf, i]; read e, write f at tf <= i: QK[i, tf]
            use_a_lo = mm & is_w & f_w & (tf < i)
            use_a_hi = mm & is_w & f_w & (tf > i)
            use_q_w = mm & is_w & (~f_w) & (tf >= i)
            use_q_r = mm & (~is_w) & f_w & (tf <= i)
            a_lo = beta_i * tl.load(dL_ptr + mat + i * C + tf, mask=use_a_lo, other=0.0)
            a_hi = (tl.load(beta_ptr + b.to(tl.int64) * C + tf, mask=use_a_hi, other=0.0)
                    * tl.load(dL_ptr + mat + tf * C + i, mask=use_a_hi, other=0.0))
            q_w = tl.load(dQK_ptr + mat + tf * C + i, mask=use_q_w, other=0.0)
            q_r = tl.load(dQK_ptr + mat + i * C + tf, mask=use_q_r, other=0.0)
            x_lo = vf * tl.exp(gam - gf)      # e later than f
            x_hi = vf * tl.exp(gf - gam)      # f later than e
            t_lo = tl.where(use_a_lo, a_lo * x_lo, 0.0) + tl.where(use_q_r, q_r * x_lo, 0.0)
            t_hi = tl.where(use_a_hi, a_hi * x_hi, 0.0) + tl.where(use_q_w, q_w * x_hi, 0.0)
            dv += t_lo + t_hi
            dg += val * (t_lo - t_hi)
            m += 1
        tl.store(dval_ptr + off, dv, mask=em)
        tl.store(dgam_ptr + off, dg, mask=em)
        tl.store(dgend_ptr + off, tl.where(is_w, dge, 0.0), mask=em)


@triton.jit
def _gate_grads_kernel(perm_ptr, gs_ptr, nw_ptr, na_ptr, dgam_ptr, dgend_ptr, dgate_ptr, C,
                       W: tl.constexpr, R: tl.constexpr, WB: tl.constexpr):
    """d gate of a write entry: every cumulative decay of its group at or after its token."""
    pid = tl.program_id(0)
    b = pid // C
    i = pid % C
    E: tl.constexpr = W + R
    seg = b.to(tl.int64) * C * E
    for w0 in range(0, W, WB):
        w = w0 + tl.arange(0, WB)
        wm = w < W
        off = seg + i * E + w
        gs = tl.load(gs_ptr + off, mask=wm, other=0)
        nw = tl.load(nw_ptr + off, mask=wm, other=0)
        na = tl.load(na_ptr + off, mask=wm, other=0)
        acc = tl.zeros([WB], tl.float32)
        m = 0
        while m < tl.max(tl.where(wm, na, 0), axis=0):  # data-dependent trip count
            mm = wm & (m < na)
            f = tl.load(perm_ptr + seg + gs + m, mask=mm, other=0)
            later = (f // E) >= i
            dgm = tl.load(dgam_ptr + seg + f, mask=mm & later, other=0.0)
            dge = tl.load(dgend_ptr + seg + f, mask=mm & (m < nw), other=0.0)
            acc += dgm + dge
            m += 1
        tl.store(dgate_ptr + pid.to(tl.int64) * W + w, acc, mask=wm)


def backward(grad_readings: Tensor, grad_final: Tensor, final_bank: Tensor, saved_rows: Tensor,
             saved_scales: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, C: int,
             snapshot_quant: str, grad_bank_fp32: bool, config: dict):
    """The six gradients (bank, k_val, v, beta, g, q_val). Shapes-only host code.

    Eager calls (the step walks) run the sequence in token windows, the last first, with
    the Phase 1 of the window before on a side stream (``pipeline.ahead``); a traced call
    does the whole sequence as one window."""
    k_idx, k_val, v, beta, g, q_idx, q_val, dy = (
        x.contiguous() for x in (k_idx, k_val, v, beta, g, q_idx, q_val, grad_readings))
    S, hd = grad_final.shape
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    bank_dtype = grad_final.dtype
    dev = grad_final.device
    acc_dtype = torch.float32 if (grad_bank_fp32 or bank_dtype == torch.float32) else bank_dtype
    dB = grad_final.to(acc_dtype, copy=True).contiguous()
    if T == 0:
        return (dB.to(bank_dtype), torch.zeros_like(k_val, dtype=bank_dtype),
                torch.zeros_like(v, dtype=bank_dtype), torch.zeros_like(beta, dtype=torch.float32),
                torch.zeros_like(g, dtype=torch.float32), torch.zeros_like(q_val, dtype=bank_dtype))
    qmode = _QMODE[snapshot_quant]
    log = saved_rows.view(torch.uint8) if qmode == 1 else saved_rows
    tokens = config["TRAIN_WINDOW_TOKENS"]
    step = step_walks(config, dB, (P, W, R, C))
    one_window = not step or tokens <= 0 or T <= tokens
    # the step walk of one window over a log of raw rows reads each chunk-start row from
    # the final bank or the log (sources.py): no working copy of the bank, no restore
    # launch per chunk. Otherwise (token windows, fp8 / int4 logs, whose dequantization in
    # the one-warp gather launch would spill on sm_90) the walk rebuilds the bank state
    # chunk by chunk in reverse from the final bank and the log
    by_source = step and one_window and qmode == 0
    work = final_bank.contiguous() if by_source else final_bank.clone()
    # a separate placeholder, never dB itself: Inductor treats both pointers as written
    # and clones aliased arguments separately (the untouched copy would win)
    scales = saved_scales if saved_scales.numel() else torch.empty(1, dtype=torch.float32,
                                                                  device=dev)
    prec = "ieee" if bank_dtype == torch.float32 else "tf32"
    ctx = (dB, work, saved_rows.shape[-1], qmode, prec, config, step)

    def make(win):   # Phase 1 of a window: independent of the bank
        sl = slice(*win)
        pl = plan(S, *(x[:, sl].contiguous() for x in (k_idx, k_val, beta, g, q_idx, q_val)), C)
        return pl, entry_groups(pl, config["GROUP_PACK"])

    # the forward keeps its Phase 1 only for one step-walk window: token windows recompute
    kept = _kept(step and one_window, P, T, C, W, R)
    if one_window:
        pl = plan(S, k_idx, k_val, beta, g, q_idx, q_val, C) if kept is None else kept.plan
        from .. import ops
        ops.record_dispatch(chunk_start_rows="sources" if by_source else "restored")
        groups = entry_groups(pl, int(config["GROUP_PACK"]))
        sources = chunk_start_sources(pl, S) if by_source else None
        dv, sums = _reverse(pl, groups, log, scales, v, dy, *ctx, dv_dtype=bank_dtype,
                            vmr=None if kept is None else kept.vmr, sources=sources)
        dk, dbeta, dg, dq = _phase1_grads(pl, sums, g.shape[2])
        return dB.to(bank_dtype), dk.to(bank_dtype), dv, dbeta, dg, dq.to(bank_dtype)
    f32 = dict(dtype=torch.float32, device=dev)
    dk, dv, dbeta, dg, dq = (
        torch.empty(P, T, W, dtype=bank_dtype, device=dev),
        torch.empty(P, T, hd, dtype=bank_dtype, device=dev), torch.empty(P, T, **f32),
        torch.empty(P, T, g.shape[2], **f32), torch.empty(P, T, R, dtype=bank_dtype, device=dev))
    wins = token_windows(T, C, tokens)
    for (t0, t1), (pl, gr) in ahead(wins[::-1], make, dev):
        rows = slice(t0 // C * P * C, -(-t1 // C) * P * C)   # the window's chunks in the log
        dv_w, sums = _reverse(pl, gr, log[rows],
                              scales[rows] if saved_scales.numel() else scales,
                              v[:, t0:t1].contiguous(), dy[:, t0:t1].contiguous(), *ctx,
                              dv_dtype=bank_dtype)
        dv[:, t0:t1] = dv_w
        # the window's Phase 1 backward on the side stream too, after its walk: it needs
        # the walk's sums, not the bank, so the walk of the window before goes on meanwhile
        with behind(dev, *sums.values()):
            for o, x in zip((dk, dbeta, dg, dq), _phase1_grads(pl, sums, g.shape[2])):
                o[:, t0:t1] = x
    return dB.to(bank_dtype), dk, dv, dbeta, dg, dq


def _kept(usable: bool, P: int, T: int, C: int, W: int, R: int):
    """What the forward kept for this backward (``host.Kept``), when ``usable`` and it fits
    the call; the dispatch record says whether the backward recomputes its Phase 1."""
    from .. import ops
    kept = ops.kept_for_backward() if usable else None
    pl = getattr(kept, "plan", None)
    if pl is not None and (pl.P, pl.T, pl.C, pl.W, pl.R) != (P, T, C, W, R):
        kept = None   # not this call's forward: never used
    ops.record_dispatch(phase1_backward="recomputed" if kept is None else "kept")
    return kept


def _reverse(pl, gr, log, scales, v, dy, dB, work, width: int, qmode: int, prec: str,
             config: dict, step: bool, dv_dtype: torch.dtype, vmr=None, sources=None):
    """The reverse walk over one window's chunks (``pl``: its Phase 1; ``log`` / ``scales``
    its undo log; ``v`` / ``dy`` its tokens; ``vmr``: the forward's ``v - r0``, if kept),
    advancing ``dB`` and ``work`` in place to the window's start: the window's ``dv``
    and cross-column sums. ``dv`` is written once per element, so the kernels round it to
    ``dv_dtype`` (the bank's) as they store it: no fp32 copy and conversion pass after."""
    dv = torch.empty(pl.P, pl.T, dB.shape[1], dtype=dv_dtype, device=dB.device)
    if step:
        # eager: the step walk (step_backward.py), launches per chunk over the whole GPU
        from .step_backward import step_reverse
        sums = step_reverse(dB, work, log, scales, width, pl, gr, v, dy, dv, qmode, prec, config,
                            vmr, sources)
    else:
        sums = _column_reverse(dB, work, log, scales, width, pl, gr, v, dy, dv, qmode, prec,
                               config)
    return dv, sums


# warps of ``_pair_grads_kernel`` / ``_gate_grads_kernel`` (one program per token, blocks
# of 32 entries; no float sums across lanes, so any count gives bitwise the same results).
# One warp holds a block's 32 lanes; four only duplicated them: 121 -> 56 us and 43 -> 24
# us at A C=128, autograd 0.990 (A) / 0.996 (B) against four (NOTES.md run 29)
PAIR_GRADS_WARPS = 1
GATE_GRADS_WARPS = 1


def _phase1_grads(pl, sums: dict, g_width: int):
    """Phase 1 backwards for one window: from the walk's sums through the Gram matrices,
    the per-entry weights and the cumulative decays to ``(dk, dbeta, dg, dq)`` of the
    window's tokens (dk / dq in fp32). Reads no bank row."""
    P, T, C, NC, B, W, R = pl.P, pl.T, pl.C, pl.NC, pl.B, pl.W, pl.R
    E = W + R
    dev = pl.val.device
    f32 = dict(dtype=torch.float32, device=dev)
    dL = sums["L"]
    dbeta = (pl.A * dL).sum(-1) + sums["b"].view(B, C)

    dval = torch.empty(B, C, E, **f32)
    dgam = torch.empty(B, C, E, **f32)
    dgend = torch.empty(B, C, E, **f32)
    launch(_pair_grads_kernel, (B * C,), pl.val, pl.gam, pl.gend, pl.perm, pl.gs, pl.nw, pl.na,
           pl.slot, pl.decay, pl.beta, sums["ev"], sums["coef"], sums["m"], dL, sums["qk"], dval,
           dgam, dgend, C, W=W, R=R, EB=min(32, pow2(E)), num_warps=PAIR_GRADS_WARPS)
    dgate = torch.empty(B, C, W, **f32)
    launch(_gate_grads_kernel, (B * C,), pl.perm, pl.gs, pl.nw, pl.na, dgam, dgend, dgate, C,
           W=W, R=R, WB=min(32, pow2(W)), num_warps=GATE_GRADS_WARPS)

    # back from the dense-key entries to the user's entries; drop padding. The tokens are
    # selected, not sliced: a [:, :T] view of a padded [P, Tp, ...] tensor is contiguous
    # exactly when T is a multiple of C, a guard that would recompile a traced graph
    Tp = NC * C
    tok = torch.arange(T, device=dev)
    dval = dval.view(P, Tp, E)
    dk = torch.gather(dval[:, :, :W], 2, pl.first.long()).index_select(1, tok)
    dq = dval[:, :, W:].index_select(1, tok)
    active = pl.slot.view(P, Tp, E)[:, :, :W].index_select(1, tok) >= 0
    dgw = dgate.view(P, Tp, W).index_select(1, tok) * active
    dg = dgw if g_width == W else dgw.sum(-1, keepdim=True)
    return dk, dbeta.view(P, Tp).index_select(1, tok), dg, dq


def _column_reverse(dB, work, log, scales, width: int, pl, gr, v, dy, dv, qmode: int,
                    prec: str, config: dict) -> dict:
    """The chunks in reverse by ``_reverse_kernel`` (one launch per window of chunks, one
    program per stream and column block; the only form a traced call can take): advances
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
               QMODE=qmode, PREC=prec, KW=config["KW_BWD"], AHEAD=config["AHEAD_BWD"],
               num_warps=config["WARPS_BWD"])
        # cross-column sums of the window, in a fixed order (rows past the window's chunks
        # land in the padding)
        for k, part in parts.items():
            sums[k][:, c_lo:c_lo + NCW] = part.sum(0).view(P, NCW, C, -1)
    # contiguous: with one chunk (T <= C) the narrowed [P, 1, C, n] reshapes to a strided
    # view, and the kernels below index these sums as dense [B, C, n]
    sums = {k: (x if nwin == 1 else x.narrow(1, 0, NC)).reshape(B, C, n).contiguous()
            for (k, x), n in zip(sums.items(), widths.values())}
    return sums
