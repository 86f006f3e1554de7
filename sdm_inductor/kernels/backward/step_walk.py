"""The backward's chunk walk in steps: launches per chunk over the whole GPU, in reverse.

The same computation as ``reverse_walk._reverse_kernel`` (the ``reverse_walk`` module
docstring numbers the passes), cut where one pass needs another's results for all the
chunk's tokens, so each
piece is one launch with many programs (as the forward's step walk):

1. ``_step_restore_kernel`` (write positions x column blocks): the rows chunk c wrote
   get their chunk-start values back from the undo log, in the working bank. Not with
   the sources of a raw log (``sources.py``): the row launches then read
   each entry's chunk-start row from the final bank or the undo log itself, both
   immutable during the walk, and there is no working copy;
2. ``_step_bwd_gather_kernel`` (tokens x column blocks): ``v - r0``;
3. ``_step_bwd_mix1_kernel`` (token blocks x column slices): ``delta = X u`` and the
   ``QK^T dy`` part of ``d delta``;
4. ``_step_bwd_dw_kernel`` (tokens x column blocks): ``Dw = dB[written slots]``: the
   ``d coef`` and ``Dw . M0w`` partial sums, ``d delta += sum coef Dw``;
5. ``_step_bwd_mix2_kernel`` (token blocks x column slices): ``du = X^T d delta``:
   ``dv``, ``d r0``, and the ``dL``, ``dQK``, ``d beta`` partial sums;
6. ``_step_bwd_dev_group_kernel``, one grid of two kinds of programs: ``_dev_program``
   (tokens x column blocks) the ``d ev`` partial sums, ``_group_program`` (entry positions
   x column blocks) the new ``dB`` of every distinct touched slot, once, in its group's
   order (``reverse_walk._group_tile``).

Partial sums over columns go to ``[blocks, P * NCW, C, n]`` buffers (a window of ``NCW``
chunks per stream) that ``window_sums`` reduces in a fixed order after each window (the
column walk reduces its own by torch). Every element has one writer: deterministic.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..common.counts import _depend
from ..common.tiles import (ROWS_MAX_CP, _block_program, _column_block, _gather_index,
                            _gather_rows, _grid_dependency, _group_cols, _group_headers,
                            _group_members, _launch_dependents, _load_log, _qkt_dy,
                            _token_program, _token_program_at, _wait)
from ..runtime import graphs
from ..runtime.launch import Relaunch, launch, pdl, pow2


@triton.jit(do_not_specialize=["c", "P", "NC"])
def _step_restore_kernel(work_ptr, log_ptr, scale_ptr, run_slot_ptr, c, P, hd, width, NC,
                         C: tl.constexpr, W: tl.constexpr, BD: tl.constexpr, NG: tl.constexpr,
                         QMODE: tl.constexpr, PDL: tl.constexpr):
    # PDL == 3: the next launch may start at once (the product of the chunk, which needs
    # nothing of this one; or, where the forward's v - r0 is not kept, the gather, whose
    # programs wait for this one before their row loads); this one's stores still wait
    # for the dB launch before it
    _launch_dependents(PDL == 3)
    _grid_dependency(PDL == 1)
    NRT: tl.constexpr = (C * W + NG - 1) // NG
    pid = tl.program_id(0)       # p * NRT + tile
    p = pid // NRT
    pos = (pid % NRT) * NG + tl.arange(0, NG)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cm = cols < hd
    b = p * NC + c
    # early loads: the runs are Phase 1's, the undo log the forward's
    sl = tl.load(run_slot_ptr + b.to(tl.int64) * C * W + pos, mask=pos < C * W, other=-1)
    x = _load_log(log_ptr, scale_ptr, (c * P + p).to(tl.int64) * C * W + pos, sl >= 0, width,
                  cols, cm, QMODE)
    _grid_dependency(PDL == 2)
    _wait(PDL == 3)
    tl.store(work_ptr + sl.to(tl.int64)[:, None] * hd + cols[None, :],
             x.to(work_ptr.dtype.element_ty), mask=(sl >= 0)[:, None] & cm[None, :])


@triton.jit
def _start_rows(work_ptr, log_ptr, scale_ptr, src_ptr, base, sl, cols, cm, hd, width,
                n: tl.constexpr, NP: tl.constexpr, QMODE: tl.constexpr, SRC: tl.constexpr,
                CG: tl.constexpr):
    """The chunk-start rows ``M0[sl_e, cols]`` (fp32) of the ``n`` entries from ``base``.
    Without ``SRC``: the working bank, which the restore launch brought back to the chunk's
    start (``CG``: the loads' cache modifier). With ``SRC``
    (``sources.py``): ``work_ptr`` is the final bank, and an entry whose slot is written at
    or after this chunk reads the undo-log row ``src_ptr[base + e]`` instead, rounded to
    the bank's dtype as the restore launch stores it (bitwise its rows). Sources serve
    unscaled logs only (``dispatch``: dequantizing fp8 / int4 rows here would spill the
    one-warp gather launch on sm_90, so such a log is restored instead)."""
    m2 = (sl >= 0)[:, None] & cm[None, :]
    ro = sl.to(tl.int64)[:, None] * hd + cols[None, :]
    if SRC:
        tl.static_assert(QMODE == 0)
        e = tl.arange(0, NP)
        src = tl.load(src_ptr + base + e, mask=e < n, other=-1)
        lo = src.to(tl.int64)[:, None] * width + cols[None, :]
        if log_ptr.dtype.element_ty == work_ptr.dtype.element_ty:
            # a log of the bank's dtype: one load through either pointer (one tile of
            # registers, as the working bank's)
            rows = tl.load(tl.where((src >= 0)[:, None], log_ptr + lo, work_ptr + ro), mask=m2,
                           other=0.0)
        else:
            lg = _load_log(log_ptr, scale_ptr, src.to(tl.int64), src >= 0, width, cols, cm, 0)
            fin = tl.load(work_ptr + ro, mask=m2 & (src < 0)[:, None], other=0.0)
            rows = tl.where((src >= 0)[:, None], lg.to(work_ptr.dtype.element_ty), fin)
    else:
        rows = tl.load(work_ptr + ro, mask=m2, other=0.0, cache_modifier=CG)
    return rows.to(tl.float32)


@triton.jit(do_not_specialize=["c", "T", "NC"])
def _step_bwd_gather_kernel(work_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, ev_ptr, v_ptr,
                            vmr_ptr, c, T, hd, width, NC, C: tl.constexpr, W: tl.constexpr,
                            R: tl.constexpr, BD: tl.constexpr, WP: tl.constexpr,
                            CP: tl.constexpr, PDL: tl.constexpr, QMODE: tl.constexpr = 0,
                            SRC: tl.constexpr = False):
    _grid_dependency(PDL == 1)
    p, i, _, base, cols, cm = _token_program(NC, c, hd, C, W + R, BD)
    _vmr_token(work_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, ev_ptr, v_ptr, vmr_ptr, p, i,
               base, cols, cm, c, T, hd, width, C, W, WP, CP, PDL, QMODE, SRC)


@triton.jit
def _vmr_token(work_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, ev_ptr, v_ptr, vmr_ptr, p, i,
               base, cols, cm, c, T, hd, width, C: tl.constexpr, W: tl.constexpr,
               WP: tl.constexpr, CP: tl.constexpr, PDL: tl.constexpr, QMODE: tl.constexpr,
               SRC: tl.constexpr):
    """``v - r0`` of token ``i`` of stream ``p`` in columns ``cols`` (a gather program)."""
    sl, wt = _gather_index(slot_ptr, ev_ptr, base, W, WP)
    _grid_dependency(PDL >= 2)
    if SRC:
        r0 = tl.sum(wt[:, None] * _start_rows(work_ptr, log_ptr, scale_ptr, src_ptr, base, sl,
                                              cols, cm, hd, width, W, WP, QMODE, SRC, ""),
                    axis=0)
    else:
        r0 = _gather_rows(work_ptr, sl, wt, cols, cm, hd)
    tg = c * C + i
    vv = tl.load(v_ptr + (p.to(tl.int64) * T + tg) * hd + cols, mask=cm & (tg < T),
                 other=0.0).to(tl.float32)
    tl.store(vmr_ptr + (p.to(tl.int64) * CP + i) * hd + cols, vv - r0, mask=cm)


@triton.jit
def _mix1_blocks(X_ptr, QK_ptr, beta_ptr, vmr_ptr, dy_ptr, d_ptr, dd_ptr, p, b, t0, cols, cm, c,
                 T, hd, vmr_cs, C: tl.constexpr, MB: tl.constexpr, TB: tl.constexpr,
                 CP: tl.constexpr, PREC: tl.constexpr, cnt_ptr=None, target=0):
    """The first product launch in blocks of ``TB`` key tokens (after the launch's wait;
    ``cnt_ptr``: a queue walk item's wait for the last readers of its outputs' buffers,
    before its stores, ``counts._depend``)."""
    mat = b.to(tl.int64) * C * C
    toks = t0 + tl.arange(0, TB)
    tm = toks < C
    buf = (p.to(tl.int64) * CP + toks)[:, None] * hd + cols[None, :]
    vmr_ptr += c.to(tl.int64) * vmr_cs   # the chunk's [P, CP, hd] block (0: the scratch)
    d = tl.zeros([TB, MB], tl.float32)
    k0 = 0
    while k0 < t0 + TB:   # X is lower triangular
        ks = k0 + tl.arange(0, TB)
        km = ks < C
        bk = tl.load(beta_ptr + b.to(tl.int64) * C + ks, mask=km, other=0.0)
        uk = bk[:, None] * tl.load(vmr_ptr + (p.to(tl.int64) * CP + ks)[:, None] * hd + cols[None, :],
                                   mask=km[:, None] & cm[None, :], other=0.0)
        xk = tl.load(X_ptr + mat + toks[:, None] * C + ks[None, :],
                     mask=tm[:, None] & km[None, :], other=0.0)
        d += tl.dot(xk, uk, input_precision=PREC)
        k0 += TB
    if cnt_ptr is None:   # a step launch stores delta once made (its waits came first)
        tl.store(d_ptr + buf, d, mask=tm[:, None] & cm[None, :])
    # QK^T dy, the part of d delta that needs no dB
    qd = tl.zeros([TB, MB], tl.float32)
    k0 = 0
    while k0 < C:
        ks = k0 + tl.arange(0, TB)
        qd += _qkt_dy(QK_ptr, dy_ptr, mat, p, c, T, hd, toks, tm, ks, ks < C, cols, cm, C, PREC)
        k0 += TB
    if cnt_ptr is not None:
        _depend(True, cnt_ptr, target)
        tl.store(d_ptr + buf, d, mask=tm[:, None] & cm[None, :])
    tl.store(dd_ptr + buf, qd, mask=tm[:, None] & cm[None, :])


@triton.jit
def _mix2_blocks(X_ptr, beta_ptr, vmr_ptr, d_ptr, dd_ptr, dr_ptr, dy_ptr, dv_ptr, pqk_ptr, pl_ptr,
                 pb_ptr, p, b, t0, cols, cm, ms, c, T, hd, NB, NCW, vmr_cs, C: tl.constexpr,
                 MB: tl.constexpr, TB: tl.constexpr, CP: tl.constexpr, PREC: tl.constexpr):
    """The second product launch in blocks of ``TB`` tokens (after the launch's wait);
    ``ms``: the column slice, its row of the partial sums."""
    mat = b.to(tl.int64) * C * C
    toks = t0 + tl.arange(0, TB)
    tm = toks < C
    tg = c * C + toks
    tv = tm & (tg < T)
    du = tl.zeros([TB, MB], tl.float32)
    k0 = t0
    while k0 < C:   # X[k, t] = 0 for k < t
        ks = k0 + tl.arange(0, TB)
        km = ks < C
        xt = tl.load(X_ptr + mat + ks[None, :] * C + toks[:, None],
                     mask=tm[:, None] & km[None, :], other=0.0)
        ddk = tl.load(dd_ptr + (p.to(tl.int64) * CP + ks)[:, None] * hd + cols[None, :],
                      mask=km[:, None] & cm[None, :], other=0.0)
        du += tl.dot(xt, ddk, input_precision=PREC)
        k0 += TB
    dyt = tl.load(dy_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
                  mask=tv[:, None] & cm[None, :], other=0.0).to(tl.float32)
    prt = ms * NB + p * NCW + c % NCW     # the chunk's row of this slice's partials
    prow = (prt.to(tl.int64) * C + toks)[:, None] * C
    k0 = 0
    while k0 < tl.minimum(C, t0 + TB):   # tiles on or below the diagonal: window_sums
        ks = k0 + tl.arange(0, TB)       # reads nothing above it
        km = ks < C
        dlk = tl.load(d_ptr + (p.to(tl.int64) * CP + ks)[:, None] * hd + cols[None, :],
                      mask=km[:, None] & cm[None, :], other=0.0)
        sm = tm[:, None] & km[None, :] & (ks[None, :] <= toks[:, None])
        gl = -tl.dot(du, tl.trans(dlk), input_precision=PREC)
        tl.store(pl_ptr + prow + ks[None, :], tl.where(ks[None, :] < toks[:, None], gl, 0.0),
                 mask=sm)
        gq = tl.dot(dyt, tl.trans(dlk), input_precision=PREC)
        tl.store(pqk_ptr + prow + ks[None, :], gq, mask=sm)
        k0 += TB
    buf = (p.to(tl.int64) * CP + toks)[:, None] * hd + cols[None, :]
    vmr = tl.load(vmr_ptr + c.to(tl.int64) * vmr_cs + buf, mask=tm[:, None] & cm[None, :],
                  other=0.0)
    tl.store(pb_ptr + prt.to(tl.int64) * C + toks, tl.sum(vmr * du, axis=1), mask=tm)
    bt = tl.load(beta_ptr + b.to(tl.int64) * C + toks, mask=tm, other=0.0)
    tl.store(dv_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
             (bt[:, None] * du).to(dv_ptr.dtype.element_ty), mask=tv[:, None] & cm[None, :])
    tl.store(dr_ptr + buf, -bt[:, None] * du, mask=tm[:, None] & cm[None, :])


@triton.jit
def _mix1_rows(X_ptr, QK_ptr, beta_ptr, vmr_ptr, dy_ptr, d_ptr, dd_ptr, p, b, t0, cols, cm, c,
               T, hd, vmr_cs, C: tl.constexpr, MB: tl.constexpr, TB: tl.constexpr,
               CP: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr):
    """The first product launch with the token block's whole rows at once (``ROWS``):
    ``QK^T dy`` needs only what was written before the walk (Phase 1's Gram matrix, the
    output gradient), so it is loaded and computed before the wait, with X's rows and the
    gates; after it, one load of the chunk's ``v - r0`` and one product, ``delta = X u``."""
    mat = b.to(tl.int64) * C * C
    toks = t0 + tl.arange(0, TB)
    tm = toks < C
    ks = tl.arange(0, CP)
    kc = ks < C
    km = kc & (ks < t0 + TB)     # X is lower triangular
    x = tl.load(X_ptr + mat + toks[:, None] * C + ks[None, :], mask=tm[:, None] & km[None, :],
                other=0.0)
    bk = tl.load(beta_ptr + b.to(tl.int64) * C + ks, mask=km, other=0.0)
    qd = _qkt_dy(QK_ptr, dy_ptr, mat, p, c, T, hd, toks, tm, ks, kc, cols, cm, C, PREC)
    _grid_dependency(PDL >= 2)
    vmr_ptr += c.to(tl.int64) * vmr_cs   # the chunk's [P, CP, hd] block (0: the scratch)
    uk = bk[:, None] * tl.load(vmr_ptr + (p.to(tl.int64) * CP + ks)[:, None] * hd + cols[None, :],
                               mask=km[:, None] & cm[None, :], other=0.0)
    d = tl.dot(x, uk, input_precision=PREC)
    buf = (p.to(tl.int64) * CP + toks)[:, None] * hd + cols[None, :]
    tl.store(d_ptr + buf, d, mask=tm[:, None] & cm[None, :])
    tl.store(dd_ptr + buf, qd, mask=tm[:, None] & cm[None, :])


@triton.jit
def _mix2_rows(X_ptr, beta_ptr, vmr_ptr, d_ptr, dd_ptr, dr_ptr, dy_ptr, dv_ptr, pqk_ptr, pl_ptr,
               pb_ptr, p, b, t0, cols, cm, ms, c, T, hd, NB, NCW, vmr_cs, C: tl.constexpr,
               MB: tl.constexpr, TB: tl.constexpr, CP: tl.constexpr, PREC: tl.constexpr,
               PDL: tl.constexpr):
    """The second product launch with the token block's whole columns of X, its output
    gradient and gates loaded before the wait (``ROWS``); after it one load each of
    ``d delta`` and ``delta`` for all the chunk's tokens, and one product per result."""
    mat = b.to(tl.int64) * C * C
    toks = t0 + tl.arange(0, TB)
    tm = toks < C
    tg = c * C + toks
    tv = tm & (tg < T)
    ks = tl.arange(0, CP)
    kc = ks < C
    km = kc & (ks >= t0)         # X[k, t] = 0 for k < t
    xt = tl.load(X_ptr + mat + ks[None, :] * C + toks[:, None], mask=tm[:, None] & km[None, :],
                 other=0.0)
    dyt = tl.load(dy_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
                  mask=tv[:, None] & cm[None, :], other=0.0).to(tl.float32)
    bt = tl.load(beta_ptr + b.to(tl.int64) * C + toks, mask=tm, other=0.0)
    _grid_dependency(PDL >= 2)
    kbuf = (p.to(tl.int64) * CP + ks)[:, None] * hd + cols[None, :]
    ddk = tl.load(dd_ptr + kbuf, mask=km[:, None] & cm[None, :], other=0.0)
    du = tl.dot(xt, ddk, input_precision=PREC)
    dlk = tl.load(d_ptr + kbuf, mask=kc[:, None] & cm[None, :], other=0.0)
    prt = ms * NB + p * NCW + c % NCW     # the chunk's row of this slice's partials
    prow = (prt.to(tl.int64) * C + toks)[:, None] * C
    # on and below the diagonal only: window_sums reads nothing above it
    sm = tm[:, None] & kc[None, :] & (ks[None, :] <= toks[:, None])
    gl = -tl.dot(du, tl.trans(dlk), input_precision=PREC)
    tl.store(pl_ptr + prow + ks[None, :], tl.where(ks[None, :] < toks[:, None], gl, 0.0), mask=sm)
    gq = tl.dot(dyt, tl.trans(dlk), input_precision=PREC)
    tl.store(pqk_ptr + prow + ks[None, :], gq, mask=sm)
    buf = (p.to(tl.int64) * CP + toks)[:, None] * hd + cols[None, :]
    vmr = tl.load(vmr_ptr + c.to(tl.int64) * vmr_cs + buf, mask=tm[:, None] & cm[None, :],
                  other=0.0)
    tl.store(pb_ptr + prt.to(tl.int64) * C + toks, tl.sum(vmr * du, axis=1), mask=tm)
    tl.store(dv_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
             (bt[:, None] * du).to(dv_ptr.dtype.element_ty), mask=tv[:, None] & cm[None, :])
    tl.store(dr_ptr + buf, -bt[:, None] * du, mask=tm[:, None] & cm[None, :])


@triton.jit(do_not_specialize=["c", "T", "NC", "vmr_cs"])
def _step_bwd_mix1_kernel(X_ptr, QK_ptr, beta_ptr, vmr_ptr, dy_ptr, d_ptr, dd_ptr, c, T, hd,
                          NC, vmr_cs, C: tl.constexpr, MB: tl.constexpr, TB: tl.constexpr,
                          CP: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr,
                          ROWS: tl.constexpr = False):
    # (With PDL == 3 and the forward's v - r0 kept, this launch could run whole before its
    # wait; measured 2 % slower in autograd calls, so it waits as with 2.)
    if ROWS:
        _grid_dependency(PDL == 1)
        p, b, t0, cols, cm = _block_program(NC, c, hd, MB, TB, CP)
        _mix1_rows(X_ptr, QK_ptr, beta_ptr, vmr_ptr, dy_ptr, d_ptr, dd_ptr, p, b, t0, cols, cm,
                   c, T, hd, vmr_cs, C, MB, TB, CP, PREC, PDL)
    else:
        _grid_dependency(PDL)
        p, b, t0, cols, cm = _block_program(NC, c, hd, MB, TB, CP)
        _mix1_blocks(X_ptr, QK_ptr, beta_ptr, vmr_ptr, dy_ptr, d_ptr, dd_ptr, p, b, t0, cols, cm,
                     c, T, hd, vmr_cs, C, MB, TB, CP, PREC)


@triton.jit(do_not_specialize=["c", "NC", "NB", "NCW"])
def _step_bwd_dw_kernel(dB_ptr, work_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, coef_ptr, d_ptr,
                        dd_ptr, pc_ptr, pm_ptr, c, hd, width, NC, NB, NCW, C: tl.constexpr,
                        W: tl.constexpr, R: tl.constexpr, BD: tl.constexpr, WP: tl.constexpr,
                        CP: tl.constexpr, PDL: tl.constexpr, CG: tl.constexpr = "",
                        QMODE: tl.constexpr = 0, SRC: tl.constexpr = False):
    _grid_dependency(PDL == 1)
    p, i, b, base, cols, cm = _token_program(NC, c, hd, C, W + R, BD)
    _dw_token(dB_ptr, work_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, coef_ptr, d_ptr, dd_ptr,
              pc_ptr, pm_ptr, p, i, base, cols, cm, tl.program_id(1), c, hd, width, NB, NCW, C,
              W, WP, CP, PDL, CG, QMODE, SRC)


@triton.jit
def _dw_token(dB_ptr, work_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, coef_ptr, d_ptr, dd_ptr,
              pc_ptr, pm_ptr, p, i, base, cols, cm, cb, c, hd, width, NB, NCW, C: tl.constexpr,
              W: tl.constexpr, WP: tl.constexpr, CP: tl.constexpr, PDL: tl.constexpr,
              CG: tl.constexpr, QMODE: tl.constexpr, SRC: tl.constexpr, cnt_ptr=None,
              target=0):
    """``Dw`` of token ``i`` of stream ``p`` in column block ``cb`` (a dw program;
    ``cnt_ptr``, ``target``: a queue walk item's wait, ``counts._depend``)."""
    w = tl.arange(0, WP)
    wm = w < W
    sl = tl.load(slot_ptr + base + w, mask=wm, other=-1)
    cf = tl.load(coef_ptr + base + w, mask=wm, other=0.0)
    _grid_dependency(PDL == 2)
    # PDL == 3: the dB rows (the dB launch two back, or three with a restore launch) and
    # chunk-start rows (the restore launch two back; with SRC nothing the walk writes)
    # load before the wait too, through L2 (CG = ".cg": never a line an
    # SM's L1 kept from before they were written); only delta needs the launch before
    ro = sl.to(tl.int64)[:, None] * hd + cols[None, :]
    m2 = (sl >= 0)[:, None] & cm[None, :]
    Dw = tl.load(dB_ptr + ro, mask=m2, other=0.0, cache_modifier=CG).to(tl.float32)
    # (SRC: the log and the final bank, which no launch of the walk writes)
    M0 = _start_rows(work_ptr, log_ptr, scale_ptr, src_ptr, base, sl, cols, cm, hd, width, W,
                     WP, QMODE, SRC, CG)
    po = ((cb * NB + p * NCW + c % NCW).to(tl.int64) * C + i) * W + w
    tl.store(pm_ptr + po, tl.sum(Dw * M0, axis=1), mask=wm)
    _depend(PDL == 3, cnt_ptr, target)
    buf = (p.to(tl.int64) * CP + i) * hd + cols
    dl = tl.load(d_ptr + buf, mask=cm, other=0.0)
    tl.store(pc_ptr + po, tl.sum(Dw * dl[None, :], axis=1), mask=wm)
    dd = tl.load(dd_ptr + buf, mask=cm, other=0.0) + tl.sum(cf[:, None] * Dw, axis=0)
    tl.store(dd_ptr + buf, dd, mask=cm)


@triton.jit(do_not_specialize=["c", "T", "NC", "NB", "NCW", "vmr_cs"])
def _step_bwd_mix2_kernel(X_ptr, beta_ptr, vmr_ptr, d_ptr, dd_ptr, dr_ptr, dy_ptr, dv_ptr,
                          pqk_ptr, pl_ptr, pb_ptr, c, T, hd, NC, NB, NCW, vmr_cs, C: tl.constexpr,
                          MB: tl.constexpr, TB: tl.constexpr, CP: tl.constexpr,
                          PREC: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr = False):
    if ROWS:
        _grid_dependency(PDL == 1)
        p, b, t0, cols, cm = _block_program(NC, c, hd, MB, TB, CP)
        _mix2_rows(X_ptr, beta_ptr, vmr_ptr, d_ptr, dd_ptr, dr_ptr, dy_ptr, dv_ptr, pqk_ptr, pl_ptr,
                   pb_ptr, p, b, t0, cols, cm, tl.program_id(1), c, T, hd, NB, NCW, vmr_cs, C,
                   MB, TB, CP, PREC, PDL)
    else:
        _grid_dependency(PDL)
        p, b, t0, cols, cm = _block_program(NC, c, hd, MB, TB, CP)
        _mix2_blocks(X_ptr, beta_ptr, vmr_ptr, d_ptr, dd_ptr, dr_ptr, dy_ptr, dv_ptr, pqk_ptr,
                     pl_ptr, pb_ptr, p, b, t0, cols, cm, tl.program_id(1), c, T, hd, NB, NCW,
                     vmr_cs, C, MB, TB, CP, PREC)


@triton.jit
def _dev_half(rows, pe_ptr, po, vec, n: tl.constexpr, NP: tl.constexpr):
    """The ``d ev`` partials ``vec . rows_e`` of ``n`` entries."""
    e = tl.arange(0, NP)
    tl.store(pe_ptr + po + e, tl.sum(rows * vec[None, :], axis=1), mask=e < n)


@triton.jit
def _dev_program(pid, cb, work_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, dr_ptr, dy_ptr, pe_ptr,
                 c, T, hd, width, NC, NB, NCW, C: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
                 BD: tl.constexpr, WP: tl.constexpr, RP: tl.constexpr, CP: tl.constexpr,
                 PDL: tl.constexpr, CG: tl.constexpr, QMODE: tl.constexpr, SRC: tl.constexpr,
                 cnt_ptr=None, target=0):
    """The ``d ev`` partial sums of token program ``pid`` (p * C + i), column block ``cb``
    (``cnt_ptr``, ``target``: a queue walk item's wait, ``counts._depend``)."""
    _grid_dependency(PDL == 1)
    E: tl.constexpr = W + R
    p, i, b, base, cols, cm = _token_program_at(pid, cb, NC, c, hd, C, E, BD)
    po = ((cb * NB + p * NCW + c % NCW).to(tl.int64) * C + i) * E
    # early loads: the slots (Phase 1's) and dy (the call's)
    w, r = tl.arange(0, WP), tl.arange(0, RP)
    slw = tl.load(slot_ptr + base + w, mask=w < W, other=-1)
    slr = tl.load(slot_ptr + base + W + r, mask=r < R, other=-1)
    tg = c * C + i
    dyt = tl.load(dy_ptr + (p.to(tl.int64) * T + tg) * hd + cols, mask=cm & (tg < T),
                  other=0.0).to(tl.float32)
    _grid_dependency(PDL == 2)
    # PDL == 3: the chunk-start rows (the restore launch four back; with SRC nothing the
    # walk writes) load before the wait,
    # through L2, and the read entries' partials need nothing of the launch before
    rw = _start_rows(work_ptr, log_ptr, scale_ptr, src_ptr, base, slw, cols, cm, hd, width, W, WP,
                     QMODE, SRC, CG)
    rr = _start_rows(work_ptr, log_ptr, scale_ptr, src_ptr, base + W, slr, cols, cm, hd, width,
                     R, RP, QMODE, SRC, CG)
    _dev_half(rr, pe_ptr, po + W, dyt, R, RP)
    _depend(PDL == 3, cnt_ptr, target)
    dr0 = tl.load(dr_ptr + (p.to(tl.int64) * CP + i) * hd + cols, mask=cm, other=0.0)
    _dev_half(rw, pe_ptr, po, dr0, W, WP)


@triton.jit
def _group_step_tile(dB_ptr, g_tok_ptr, g_ev_ptr, dr_ptr, dy_ptr, gb, pos, sl, ln, nw, dec, p, pb,
                     c, T, hd, sc, C: tl.constexpr, BD: tl.constexpr, KW: tl.constexpr,
                     CP: tl.constexpr, CL: tl.constexpr, CG: tl.constexpr, PDL: tl.constexpr,
                     cnt_ptr, target):
    """A dB tile's first ``KW`` members (Phase 1's: early loads), then ``_group_cols`` in
    this program's ``CL`` column blocks, one after the other (nothing for an empty tile)."""
    tf, wt, mk, isw = _group_members(g_tok_ptr, g_ev_ptr, gb, pos, sl, ln, nw, KW)
    _depend(PDL == 2, cnt_ptr, target)
    if tl.max(sl, axis=0) >= 0:
        for j in tl.static_range(CL):
            cols, cm, scr_dr = _column_block(dr_ptr, p, pb, j, sc, hd, BD, CP, CL)
            _group_cols(dB_ptr, g_tok_ptr, g_ev_ptr, scr_dr, dy_ptr, gb, pos, sl, ln, nw, dec,
                        tf, wt, mk, isw, p, c, T, hd, cols, cm, sc, C, KW, hd, CG)


@triton.jit
def _one_offsets(sl, cb, sc, hd, BD: tl.constexpr):
    """The offsets and mask of a one-member tile's dB rows in column block ``cb``, and its
    columns. Made apart from the rows' loads: the mutation analysis of a traced launch
    follows a store's offsets back through the calls that made them and counts every
    pointer those calls were handed as written (``_one_rows``'s ``dy``, an input that
    Inductor would then copy before the launch)."""
    cols = cb * BD + sc
    cm = cols < hd
    ro = sl.to(tl.int64)[:, None] * hd + cols[None, :]
    wm = (sl >= 0)[:, None] & cm[None, :]
    return ro, wm, cols


@triton.jit
def _one_rows(dB_ptr, dr_ptr, dy_ptr, ro, wm, cols, tf, isw, p, c, T, hd, C: tl.constexpr,
              CP: tl.constexpr, CG: tl.constexpr):
    """A one-member tile's old dB rows and member vectors (``d r0`` of a write member, ``dy``
    of a read member) at ``_one_offsets``, as ``_group_cols`` loads them."""
    old = tl.load(dB_ptr + ro, mask=wm, other=0.0, cache_modifier=CG)
    dr = tl.load(dr_ptr + p.to(tl.int64) * CP * hd + tf[:, None] * hd + cols[None, :],
                 mask=wm & isw[:, None], other=0.0, cache_modifier=CG)
    fg = c * C + tf
    dyf = tl.load(dy_ptr + (p.to(tl.int64) * T + fg)[:, None] * hd + cols[None, :],
                  mask=wm & ((~isw) & (fg < T))[:, None], other=0.0).to(tl.float32)
    return old, dr + dyf


@triton.jit
def _one_store(dB_ptr, ro, wm, old, vec, dec, wt):
    """``_group_cols``' new dB rows for groups of one member: the same terms, in its order."""
    new = dec[:, None] * old.to(tl.float32) + wt[:, None] * vec
    tl.store(dB_ptr + ro, new.to(dB_ptr.dtype.element_ty), mask=wm)


@triton.jit
def _one_tile(dB_ptr, dr_ptr, dy_ptr, sl, nw, dec, tf, wt, p, pb, c, T, hd, sc, C: tl.constexpr,
              BD: tl.constexpr, CP: tl.constexpr, CL: tl.constexpr, CG: tl.constexpr,
              PDL: tl.constexpr, cnt_ptr, target):
    """A tile of groups of one member (``CL`` <= 3), whose token ``tf`` and
    weight ``wt`` came with the headers (``Groups.tok0`` / ``ev0``: no dependent round trip
    through ``pos``): every column block's loads first, then the stores. ``_group_cols``
    runs the blocks one after the other: the compiler cannot move a block's loads of ``dB``
    above the stores of the block before (they may alias), so a program made ``CL`` round
    trips to memory; here it makes one."""
    tl.static_assert(CL <= 3)
    isw = nw > 0
    _depend(PDL == 2, cnt_ptr, target)
    if tl.max(sl, axis=0) >= 0:
        cb = pb * CL
        ro0, wm0, cols0 = _one_offsets(sl, cb, sc, hd, BD)
        old0, v0 = _one_rows(dB_ptr, dr_ptr, dy_ptr, ro0, wm0, cols0, tf, isw, p, c, T, hd, C,
                             CP, CG)
        if CL > 1:
            ro1, wm1, cols1 = _one_offsets(sl, cb + 1, sc, hd, BD)
            old1, v1 = _one_rows(dB_ptr, dr_ptr, dy_ptr, ro1, wm1, cols1, tf, isw, p, c, T, hd,
                                 C, CP, CG)
        if CL > 2:
            ro2, wm2, cols2 = _one_offsets(sl, cb + 2, sc, hd, BD)
            old2, v2 = _one_rows(dB_ptr, dr_ptr, dy_ptr, ro2, wm2, cols2, tf, isw, p, c, T, hd,
                                 C, CP, CG)
        _one_store(dB_ptr, ro0, wm0, old0, v0, dec, wt)
        if CL > 1:
            _one_store(dB_ptr, ro1, wm1, old1, v1, dec, wt)
        if CL > 2:
            _one_store(dB_ptr, ro2, wm2, old2, v2, dec, wt)


@triton.jit
def _group_program(pid, pb, dB_ptr, g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr,
                   g_tok_ptr, g_ev_ptr, g_tok0_ptr, g_ev0_ptr, dr_ptr, dy_ptr, c, T, hd, NC,
                   C: tl.constexpr, E: tl.constexpr, BD: tl.constexpr, NG: tl.constexpr,
                   KW: tl.constexpr, CP: tl.constexpr, PDL: tl.constexpr, CL: tl.constexpr,
                   CG: tl.constexpr, cnt_ptr=None, target=0):
    """dB of the tile of ``NG`` groups (``phase1.Groups``) of program ``pid`` (p * NGT +
    tile), in ``CL`` column blocks of ``BD`` from ``pb * CL``: the tile's headers load once
    for all of them (the work is bound by instruction issue, and the headers' loads, masks
    and offsets were most of a program's instructions at one block per program). The
    headers are split (``headers.entry_groups``): tiles past a segment's last group skip
    the blocks, and a tile whose groups all have one member (most of them) takes the
    members that came with the headers, never a second member's loads or the loop over
    longer groups, and loads all its column blocks before storing any (``_one_tile``).
    With ``PDL == 2`` it waits after its headers and members."""
    _grid_dependency(PDL == 1)
    NGT: tl.constexpr = (C * E + NG - 1) // NG
    p = pid // NGT
    f0 = (pid % NGT) * NG
    sc = tl.arange(0, BD)
    gb = (p * NC + c).to(tl.int64) * C * E
    pos, sl, ln, nw, dec = _group_headers(g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr,
                                          gb, f0, C * E, NG)
    # the first members with the headers (one round trip for all of them)
    gi = f0 + tl.arange(0, NG)
    tf0 = tl.load(g_tok0_ptr + gb + gi, mask=gi < C * E, other=0)
    wt0 = tl.load(g_ev0_ptr + gb + gi, mask=gi < C * E, other=0.0)
    if tl.max(ln, axis=0) <= 1:
        if CL <= 3:
            _one_tile(dB_ptr, dr_ptr, dy_ptr, sl, nw, dec, tf0, wt0, p, pb, c, T, hd, sc, C,
                      BD, CP, CL, CG, PDL, cnt_ptr, target)
        else:
            _group_step_tile(dB_ptr, g_tok_ptr, g_ev_ptr, dr_ptr, dy_ptr, gb, pos, sl, ln,
                             nw, dec, p, pb, c, T, hd, sc, C, BD, 1, CP, CL, CG, PDL, cnt_ptr,
                             target)
    else:
        _group_step_tile(dB_ptr, g_tok_ptr, g_ev_ptr, dr_ptr, dy_ptr, gb, pos, sl, ln, nw,
                         dec, p, pb, c, T, hd, sc, C, BD, KW, CP, CL, CG, PDL, cnt_ptr, target)


@triton.jit(do_not_specialize=["c", "T", "NC", "NB", "NCW"])
def _step_bwd_dev_group_kernel(work_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, pe_ptr, dB_ptr,
                               g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr, g_tok_ptr,
                               g_ev_ptr, g_tok0_ptr, g_ev0_ptr, dr_ptr, dy_ptr, c, T, hd,
                               width, NC, NB, NCW, C: tl.constexpr, W: tl.constexpr,
                               R: tl.constexpr, BD: tl.constexpr, WP: tl.constexpr,
                               RP: tl.constexpr, CP: tl.constexpr, NCB: tl.constexpr,
                               BDG: tl.constexpr, NG: tl.constexpr, KW: tl.constexpr,
                               CL: tl.constexpr, NCBG: tl.constexpr, ND: tl.constexpr,
                               NGP: tl.constexpr, PDL: tl.constexpr, PDLG: tl.constexpr,
                               CG: tl.constexpr = "",
                               QMODE: tl.constexpr = 0, SRC: tl.constexpr = False):
    """The ``d ev`` and dB work of a chunk step as one grid: both need only ``d r0`` of the
    product launch before them and neither reads what the other writes. As two launches
    the dB programs could start only once every ``d ev`` program had started, so they
    shared the SMs for the last wave of ``d ev`` alone (1.2-2 % slower overall). Here the
    grid's programs alternate in periods of ``ND`` ``d ev`` programs (a ``(P * C, NCB)``
    grid in its order) and ``NGP`` dB programs (a ``(P * NGT, NCBG)`` grid), so both kinds
    are resident together from the start. Every program waits for the product launch
    (the dB programs after their headers). ``PDLG``: the dB programs' ``PDL`` (2 where
    the launch's is 3: they wait)."""
    L = tl.program_id(0)
    q = L // (ND + NGP)
    r = L % (ND + NGP)
    if r < ND:
        k = q * ND + r
        _dev_program(k // NCB, k % NCB, work_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, dr_ptr,
                     dy_ptr, pe_ptr, c, T, hd, width, NC, NB, NCW, C, W, R, BD, WP, RP, CP, PDL,
                     CG, QMODE, SRC)
    else:
        k = q * NGP + r - ND
        _group_program(k // NCBG, k % NCBG, dB_ptr, g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr,
                       g_pos_ptr, g_tok_ptr, g_ev_ptr, g_tok0_ptr, g_ev0_ptr, dr_ptr, dy_ptr, c, T,
                       hd, NC, C, W + R, BDG, NG, KW, CP, PDLG, CL, CG)


@triton.jit(do_not_specialize=["NB", "blk_s", "src_p", "dst_p", "dst_0", "n"])
def _window_sum_kernel(src_ptr, dst_ptr, NB, blk_s, src_p, dst_p, dst_0, n, C: tl.constexpr,
                       TRI: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """Stream ``p``'s (program axis 1) cross-column sums of a window: ``dst[p * dst_p +
    dst_0 + i] = sum_j src[j * blk_s + p * src_p + i]`` for ``i < n``, over the ``NB``
    column blocks ``j`` in tiles of ``ROWS``, the tiles in order (a fixed order:
    deterministic). ``TRI``: the elements are ``[C, C]`` matrices whose upper triangle is
    zero (dQK, dL), which the product launch does not store and this one does not read:
    its sums there are zeros."""
    p = tl.program_id(1)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    if TRI:
        lm = m & (i % C <= (i // C) % C)
    else:
        lm = m
    j = tl.arange(0, ROWS)
    src = src_ptr + p.to(tl.int64) * src_p + i
    acc = tl.zeros([BLOCK], tl.float32)
    j0 = 0
    while j0 < NB:   # (a runtime bound: a while loop, which the interpreter runs too)
        jj = j0 + j
        x = tl.load(src[None, :] + jj.to(tl.int64)[:, None] * blk_s,
                    mask=(jj < NB)[:, None] & lm[None, :], other=0.0)
        acc += tl.sum(x, axis=0)
        j0 += ROWS
    tl.store(dst_ptr + p.to(tl.int64) * dst_p + dst_0 + i, acc, mask=m)


# ``_window_sum_kernel``: elements per program, column blocks per load tile
SUM_BLOCK = 512
SUM_ROWS = 8


def partial_buffers(P: int, NC: int, rows: int, C: int, W: int, E: int, nb_ev: int, nb_w: int,
                    nb_mix: int, device) -> tuple[dict, dict]:
    """The cross-column partial sums of a reverse walk, ``[blocks, rows, C, n]`` per key
    (``nb_ev`` column blocks of the ``d ev`` programs, ``nb_w`` of the Dw programs, ``nb_mix``
    slices of the products; ``rows`` per block: a window of chunks per stream), and their
    sums over the column blocks, ``[P * NC, C, n]`` (``window_sums``; no dimension of
    ``NC`` alone: a traced call would guard on its being 1, and recompile when a length
    first passes ``C``)."""
    f32 = dict(dtype=torch.float32, device=device)
    widths = dict(ev=(nb_ev, E), coef=(nb_w, W), m=(nb_w, W), b=(nb_mix, 1), qk=(nb_mix, C),
                  L=(nb_mix, C))
    parts = {k: torch.empty(nb, rows, C, n, **f32) for k, (nb, n) in widths.items()}
    sums = {k: torch.empty(P * NC, C, n, **f32) for k, (_, n) in widths.items()}
    return parts, sums


def group_args(gr) -> tuple:
    """The entry groups' arrays (``phase1.Groups``) in the dB programs' argument order."""
    return (gr.slot, gr.length, gr.n_w, gr.decay, gr.pos, gr.tok, gr.ev, gr.tok0, gr.ev0)


def window_sums(parts: dict, sums: dict, P: int, NC: int, c_lo: int, n: int, NCW: int,
                C: int):
    """``sums[k]`` (``[P * NC, C, w]``) at chunks ``c_lo:c_lo + n`` of every stream =
    ``parts[k]``'s first ``n`` chunk rows per stream summed over the column blocks (dim 0),
    one launch per key: a fixed order of the sum, and the zero upper triangles of the
    dQK / dL partials (keys ``qk``, ``L``) not read."""
    for k, x in parts.items():
        nb = x.shape[0]
        L1 = x[0, 0].numel()                 # one chunk's elements
        # x: [nb, P * NCW, C, w]: stream p's window rows start at p * NCW * L1, its first n
        # are summed; sums[k]: stream p's chunks from p * NC * L1, the window's from c_lo on
        count = n * L1
        launch(_window_sum_kernel, (-(-count // SUM_BLOCK), P), x, sums[k], nb, P * NCW * L1,
               NCW * L1, NC * L1, c_lo * L1, count, C=C, TRI=k in ("qk", "L"), BLOCK=SUM_BLOCK,
               ROWS=SUM_ROWS, num_warps=4)


def step_reverse(dB, work, log, scales, width: int, pl, gr, v, dy, dv, qmode: int, prec: str,
                 config: dict, vmr_kept=None, sources=None) -> dict:
    """The chunks in reverse, six launches each; advances ``dB`` (the bank gradient) and
    ``work`` (the bank, back to its initial state) in place, writes ``dv``, and returns the
    cross-column sums of the pass, ``[B, C, n]`` each (keys as ``backward.backward``'s).
    With ``vmr_kept`` (the forward's ``v - r0``, ``[NC * P, CP, hd]``) there is no gather
    launch: five launches per chunk. With ``sources`` (``sources.chunk_start_sources``)
    ``work`` is the final bank, which stays as it is: the chunk-start rows come from it and
    the log, and there is no restore launch.

    The partial sums hold a window of ``NCW`` chunks per stream (``BWD_WINDOWS`` windows,
    the last chunks first), reduced over the column blocks after each window, so their
    memory is a fraction of the whole sequence's (the row of chunk c is ``c % NCW``)."""
    P, C, W, R, NC = pl.P, pl.C, pl.W, pl.R, pl.NC
    E, T = W + R, pl.T
    hd = dB.shape[1]
    CP = pow2(C)
    # the products' whole rows at once (host.CONFIG, MIX_ROWS_B)
    rows = bool(config.get("MIX_ROWS_B", 0)) and CP <= ROWS_MAX_CP
    # their slices: MB_MIX_B columns x TB_MIX_B tokens with whole rows, *_WIDE in blocks
    wide = "" if rows else "_WIDE"
    TB = min(config["TB_MIX_B" + wide], CP)
    BD, BDW, NG = config["BD_STEP_B"], config["BD_STEP_W"], config["NG_STEP"]
    MB = config["MB_MIX_B" + wide]
    BDD = BD
    NCB, NCBW, NMB, NCBD = -(-hd // BD), -(-hd // BDW), -(-hd // MB), -(-hd // BDD)
    NCW = -(-NC // max(1, config["BWD_WINDOWS"]))
    NBW = P * NCW
    f32 = dict(dtype=torch.float32, device=dB.device)
    delta, ddelta, dr = (torch.empty(P, CP, hd, **f32) for _ in range(3))
    vmr = torch.empty(P, CP, hd, **f32) if vmr_kept is None else vmr_kept
    vmr_cs = 0 if vmr_kept is None else P * CP * hd   # elements between two chunks' blocks
    parts, sums = partial_buffers(P, NC, NBW, C, W, E, NCB, NCBD, NMB, dB.device)
    wg, ww = config["WARPS_STEP_B"], config["WARPS_STEP_W"]
    g_rows, g_mix = (P * C, NCB), (P * (CP // TB), NMB)
    pd = pdl(config, dB)
    if pd["PDL"] == 3 and C > config["PDL3_MAX_C"]:
        pd["PDL"] = 2   # measured slower at C = 256 (host.CONFIG's note)
    cg = ".cg" if pd["PDL"] == 3 else ""   # PDL == 3: early loads of the walk's own rows
    src = sources is not None
    # the chunk-start rows: from the restored working bank, or (src) the final bank and log
    rows0 = (work, log, scales, sources if src else pl.slot)
    steps = [
        *([] if src else [Relaunch(
            _step_restore_kernel, (P * -(-C * W // NG), NCBW), "c", work, log, scales,
            pl.runs.slot, 0, P, hd, width, NC, C=C, W=W, BD=BDW, NG=NG, QMODE=qmode,
            num_warps=ww, num_stages=1, **pd)]),
        # v - r0: gathered here unless the forward kept it. The forward gather's warps:
        # the sum over a token's entries then runs in the same order, so the gradients
        # are bitwise those of a kept v - r0 (with BD_STEP_B == BD_STEP, the defaults)
        *([] if vmr_kept is not None else [Relaunch(
            _step_bwd_gather_kernel, g_rows, "c", *rows0, pl.slot, pl.ev, v, vmr, 0, T, hd,
            width, NC, C=C, W=W, R=R, BD=BD, WP=pow2(W), CP=CP,
            QMODE=qmode, SRC=src, num_warps=config["WARPS_STEP"], num_stages=1, **pd)]),
        Relaunch(_step_bwd_mix1_kernel, g_mix, "c", pl.X, pl.QK, pl.beta, vmr, dy, delta, ddelta,
                 0, T, hd, NC, vmr_cs, C=C, MB=MB, TB=TB, CP=CP, PREC=prec, num_warps=config["WARPS_MIX_B"],
                 num_stages=1, ROWS=rows, **pd),
        Relaunch(_step_bwd_dw_kernel, (P * C, NCBD), "c", dB, *rows0, pl.slot, pl.coef, delta,
                 ddelta, parts["coef"], parts["m"], 0, hd, width, NC, NBW, NCW, C=C, W=W, R=R,
                 BD=BDD, WP=pow2(W), CP=CP, CG=cg, QMODE=qmode, SRC=src,
                 num_warps=wg, num_stages=1, **pd),
        Relaunch(_step_bwd_mix2_kernel, g_mix, "c", pl.X, pl.beta, vmr, delta, ddelta, dr, dy,
                 dv, parts["qk"], parts["L"], parts["b"], 0, T, hd, NC, NBW, NCW, vmr_cs, C=C, MB=MB,
                 TB=TB, CP=CP, PREC=prec, num_warps=config["WARPS_MIX_B"], num_stages=1,
                 ROWS=rows, **pd),
        *_dev_and_groups(config, pd, P, C, W, R, hd, CP, NC, NBW, NCW, width, qmode, src, cg,
                         rows0, pl, gr, dB, dr, dy, parts["ev"]),
    ]
    for c_lo in range(NCW * ((NC - 1) // NCW), -1, -NCW):   # windows, the last first
        n = min(NCW, NC - c_lo)
        def body(c_lo=c_lo, n=n):
            for c in range(c_lo + n - 1, c_lo - 1, -1):   # kernel boundaries order everything
                for step in steps:
                    step(c)

        # the same launches as an earlier call: replayed from its CUDA graph (graphs.py)
        graphs.run(("reverse", c_lo, n, tuple(s.key for s in steps)), body, dB.device,
                   config.get("WALK_GRAPHS", 0))
        # cross-column sums of the window, in a fixed order, straight into their slice
        window_sums(parts, sums, P, NC, c_lo, n, NCW, C)
    return sums


def _dev_and_groups(config, pd, P, C, W, R, hd, CP, NC, NBW, NCW, width, qmode, src, cg, rows0,
                    pl, gr, dB, dr, dy, pe) -> list:
    """A chunk step's ``d ev`` and dB launch (``_step_bwd_dev_group_kernel``): its programs
    in periods of the two kinds' grid sizes over their greatest common divisor (at A and
    B, C = 128: 3 ``d ev`` and 8 dB programs)."""
    E, BD = W + R, config["BD_STEP_B"]
    BDG, NGG = config["BD_GROUP"], config["NG_GROUP"]
    CLG = min(config["CL_GROUP"], -(-hd // BDG))   # column blocks per dB program
    NCB, NCBG, NGT = -(-hd // BD), -(-hd // (BDG * CLG)), -(-C * E // NGG)
    dev = dict(C=C, W=W, R=R, BD=BD, WP=pow2(W), RP=pow2(R), CP=CP, CG=cg, QMODE=qmode, SRC=src)
    grp = dict(NG=NGG, KW=config["KW_GROUP"], CL=CLG)
    groups = group_args(gr)
    n_dev, n_grp = P * C * NCB, P * NGT * NCBG
    period = math.gcd(n_dev, n_grp)
    return [Relaunch(
        _step_bwd_dev_group_kernel, (n_dev + n_grp,), "c", *rows0, pl.slot, pe, dB, *groups,
        dr, dy, 0, pl.T, hd, width, NC, NBW, NCW, NCB=NCB, BDG=BDG, NCBG=NCBG,
        ND=n_dev // period, NGP=n_grp // period, num_warps=config["WARPS_DEV_DB"],
        num_stages=1, **dev, **grp, **pd, PDLG=min(pd["PDL"], 2),
        **({"maxnreg": config["MAXNREG_DEV_DB"]} if config["MAXNREG_DEV_DB"] else {}))]
