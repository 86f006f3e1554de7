"""Phase 2 of the chunked form: the sequential walk over the chunks, in one launch (the
column walk: what calls of the small shapes of ``launch.column_suits`` launch, eager or
traced; otherwise eager calls take ``step_walk``'s launches per chunk, traced calls
``queue_walk``).

Every quantity of Phase 2 is separable by bank column (docs/spec.md section 3), so one
program owns (stream ``p``, column block ``cb``) and walks all chunks of its stream
inside the kernel (a runtime loop: a new ``T`` needs no new compilation). Per chunk:

- pass A: gather the chunk-start rows of all entries (writes and reads in one stream of
  tiles, the next tile's slots loaded before the current rows are used, so two
  dependent latencies overlap): ``r0``, ``inter``, ``u = beta (v - r0)``;
- pass B: ``delta = X u`` and ``y = inter + QKX u`` (small matmuls over the chunk's
  tokens; both matrices are lower triangular: only blocks on or below the diagonal);
- pass C: each distinct written slot is written once, by the lane that owns its run
  in the slot-sorted write order (``phase1.Runs``): ``exp(gend) M0[s] + sum_j coef_j
  delta_j``, summed in the run's fixed order (deterministic, no atomics).

``u``, ``inter`` and ``delta`` go through a per-program scratch (L1/L2 resident)
because a lane needs other lanes' tokens; ``tl.debug_barrier`` orders the passes. A program's rows are
touched by no other program (streams own disjoint slots), so the walk needs no
inter-program synchronisation. With ``SAVE`` pass C also stores the old (chunk-start)
value of each row it writes into the undo log (``quant.UndoLog``), at its run's start:
what the backward needs besides the final bank, at no extra gather.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..common.tiles import _write_head, _write_tile, row_length
from ..runtime.launch import launch, multiple_of_16, pow2


@triton.jit
def _entry_tile(slot_ptr, w_ptr, seg, toks, tm, e0, E: tl.constexpr, EW: tl.constexpr):
    """(slots, weights) [TB, EW] of entries [e0, e0 + EW) of tokens ``toks``."""
    ents = e0 + tl.arange(0, EW)
    em = tm[:, None] & (ents < E)[None, :]
    off = seg + toks[:, None] * E + ents[None, :]
    return tl.load(slot_ptr + off, mask=em, other=-1), tl.load(w_ptr + off, mask=em, other=0.0)


@triton.jit
def _accumulate(rows, wt, ents, r0, inter, W: tl.constexpr):
    """Add a gathered tile [TB, EW, BD] into r0 (write entries) and inter (read entries)."""
    x = wt[:, :, None] * rows.to(tl.float32)
    is_w = (ents < W)[None, :, None]
    r0 += tl.sum(tl.where(is_w, x, 0.0), axis=1)
    inter += tl.sum(tl.where(is_w, 0.0, x), axis=1)
    return r0, inter


@triton.jit(do_not_specialize=["P", "T", "NC"])
def _forward_kernel(bank_ptr, slot_ptr, ev_ptr, X_ptr, QKX_ptr, v_ptr, beta_ptr, out_ptr,
                    run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr, run_coef_ptr,
                    scratch_ptr, log_ptr, P, T, hd, NC,
                    C: tl.constexpr, W: tl.constexpr, R: tl.constexpr, BD: tl.constexpr,
                    TB: tl.constexpr, EW: tl.constexpr, NG: tl.constexpr, CP: tl.constexpr,
                    SAVE: tl.constexpr, PREC: tl.constexpr, HD16: tl.constexpr,
                    KW: tl.constexpr = 1):
    # The gather is pipelined by hand: the rows of the next tile are in flight while this
    # tile's are reduced, the slots two tiles ahead. KW: run members gathered with the run
    # header in the write pass, whose next tile's headers load while this tile's rows are
    # gathered.
    hd = row_length(hd, HD16)
    p = tl.program_id(0)
    cb = tl.program_id(1)
    E: tl.constexpr = W + R
    cols = cb * BD + tl.arange(0, BD)
    cm = cols < hd
    sc = tl.arange(0, BD)
    scr_u = scratch_ptr + (p * tl.num_programs(1) + cb).to(tl.int64) * (3 * CP * BD)
    scr_i = scr_u + CP * BD
    scr_d = scr_u + 2 * CP * BD
    c = 0
    while c < NC:  # runtime trip count: one compile for every T
        b = p * NC + c
        seg = b.to(tl.int64) * C * E
        # pass A: r0 and inter from the chunk-start rows; u = beta (v - r0)
        for t0 in range(0, C, TB):
            toks = t0 + tl.arange(0, TB)
            tm = toks < C
            r0 = tl.zeros([TB, BD], tl.float32)
            inter = tl.zeros([TB, BD], tl.float32)
            # two tiles in flight: the next tile's rows load before this tile's are
            # reduced, the slots of the tile after it before those rows are used
            sl, wt = _entry_tile(slot_ptr, ev_ptr, seg, toks, tm, 0, E, EW)
            rows = tl.load(bank_ptr + sl.to(tl.int64)[:, :, None] * hd + cols[None, None, :],
                           mask=(sl >= 0)[:, :, None] & cm[None, None, :], other=0.0)
            sl_n, wt_n = _entry_tile(slot_ptr, ev_ptr, seg, toks, tm, EW, E, EW)
            for e0 in range(0, E, EW):
                ents = e0 + tl.arange(0, EW)
                rows_n = tl.load(bank_ptr + sl_n.to(tl.int64)[:, :, None] * hd + cols[None, None, :],
                                 mask=(sl_n >= 0)[:, :, None] & cm[None, None, :], other=0.0)
                w_cur = wt
                wt = wt_n
                sl_n, wt_n = _entry_tile(slot_ptr, ev_ptr, seg, toks, tm, e0 + 2 * EW, E, EW)
                r0, inter = _accumulate(rows, w_cur, ents, r0, inter, W)
                rows = rows_n
            tg = c * C + toks
            tv = tm & (tg < T)
            vv = tl.load(v_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
                         mask=tv[:, None] & cm[None, :], other=0.0).to(tl.float32)
            bt = tl.load(beta_ptr + b.to(tl.int64) * C + toks, mask=tm, other=0.0)
            tl.store(scr_u + toks[:, None] * BD + sc[None, :], bt[:, None] * (vv - r0),
                     mask=tm[:, None])
            tl.store(scr_i + toks[:, None] * BD + sc[None, :], inter, mask=tm[:, None])
        tl.debug_barrier()
        # pass B: deltas and readings
        for t0 in range(0, C, TB):
            toks = t0 + tl.arange(0, TB)
            tm = toks < C
            y = tl.load(scr_i + toks[:, None] * BD + sc[None, :], mask=tm[:, None], other=0.0)
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
        # pass C: each distinct written slot once, by the lane owning its run
        rb = b.to(tl.int64) * C * W
        lb = (c * P + p).to(tl.int64) * C * W   # the undo log is chunk-major
        sl, ln, dec, tk, cf = _write_head(run_slot_ptr, run_len_ptr, run_decay_ptr,
                                          run_tok_ptr, run_coef_ptr, rb, 0, C * W, NG, KW)
        for f0 in range(0, C * W, NG):
            # the next tile's headers are in flight while this tile gathers
            sl_n, ln_n, dec_n, tk_n, cf_n = _write_head(
                run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr, run_coef_ptr, rb,
                f0 + NG, C * W, NG, KW)
            _write_tile(bank_ptr, run_tok_ptr, run_coef_ptr, scr_d, rb, f0, sl, ln, dec, tk,
                        cf, cols, cm, sc, hd, log_ptr, lb, NG, KW, BD, SAVE, BD)
            sl, ln, dec, tk, cf = sl_n, ln_n, dec_n, tk_n, cf_n
        tl.debug_barrier()
        c += 1


def column_walk(bank: Tensor, pl, v: Tensor, out: Tensor, saved: Tensor, save: bool,
                config: dict, prec: str):
    """The column walk of plan ``pl``: one launch, one program per (stream, column block);
    advances ``bank``, writes the readings to ``out`` and with ``save`` the undo log to
    ``saved``."""
    P, T, W, R, C = pl.P, pl.T, pl.W, pl.R, pl.C
    hd = bank.shape[1]
    BD, CP = config["BD"], pow2(C)
    NCB = -(-hd // BD)
    scratch = torch.empty(P * NCB * 3 * CP * BD, dtype=torch.float32, device=bank.device)
    ru = pl.runs
    launch(_forward_kernel, (P, NCB), bank, pl.slot, pl.ev, pl.X, pl.QKX, v, pl.beta, out,
           ru.slot, ru.length, ru.decay, ru.tok, ru.coef, scratch, saved, P, T, hd,
           pl.NC, C=C, W=W, R=R, BD=BD,
           TB=min(config["TB"], CP), EW=config["EW"], NG=config["NG"], CP=CP,
           SAVE=save, PREC=prec, HD16=multiple_of_16(hd), KW=config["KW"],
           num_warps=config["WARPS"])

