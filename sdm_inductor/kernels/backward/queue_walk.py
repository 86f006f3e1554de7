"""The backward's chunk walk in one launch whose programs take the backward step walk's
work items from a queue (the reverse queue walk: what traced calls launch for the chunked
backward, except the small shapes of ``launch.column_suits`` and fp8 / int4 undo logs).

The backward step walk (``step_walk.py``) runs each chunk step, last chunk first, as five
launches; here the same programs run as items of one launch, as the forward's queue walk
(``forward/queue_walk.py``) runs the forward step walk's. Per chunk, six kinds of item:

0. gather (stream, ``KT`` tokens, column block): ``v - r0``;
1. mix1 (stream, token block, column slice): ``delta = X u`` and ``QK^T dy``;
2. dw (stream, ``KT`` tokens, column block): ``Dw = dB[written slots]``, ``d delta``;
3. mix2 (stream, token block, column slice): ``du``, ``dv``, ``d r0`` and partial sums;
4. dev (stream, ``KT`` tokens, column block): the ``d ev`` partial sums;
5. dB (stream, ``KB`` tiles of groups, column block): the new dB rows of the chunk's slots.

The chunk-start rows come from their sources (``sources.py``: the final bank or the undo
log, both unchanged by the walk), so nothing restores the bank. Everything is separable by
stream and column, so a *group* (stream, column block of ``BD``) depends only on itself.
Each group counts its finished items per kind and chunk (``_count``), and an item waits
until the counts of the chunks it depends on are complete: what it reads is written and
what it overwrites is read:

- gather of chunk c: the second products of chunk c + 2 (the last readers of its buffer
  of ``v - r0``: ``v - r0``, ``delta`` and ``d delta`` have one buffer per chunk parity);
- mix1: the gathers of c (and so the products of c + 2, readers of its ``delta`` and
  ``d delta`` buffers); with ``KEPT`` (the forward's ``v - r0`` of every chunk, handed
  over: no gather items) the products of c + 2 directly;
- dw: mix1 of c, and the dB items of c + 1 (``dB`` at the end of chunk c);
- mix2: the dw items of c, and the dev items of c + 1 (the last readers of ``d r0``);
- dev and dB: mix2 of c (its ``d r0``; dw of c has read the dB rows before).

An item waits where the step walk's launch waits with ``PDL`` 3 (2 for the dB tiles;
``counts._depend``): it first loads what nothing in the walk writes (slots, ``dy``,
chunk-start rows, a dB tile's headers and members, a handed-over ``v - r0``) and does the
work that needs only that, so its wait's round trip overlaps those loads (a training step
0.99x that of items waiting first, at A and B).

Tickets and the counts' memory order are the forward queue walk's: every wait is for
smaller tickets, so the walk cannot deadlock. Nothing of chunk c - 1's gathers and first
products needs chunk c's dB, so their tickets come before it: per step, dw(c), gather(c - 1),
mix2(c), mix1(c - 1), dev(c), dB(c), and they run beside chunk c's last items (with the
gathers after the dB items, each chunk's gathers waited ~60 us at A for the dB tickets
before them to drain: docs/performance.md). Because items of the next chunk run beside
this chunk's, a count may not sum items over chunks (as the forward walk's do, whose
chunks follow one another): a count of all gathers so far could be reached with one of
chunk c's still running and one of chunk c - 1's done. Hence one count per chunk
(``tests/kernels/test_queue_schedules.py`` replays the recorded items in random orders).
The partial sums hold every chunk (the step walk's hold a window of chunks) and are
reduced once after the walk, in a fixed order.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..common.tiles import _token_program_at, row_length
from ..common.counts import LINE, _await_count, _finish
from ..forward.queue_walk import _programs, register_cap
from ..runtime.launch import launch_capped, multiple_of_16, pow2
from .step_walk import (_dev_program, _dw_token, _group_program, _mix1_blocks, _mix2_blocks,
                        _vmr_token, group_args, partial_buffers, window_sums)


# Each kind of item but the dB tiles is its own function (not inlined): the persistent loop
# then keeps no values of one kind live across the others', and the launch needs the
# registers of its largest item, not of their union (all inlined: 244-255 registers at 4
# warps; so: 152 in bf16, set by the second products). The dB tiles stay inline: alone
# they need 128 in bf16 (fp32: 230, the launch's 231, inline or not).


@triton.jit(noinline=True)
def _gather_item(fin_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, ev_ptr, v_ptr, vmr_ptr, p, cb, j,
                 c, T, hd, width, NC, C: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
                 BD: tl.constexpr, WP: tl.constexpr, CP: tl.constexpr, KT: tl.constexpr):
    """``v - r0`` of tokens ``[j * KT, (j + 1) * KT)``, column block ``cb``."""
    for tt in range(KT):
        _p, i, _b, base, cols, cm = _token_program_at(p * C + j * KT + tt, cb, NC, c, hd, C,
                                                      W + R, BD)
        _vmr_token(fin_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, ev_ptr, v_ptr, vmr_ptr, p, i,
                   base, cols, cm, c, T, hd, width, C, W, WP, CP, 0, 0, True)


@triton.jit(noinline=True)
def _mix1_item(X_ptr, QK_ptr, beta_ptr, vmr_ptr, dy_ptr, d_ptr, dd_ptr, p, b, cb, j, c, T, hd,
               cnt_ptr, target, C: tl.constexpr, BD: tl.constexpr, MB: tl.constexpr,
               TB: tl.constexpr, CP: tl.constexpr, PREC: tl.constexpr):
    """The first products of token block ``j // (BD // MB)``, column slice ``j % (BD // MB)``
    of block ``cb``, stored once the count at ``cnt_ptr`` reaches ``target``."""
    NMS: tl.constexpr = BD // MB
    cols = cb * BD + (j % NMS) * MB + tl.arange(0, MB)
    _mix1_blocks(X_ptr, QK_ptr, beta_ptr, vmr_ptr, dy_ptr, d_ptr, dd_ptr, p, b, (j // NMS) * TB,
                 cols, cols < hd, c, T, hd, 0, C, MB, TB, CP, PREC, cnt_ptr, target)


@triton.jit(noinline=True)
def _dw_item(dB_ptr, fin_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, coef_ptr, d_ptr, dd_ptr,
             pc_ptr, pm_ptr, p, cb, j, c, hd, width, NC, NB, cnt_ptr, target,
             C: tl.constexpr, W: tl.constexpr, R: tl.constexpr, BD: tl.constexpr,
             WP: tl.constexpr, CP: tl.constexpr, KT: tl.constexpr):
    """``Dw`` of tokens ``[j * KT, (j + 1) * KT)``, column block ``cb``; the first token
    waits for the count at ``cnt_ptr`` (its chunk's first products) where the step walk's
    dw launch waits with ``PDL`` 3, after its rows."""
    for tt in range(KT):
        _p, i, _b, base, cols, cm = _token_program_at(p * C + j * KT + tt, cb, NC, c, hd, C,
                                                      W + R, BD)
        _dw_token(dB_ptr, fin_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, coef_ptr, d_ptr, dd_ptr,
                  pc_ptr, pm_ptr, p, i, base, cols, cm, cb, c, hd, width, NB, NC, C, W, WP, CP,
                  3, "", 0, True, cnt_ptr, tl.where(tt == 0, target, 0))


@triton.jit(noinline=True)
def _mix2_item(X_ptr, beta_ptr, vmr_ptr, d_ptr, dd_ptr, dr_ptr, dy_ptr, dv_ptr, pqk_ptr, pl_ptr,
               pb_ptr, p, b, cb, j, c, T, hd, NC, NB, C: tl.constexpr, BD: tl.constexpr,
               MB: tl.constexpr, TB: tl.constexpr, CP: tl.constexpr, PREC: tl.constexpr):
    """The second products of token block ``j // (BD // MB)``, column slice ``j % (BD //
    MB)`` of block ``cb`` (its row of the partial sums: the slice's index over all columns)."""
    NMS: tl.constexpr = BD // MB
    ms = cb * NMS + j % NMS
    cols = ms * MB + tl.arange(0, MB)
    _mix2_blocks(X_ptr, beta_ptr, vmr_ptr, d_ptr, dd_ptr, dr_ptr, dy_ptr, dv_ptr, pqk_ptr, pl_ptr,
                 pb_ptr, p, b, (j // NMS) * TB, cols, cols < hd, ms, c, T, hd, NB, NC, 0, C, MB,
                 TB, CP, PREC)


@triton.jit(noinline=True)
def _dev_item(fin_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, dr_ptr, dy_ptr, pe_ptr, p, cb, j, c,
              T, hd, width, NC, NB, cnt_ptr, target, C: tl.constexpr, W: tl.constexpr,
              R: tl.constexpr, BD: tl.constexpr, WP: tl.constexpr, RP: tl.constexpr,
              CP: tl.constexpr, KT: tl.constexpr):
    """The ``d ev`` partial sums of tokens ``[j * KT, (j + 1) * KT)``, column block ``cb``:
    one ``_dev_program`` of all ``BD`` columns per token (the step walk's dev programs take
    the dB launch's narrower blocks; in one block here, each token's slots and sources load
    once and its rows in one round trip: a training step 1.3 % faster at A and 1.4 % at B
    than two blocks of 64, docs/performance.md). The first token waits for the count at
    ``cnt_ptr`` (the chunk's second products) where the step walk's launch waits with
    ``PDL`` 3: only ``d r0`` loads after it."""
    for tt in range(KT):
        _dev_program(p * C + j * KT + tt, cb, fin_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr,
                     dr_ptr, dy_ptr, pe_ptr, c, T, hd, width, NC, NB, NC, C, W, R, BD, WP, RP,
                     CP, 3, "", 0, True, cnt_ptr, tl.where(tt == 0, target, 0))


@triton.jit
def _count(cnt_ptr, kind, c, g, G, NCL):
    """The count of finished items of ``kind`` for group ``g`` and chunk ``c``."""
    return cnt_ptr + ((kind * G + g).to(tl.int64) * NCL + c)


@triton.jit(do_not_specialize=["P", "T", "NC", "NCB", "NCL"])
def _queue_reverse_kernel(dB_ptr, fin_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, ev_ptr,
                          coef_ptr, v_ptr, X_ptr, QK_ptr, beta_ptr, dy_ptr, vmr_ptr, d_ptr,
                          dd_ptr, dr_ptr, dv_ptr, pc_ptr, pm_ptr, pqk_ptr, pl_ptr, pb_ptr,
                          pe_ptr, g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr,
                          g_tok_ptr, g_ev_ptr, g_tok0_ptr, g_ev0_ptr, sync_ptr, P, T, hd, width,
                          NC, NCB, NCL, C: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
                          BD: tl.constexpr, WP: tl.constexpr, RP: tl.constexpr,
                          CP: tl.constexpr, MB: tl.constexpr, TB: tl.constexpr,
                          BDG: tl.constexpr, NG: tl.constexpr,
                          KW: tl.constexpr, KT: tl.constexpr, KB: tl.constexpr,
                          KEPT: tl.constexpr, PREC: tl.constexpr, LINE: tl.constexpr,
                          HD16: tl.constexpr, WIDTH16: tl.constexpr):
    hd = row_length(hd, HD16)
    width = row_length(width, WIDTH16)
    E: tl.constexpr = W + R
    NTI: tl.constexpr = C // KT                 # token items (gather, dw, dev) a group and chunk
    NMS: tl.constexpr = BD // MB
    NMI: tl.constexpr = (CP // TB) * NMS        # product items
    NGT: tl.constexpr = (C * E + NG - 1) // NG  # dB tiles
    NDI: tl.constexpr = (NGT + KB - 1) // KB    # dB items (KB tiles each)
    G = P * NCB
    NB = P * NC                                 # partial-sum rows per column block
    n_tok = G * NTI
    n_gat = 0 if KEPT else n_tok                # gather items: none with the forward's v - r0
    n_mix = G * NMI
    cnt = sync_ptr + LINE                       # the counts (``_count``)
    # tickets: gather and mix1 of step 0, then per step k (chunk NC - 1 - k) dw(k),
    # gather(k + 1), mix2(k), mix1(k + 1), dev(k), dB(k)
    n_pro = n_gat + n_mix
    a1 = n_tok
    a2 = a1 + n_gat
    a3 = a2 + n_mix
    a4 = a3 + n_mix
    a5 = a4 + n_tok
    per_chunk = a5 + G * NDI
    total = n_pro + NC * per_chunk
    t = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    while t < total:
        if t < n_pro:
            k = t * 0
            kind = (t >= n_gat).to(tl.int32)
            q = t - kind * n_gat
        else:
            r = (t - n_pro) % per_chunk
            seg = ((r >= a1).to(tl.int32) + (r >= a2).to(tl.int32) + (r >= a3).to(tl.int32)
                   + (r >= a4).to(tl.int32) + (r >= a5).to(tl.int32))
            q = r - tl.where(seg == 0, 0, tl.where(seg == 1, a1, tl.where(
                seg == 2, a2, tl.where(seg == 3, a3, tl.where(seg == 4, a4, a5)))))
            kind = tl.where(seg == 0, 2, tl.where(seg == 1, 0, tl.where(
                seg == 2, 3, tl.where(seg == 3, 1, seg))))
            # gather and mix1 items belong to the next step
            k = (t - n_pro) // per_chunk + (kind < 2).to(tl.int32)
        c = NC - 1 - k
        sb = (c % 2).to(tl.int64) * P * CP * hd   # the chunk's buffer of v - r0, delta, d delta
        if KEPT:                                # the forward's v - r0: a block per chunk
            vb = c.to(tl.int64) * P * CP * hd
        else:
            vb = sb
        # a group's items of one kind take consecutive tickets (the forward walk's order)
        nk = tl.where((kind == 1) | (kind == 3), NMI, tl.where(kind == 5, NDI, NTI))
        g = q // nk
        j = q % nk
        p = g // NCB
        cb = g % NCB
        b = p * NC + c
        c1 = tl.minimum(c + 1, NC - 1)          # the chunks after c (c itself at the end:
        c2 = tl.minimum(c + 2, NC - 1)          # no wait then, the target is 0)
        if k >= NC:
            pass                                # (no step after the last)
        elif kind == 0:   # the products of c + 2, last readers of this chunk's v - r0 buffer
            # (compiled out with KEPT: no gather items, and the handed-over v - r0, an input
            # of a traced backward, is then not among the launch's writes, which Inductor
            # would otherwise copy before the launch)
            if not KEPT:
                _await_count(_count(cnt, 3, c2, g, G, NCL), tl.where(c + 2 < NC, NMI, 0))
                _gather_item(fin_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, ev_ptr, v_ptr,
                             vmr_ptr + sb, p, cb, j, c, T, hd, width, NC, C, W, R, BD, WP,
                             CP, KT)
        elif kind == 1:
            # the products of c + 2, last readers of this chunk's delta buffers: with KEPT
            # (inputs only to read) the item computes before it waits, and waits before
            # its stores; otherwise it waits for the gathers of c (which waited for them)
            late = tl.where(c + 2 < NC, NMI, 0)
            if not KEPT:
                _await_count(_count(cnt, 0, c, g, G, NCL), NTI)
                late = late * 0
            _mix1_item(X_ptr, QK_ptr, beta_ptr, vmr_ptr + vb, dy_ptr, d_ptr + sb, dd_ptr + sb, p,
                       b, cb, j, c, T, hd, _count(cnt, 3, c2, g, G, NCL), late, C, BD, MB, TB,
                       CP, PREC)
        elif kind == 2:   # dB of c + 1 before its rows load, mix1 of c inside the item
            _await_count(_count(cnt, 5, c1, g, G, NCL), tl.where(c + 1 < NC, NDI, 0))
            _dw_item(dB_ptr, fin_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, coef_ptr,
                     d_ptr + sb, dd_ptr + sb, pc_ptr, pm_ptr, p, cb, j, c, hd, width, NC, NB,
                     _count(cnt, 1, c, g, G, NCL), NMI, C, W, R, BD, WP, CP, KT)
        elif kind == 3:
            _await_count(_count(cnt, 2, c, g, G, NCL), NTI)
            _await_count(_count(cnt, 4, c1, g, G, NCL), tl.where(c + 1 < NC, NTI, 0))
            _mix2_item(X_ptr, beta_ptr, vmr_ptr + vb, d_ptr + sb, dd_ptr + sb, dr_ptr, dy_ptr,
                       dv_ptr, pqk_ptr, pl_ptr, pb_ptr, p, b, cb, j, c, T, hd, NC, NB, C, BD, MB,
                       TB, CP, PREC)
        elif kind == 4:   # mix2 of c inside the item, before d r0 loads
            _dev_item(fin_ptr, log_ptr, scale_ptr, src_ptr, slot_ptr, dr_ptr, dy_ptr, pe_ptr, p,
                      cb, j, c, T, hd, width, NC, NB, _count(cnt, 3, c, g, G, NCL), NMI, C, W,
                      R, BD, WP, RP, CP, KT)
        else:   # mix2 of c in the first tile, after its headers and members (PDL 2's place)
            for u in range(KB):
                if j * KB + u < NGT:
                    _group_program(p * NGT + j * KB + u, cb, dB_ptr, g_slot_ptr, g_len_ptr,
                                   g_nw_ptr, g_decay_ptr, g_pos_ptr, g_tok_ptr, g_ev_ptr,
                                   g_tok0_ptr, g_ev0_ptr, dr_ptr, dy_ptr, c, T, hd, NC, C, E,
                                   BDG, NG, KW, CP, 2, BD // BDG, "",
                                   _count(cnt, 3, c, g, G, NCL), tl.where(u == 0, NMI, 0))
        if k < NC:
            _finish(_count(cnt, kind, c, g, G, NCL))
        t = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")


def queue_reverse(dB: Tensor, final: Tensor, log: Tensor, scales: Tensor, width: int, pl, gr,
                  v: Tensor, dy: Tensor, dv: Tensor, prec: str, config: dict,
                  sources: Tensor, vmr_kept: Tensor | None = None) -> dict:
    """The reverse queue walk over plan ``pl`` (``gr``: its entry groups) in one launch:
    advances ``dB`` in place, writes ``dv``, and returns the cross-column sums, ``[B, C, n]``
    each (``step_walk.step_reverse``'s keys). ``final`` is the final bank and ``sources``
    (``sources.chunk_start_sources``) says where each entry's chunk-start row is: there or
    in the raw undo log ``log``. With ``vmr_kept`` (the forward's ``v - r0``,
    ``[NC * P, CP, hd]``) there are no gather items."""
    P, C, W, R, NC, T = pl.P, pl.C, pl.W, pl.R, pl.NC, pl.T
    E, hd, CP = W + R, dB.shape[1], pow2(C)
    BD, BDG = config["BD_STEP_B"], config["BD_GROUP"]
    if BD % BDG or BD // BDG > 3:
        raise ValueError(f"sdm: the reverse queue walk needs BD_STEP_B ({BD}) to be 1 to 3 "
                         f"dB column blocks of BD_GROUP ({BDG})")
    MB, TB = min(config["MB_QUEUE_B"], BD), min(config["TB_QUEUE_B"], CP)
    NCB = -(-hd // BD)
    KT = math.gcd(C, config["QUEUE_TOKENS_B"])
    NG, KB = config["NG_GROUP"], config["QUEUE_DB_TILES"]
    items = P * NCB * (3 * (C // KT) + 2 * (CP // TB) * (BD // MB) + -(-C * E // (NG * KB)))
    torch._check((NC + 1) * items < 2 ** 31, lambda: f"sdm: the reverse queue walk's {items} "
                 f"items per chunk times {NC + 1} chunk steps exceed its int32 tickets: split "
                 "the sequence")
    f32 = dict(dtype=torch.float32, device=dB.device)
    # two chunks' buffers of each: the next chunk's gathers and first products run beside
    # this chunk's dw, second products and dB items
    delta, ddelta = (torch.empty(2, P, CP, hd, **f32) for _ in range(2))
    vmr = torch.empty(2, P, CP, hd, **f32) if vmr_kept is None else vmr_kept
    dr = torch.empty(P, CP, hd, **f32)
    # every chunk's row of the partial sums (no windows: one launch); d ev by BD columns
    parts, sums = partial_buffers(P, NC, P * NC, C, W, E, NCB, NCB,
                                  NCB * (BD // MB), dB.device)
    # the ticket counter, then a count per kind, group and chunk: each kind's and group's
    # row of NC counts padded to whole lines
    NCL = -(-NC // LINE) * LINE
    sync = torch.zeros(LINE + 6 * P * NCB * NCL, dtype=torch.int32, device=dB.device)
    launch_capped(_queue_reverse_kernel, (_programs(dB.device, config),), config["WARPS_QUEUE"],
                  register_cap(dB, config["MAXNREG_QUEUE_B"]), dB, final, log, scales, sources,
                  pl.slot, pl.ev, pl.coef, v, pl.X, pl.QK, pl.beta, dy, vmr, delta, ddelta, dr,
                  dv, parts["coef"], parts["m"], parts["qk"], parts["L"], parts["b"],
                  parts["ev"], *group_args(gr), sync, P, T, hd, width, NC, NCB, NCL, C=C, W=W,
                  R=R, BD=BD, WP=pow2(W), RP=pow2(R), CP=CP, MB=MB, TB=TB, BDG=BDG, NG=NG,
                  KW=config["KW_GROUP"], KT=KT, KB=KB, KEPT=vmr_kept is not None, PREC=prec,
                  LINE=LINE, HD16=multiple_of_16(hd), WIDTH16=multiple_of_16(width))
    window_sums(parts, sums, P, NC, 0, NC, NC, C)
    return sums
