"""Phase 2 in one launch whose programs take the step walk's work items from a queue (the
queue walk: what traced calls launch for the chunked forward, except the small shapes of
``launch.column_suits``).

The step walk (``step_walk.py``) spreads each chunk step over the whole GPU in three
launches, and kernel boundaries order them; its host loop over the chunks cannot live in a
graph that serves every ``T``. Here the same three kinds of items run inside one launch:

- gather (stream, ``KG`` tokens, column block): the tokens' chunk-start row segments, ``u``
  and ``inter`` (the step walk's gather launch, one token per warp);
- mix (stream, token block, column slice): ``delta = X u`` and the readings;
- write (stream, tile of write positions, column block): each distinct written row once,
  the old row to the undo log with ``SAVE``.

Phase 2 is separable by stream and column, so a *group* (stream ``p``, column block
``cb`` of ``BD`` columns) depends only on itself: its mix items of chunk ``c`` need its
gather items of ``c``, its write items its mix items, its gather items of ``c + 1`` its
write items of ``c``. Each group counts its finished items per kind; an item waits until
its group's count says what it needs is done (an acquire of the count, after the finished
items' release), so different groups, and different kinds of one group, run side by side.

Items are handed out by one ticket counter in an order where every item's dependencies
have smaller tickets (chunk, then kind, then group, then item). A program waits
only for items of smaller tickets, all taken by programs that are already running and
that themselves wait only for smaller tickets: the walk cannot deadlock, whatever the
grid size and however many programs are resident (the interpreter runs one program at a
time, which then takes every ticket in order). No float atomics: every output element has
one writer and sums run in a fixed order, so results are bitwise reproducible. They equal
the step walk's up to rounding order: a gather sums a token's rows ``ES`` at a time, the
step walk's launch in one tile.

The walk takes 1.03x (A) and 0.98x (B) the step walk's no-grad time (H100); tickets, waits
and counts cost little (docs/performance.md, "Traced walks").
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..common.counts import LINE, _await_count, _finish
from ..common.tiles import ROWS_MAX_CP, _write_head, _write_tile, row_length
from ..runtime.launch import launch_capped, multiple_of_16, pow2
from .step_walk import _mix_block, _mix_rows_load, _mix_rows_products, step_buffers

@triton.jit
def _token_index(slot_ptr, ev_ptr, base, r: tl.constexpr, n: tl.constexpr, E: tl.constexpr,
                 KG: tl.constexpr, ES: tl.constexpr):
    """Slots and weights of entries ``[r, r + ES)`` of ``KG`` tokens (``_token_sums``'s
    layout): Phase 1's arrays, which nothing in the walk writes, so an item loads its
    first step's before its wait."""
    tk = tl.arange(0, KG)
    es = tl.arange(0, ES)
    em = (r + es) < n
    at = base + tk[:, None] * E + r + es[None, :]
    return (tl.load(slot_ptr + at, mask=em[None, :], other=-1),
            tl.load(ev_ptr + at, mask=em[None, :], other=0.0))


@triton.jit
def _token_sums(bank_ptr, slot_ptr, ev_ptr, base, sl, wt, n: tl.constexpr, E: tl.constexpr,
                KG: tl.constexpr, ES: tl.constexpr, cols, cm, hd):
    """``sum_e wt_e M0[sl_e, cols]`` over ``n`` entries of ``KG`` tokens at once, whose
    entries start ``E`` apart from ``base``, taking ``ES`` entries of each token per step;
    ``sl``, ``wt``: the first step's slots and weights (``_token_index``, loaded before the
    wait), and each step loads the next step's before its own rows. The ``[KG, ES, BD]``
    tile puts the tokens on the warps, so each warp sums its token's rows in registers as
    they arrive and nothing meets in shared memory until the last step (a ``[W, BD]`` tile
    per token spreads its rows over the warps, and each token's loads then drain before the
    next token's start)."""
    acc = tl.zeros([KG, ES, cols.shape[0]], tl.float32)
    for r in tl.static_range(0, n, ES):
        if r + ES < n:
            sl_n, wt_n = _token_index(slot_ptr, ev_ptr, base, r + ES, n, E, KG, ES)
        rows = tl.load(bank_ptr + sl.to(tl.int64)[:, :, None] * hd + cols[None, None, :],
                       mask=(sl >= 0)[:, :, None] & cm[None, None, :], other=0.0)
        acc += wt[:, :, None] * rows.to(tl.float32)
        if r + ES < n:
            sl, wt = sl_n, wt_n
    return tl.sum(acc, axis=1)


# Each kind of item is its own function (not inlined), so the launch's register cap
# (MAXNREG_QUEUE) binds the largest item alone: inlined, the persistent loop keeps all three
# kinds' values live and needs 255 registers; non-inlined and capped at 168, bf16 fits 3
# programs per SM and Triton's bundled ptxas (CUDA 12.8) spills 12 bytes. The ptxas that
# torch ships (CUDA 13.0) spills 240 bytes of the no-grad form at this cap, most in the
# gather item, so Inductor's output code assembles capped kernels with Triton's ptxas too
# (lowerings/kernel_source.py; docs/performance.md, "Traced walks").


@triton.jit(noinline=True)
def _gather_item(bank_ptr, slot_ptr, ev_ptr, v_ptr, beta_ptr, u_ptr, i_ptr, keep_ptr, wdone_ptr,
                 c, p, cb, i0, P, T, hd, NC, NWB, C: tl.constexpr, W: tl.constexpr,
                 R: tl.constexpr, BD: tl.constexpr, CP: tl.constexpr, KG: tl.constexpr,
                 ES: tl.constexpr, KEEP: tl.constexpr):
    """Tokens ``[i0, i0 + KG)`` of the chunk, one per warp: their chunk-start rows, ``u``
    and ``inter``; with ``KEEP`` also ``v - r0`` into the backward's ``[NC * P, CP, hd]``
    buffer (the step walk's ``keep``)."""
    b = p * NC + c
    cols = cb * BD + tl.arange(0, BD)
    cm = cols < hd
    toks = i0 + tl.arange(0, KG)
    base = (b.to(tl.int64) * C + i0) * (W + R)
    tg = c * C + toks
    vv = tl.load(v_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
                 mask=(tg < T)[:, None] & cm[None, :], other=0.0).to(tl.float32)
    bt = tl.load(beta_ptr + b.to(tl.int64) * C + toks)
    slw, wtw = _token_index(slot_ptr, ev_ptr, base, 0, W, W + R, KG, ES)
    slr, wtr = _token_index(slot_ptr, ev_ptr, base + W, 0, R, W + R, KG, ES)
    _await_count(wdone_ptr, c * NWB)                              # chunk c - 1 written
    r0 = _token_sums(bank_ptr, slot_ptr, ev_ptr, base, slw, wtw, W, W + R, KG, ES, cols, cm, hd)
    inter = _token_sums(bank_ptr, slot_ptr, ev_ptr, base + W, slr, wtr, R, W + R, KG, ES, cols,
                        cm, hd)
    buf = (p.to(tl.int64) * CP + toks)[:, None] * hd + cols[None, :]
    tl.store(u_ptr + buf, bt[:, None] * (vv - r0), mask=cm[None, :])
    tl.store(i_ptr + buf, inter, mask=cm[None, :])
    if KEEP:
        tl.store(keep_ptr + c.to(tl.int64) * P * CP * hd + buf, vv - r0, mask=cm[None, :])


@triton.jit(noinline=True)
def _write_item(bank_ptr, d_ptr, run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr,
                run_coef_ptr, log_ptr, mdone_ptr, c, p, cb, j0, P, hd, NC, NM,
                C: tl.constexpr, W: tl.constexpr, BD: tl.constexpr, NG: tl.constexpr,
                KW: tl.constexpr, CP: tl.constexpr, SAVE: tl.constexpr, KT: tl.constexpr):
    """Write tiles ``[j0, j0 + KT)`` of the chunk's slot-sorted write positions; each tile's
    run headers load while the tile before it writes, the first's before the wait."""
    b = p * NC + c
    rb = b.to(tl.int64) * C * W
    lb = (c * P + p).to(tl.int64) * C * W   # the undo log is chunk-major
    sc = tl.arange(0, BD)
    cols = cb * BD + sc
    scr_d = d_ptr + p.to(tl.int64) * CP * hd + cb * BD
    f0 = j0 * NG
    sl, ln, dec, tk, cf = _write_head(run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr,
                                      run_coef_ptr, rb, f0, C * W, NG, KW)
    _await_count(mdone_ptr, (c + 1) * NM)                         # chunk c's deltas
    for k in range(KT):
        sl_n, ln_n, dec_n, tk_n, cf_n = _write_head(run_slot_ptr, run_len_ptr, run_decay_ptr,
                                                    run_tok_ptr, run_coef_ptr, rb, f0 + NG,
                                                    C * W, NG, KW)
        _write_tile(bank_ptr, run_tok_ptr, run_coef_ptr, scr_d, rb, f0, sl, ln, dec, tk, cf,
                    cols, cols < hd, sc, hd, log_ptr, lb, NG, KW, BD, SAVE, hd)
        sl, ln, dec, tk, cf = sl_n, ln_n, dec_n, tk_n, cf_n
        f0 += NG


@triton.jit(noinline=True)
def _mix_item(X_ptr, QKX_ptr, u_ptr, i_ptr, d_ptr, out_ptr, gdone_ptr, target, b, p, c, T, hd,
              t0, c0, C: tl.constexpr, MB: tl.constexpr, TB: tl.constexpr, CP: tl.constexpr,
              PREC: tl.constexpr, ROWS: tl.constexpr):
    """The products of token block ``t0``, columns ``[c0, c0 + MB)``, once the group's
    gathers reach ``target`` (a non-inlined function takes scalars only: the columns are
    made here). ``ROWS``: the block's rows of X and QKX loaded before the wait."""
    cols = c0 + tl.arange(0, MB)
    if ROWS:
        x, q = _mix_rows_load(X_ptr, QKX_ptr, b, t0, C, TB, CP)
        _await_count(gdone_ptr, target)
        _mix_rows_products(x, q, u_ptr, i_ptr, d_ptr, out_ptr, p, c, T, hd, t0, cols,
                           cols < hd, C, TB, CP, PREC)
    else:
        _await_count(gdone_ptr, target)
        _mix_block(X_ptr, QKX_ptr, u_ptr, i_ptr, d_ptr, out_ptr, b, p, c, T, hd, t0, cols,
                   cols < hd, C, MB, TB, CP, PREC)


@triton.jit(do_not_specialize=["P", "T", "NC", "NCB"])
def _queue_walk_kernel(bank_ptr, slot_ptr, ev_ptr, v_ptr, beta_ptr, X_ptr, QKX_ptr, out_ptr,
                       run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr, run_coef_ptr,
                       u_ptr, i_ptr, d_ptr, log_ptr, keep_ptr, sync_ptr, P, T, hd, NC, NCB,
                       C: tl.constexpr, W: tl.constexpr, R: tl.constexpr, BD: tl.constexpr,
                       CP: tl.constexpr, TB: tl.constexpr, MB: tl.constexpr, NG: tl.constexpr,
                       KW: tl.constexpr, SAVE: tl.constexpr, PREC: tl.constexpr,
                       LINE: tl.constexpr, KG: tl.constexpr, KT: tl.constexpr,
                       ES: tl.constexpr, KEEP: tl.constexpr, ROWS: tl.constexpr,
                       HD16: tl.constexpr):
    hd = row_length(hd, HD16)
    NMS: tl.constexpr = BD // MB
    NMI: tl.constexpr = (CP // TB) * NMS        # mix items per group and chunk
    NGB: tl.constexpr = C // KG                 # gather items (KG tokens each)
    NRT: tl.constexpr = (C * W + NG - 1) // NG  # write tiles
    NWB: tl.constexpr = (NRT + KT - 1) // KT    # write items (KT tiles each)
    G = P * NCB
    n_gather = G * NGB
    n_mix = G * NMI
    per_chunk = n_gather + n_mix + G * NWB
    total = NC * per_chunk
    # sync: the ticket counter, then the gather / mix / write counts of each group
    gdone = sync_ptr + LINE
    mdone = gdone + G * LINE
    wdone = mdone + G * LINE
    t = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    while t < total:
        # ticket order: chunk, then kind, then group, then item. A group's items of one
        # kind take consecutive tickets, so its first groups finish a kind while its last
        # groups still run, and their items of the next kind fill that tail instead of
        # waiting for every group (groups interleaved within a kind: 1.05x at A, 1.08x at B
        # no-grad; all kinds of a group before the next group's: 1.7x)
        c = t // per_chunk
        r = t % per_chunk
        kind = tl.where(r < n_gather, 0, tl.where(r < n_gather + n_mix, 1, 2))
        q = tl.where(r < n_gather, r, tl.where(r < n_gather + n_mix, r - n_gather,
                                                r - n_gather - n_mix))
        nk = tl.where(kind == 0, NGB, tl.where(kind == 1, NMI, NWB))   # items per group
        g = q // nk
        j = q % nk
        p = g // NCB
        if kind == 0:
            _gather_item(bank_ptr, slot_ptr, ev_ptr, v_ptr, beta_ptr, u_ptr, i_ptr, keep_ptr,
                         wdone + g * LINE, c, p, g % NCB, j * KG, P, T, hd, NC, NWB, C, W, R,
                         BD, CP, KG, ES, KEEP)
            _finish(gdone + g * LINE)
        elif kind == 1:
            _mix_item(X_ptr, QKX_ptr, u_ptr, i_ptr, d_ptr, out_ptr, gdone + g * LINE,
                      (c + 1) * NGB, p * NC + c, p, c, T, hd, (j // NMS) * TB,   # chunk c's u
                      (g % NCB) * BD + (j % NMS) * MB, C, MB, TB, CP, PREC, ROWS)
            _finish(mdone + g * LINE)
        else:
            _write_item(bank_ptr, d_ptr, run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr,
                        run_coef_ptr, log_ptr, mdone + g * LINE, c, p, g % NCB,
                        j * KT, P, hd, NC, NMI, C, W, BD, NG, KW, CP, SAVE, KT)
            _finish(wdone + g * LINE)
        t = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")


def register_cap(bank: Tensor, cap: int) -> int:
    """A queue walk's register cap (``CONFIG``'s ``MAXNREG_QUEUE*``) for ``bank``'s dtype:
    2-byte banks compile without spills under it; fp32 banks spill and run uncapped."""
    return cap if bank.element_size() == 2 else 0


def _programs(device: torch.device, config: dict) -> int:
    """The grid: ``QUEUE_PROGRAMS_PER_SM`` programs per SM (any number is correct; one
    under the interpreter, which runs programs one after another)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return sms * config["QUEUE_PROGRAMS_PER_SM"]


def queue_walk(bank: Tensor, pl, v: Tensor, out: Tensor, saved: Tensor, save: bool,
               config: dict, prec: str, keep: Tensor | None = None):
    """The queue walk of plan ``pl``: one launch; advances ``bank``, writes the readings to
    ``out`` and with ``save`` the undo log to ``saved``; ``keep`` (``[NC * P, CP, hd]``
    fp32): receives ``v - r0`` for the backward."""
    P, C, W, R, NC = pl.P, pl.C, pl.W, pl.R, pl.NC
    hd = bank.shape[1]
    CP = pow2(C)
    BD = config["BD_STEP"]
    NCB = -(-hd // BD)
    u, inter, delta = step_buffers(bank, P, CP)
    TB, MB, NG = min(config["TB_MIX"], CP), config["MB_MIX"], config["NG_STEP"]
    KG, KT = math.gcd(C, config["QUEUE_GATHER_TOKENS"]), config["QUEUE_WRITE_TILES"]
    write_tiles = -(-C * W // NG)
    items = P * NCB * (C // KG + (CP // TB) * (BD // MB) + -(-write_tiles // KT))
    # the kernel's tickets are int32 (a symbolic NC makes this a guard, never a silent wrap)
    torch._check(NC * items < 2 ** 31, lambda: f"sdm: the queue walk's {items} items per "
                 f"chunk times {NC} chunks exceed its int32 tickets: split the sequence")
    sync = torch.zeros((1 + 3 * P * NCB) * LINE, dtype=torch.int32, device=bank.device)
    ru = pl.runs
    launch_capped(_queue_walk_kernel, (_programs(bank.device, config),), config["WARPS_QUEUE"],
                  register_cap(bank, config["MAXNREG_QUEUE"]), bank, pl.slot, pl.ev, v, pl.beta,
                  pl.X, pl.QKX, out, ru.slot, ru.length, ru.decay, ru.tok, ru.coef, u, inter,
                  delta, saved, u if keep is None else keep, sync, P, pl.T, hd, NC, NCB, C=C,
                  W=W, R=R, BD=BD, CP=CP, TB=TB, MB=MB, NG=NG, KW=config["KW_STEP"], SAVE=save,
                  PREC=prec, LINE=LINE, KG=KG, KT=KT, ES=config["QUEUE_GATHER_ENTRIES"],
                  KEEP=keep is not None, ROWS=bool(config["MIX_ROWS"]) and CP <= ROWS_MAX_CP,
                  HD16=multiple_of_16(hd))
