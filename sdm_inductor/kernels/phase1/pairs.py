"""Phase 1's pairs: per-slot cumulative log-decays by walking each entry's group (a fixed
order: deterministic, and no long cumsum), the rows of the Gram matrices A and QK, and
the per-entry weights Phase 2 uses (``_pairs_kernel``: two programs per token, one for the
write entries and A, one for the read entries and QK, each row's few terms through a
per-program term list; one program per token where a token has no writes or no reads)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..runtime.launch import launch, pow2


@triton.jit
def _gram_add(acc, x, tf, ok, cols):
    """``row[tf] += x`` for the lanes in ``ok`` by one-hot terms (no two writers, a fixed
    order): ``acc`` is ``[lanes, CP]`` and keeps each lane's terms; the caller sums the
    lanes once at the end (one cross-warp reduction per token instead of one per member
    and entry block)."""
    t = tl.where(ok, tf, -1)
    return acc + tl.where(t[:, None] == cols[None, :], x[:, None], 0.0)


@triton.jit
def _list_flush(lx_ptr, lt_ptr, n, row, cols, LB: tl.constexpr):
    """Row ``+=`` the ``n`` terms of a program's term list, ``LB`` at a time in list
    order (one-hot sums: a fixed order, no two writers). The barriers order the list's
    stores by other threads before these loads, and these loads before later stores."""
    tl.debug_barrier()
    s = 0
    while s < n:   # data-dependent trip count: usually once
        j = s + tl.arange(0, LB)
        jm = j < n
        x = tl.load(lx_ptr + j, mask=jm, other=0.0)
        t = tl.load(lt_ptr + j, mask=jm, other=-1)
        row += tl.sum(tl.where(t[:, None] == cols[None, :], x[:, None], 0.0), axis=0)
        s += LB
    tl.debug_barrier()
    return row


@triton.jit
def _list_add(lx_ptr, lt_ptr, n, row, x, tf, ok, cols, LB: tl.constexpr, LMAX: tl.constexpr):
    """Append the lanes in ``ok`` (``x`` at column ``tf``) to the term list in lane order,
    first folding the list into ``row`` if they would not fit (``LMAX`` >= the lanes).
    Most lanes add no Gram term (an entry's own write, a slot no earlier token wrote):
    the list keeps the one-hot sums to the few that do."""
    k = ok.to(tl.int32)
    cnt = tl.sum(k, axis=0)
    if n + cnt > LMAX:
        row = _list_flush(lx_ptr, lt_ptr, n, row, cols, LB)
        n = 0
    pos = n + tl.cumsum(k, axis=0) - 1
    tl.store(lx_ptr + pos, x, mask=ok)
    tl.store(lt_ptr + pos, tf, mask=ok)
    return n + cnt, row


@triton.jit
def _add_terms(row, n, x, tf, ok, cols, lst, LB: tl.constexpr,
               LMAX: tl.constexpr):
    """The lanes in ``ok`` (``x`` at column ``tf``) into a Gram row: through the term list
    ``lst`` if ``LMAX`` > 0 (``_list_add``; ``n`` terms in it), else by one-hot sums over
    the lanes (``_gram_add``). Returns the new ``(n, row)``."""
    if LMAX > 0:
        n, row = _list_add(lst[0], lst[1], n, row, x, tf, ok, cols, LB, LMAX)
    else:
        row = _gram_add(row, x, tf, ok, cols)
    return n, row


@triton.jit
def _member(sorted_ptrs, seg, pos, mask):
    """The gate, weight and token of the entries at sorted positions ``pos``, read from the
    sorted-order copies ``groups._block_writes_kernel`` made (one round trip, where
    going through ``perm`` would take two dependent ones)."""
    sg, sv, st = sorted_ptrs
    return (tl.load(sg + seg + pos, mask=mask, other=0.0),
            tl.load(sv + seg + pos, mask=mask, other=0.0),
            tl.load(st + seg + pos, mask=mask, other=0))


@triton.jit
def _pair_entries(val_ptr, sorted_ptrs, gs_ptr, nw_ptr, gam_ptr, gend_ptr, ev_ptr, coef_ptr,
                  decay_ptr, seg, i, cols, E0: tl.constexpr, E1: tl.constexpr,
                  W: tl.constexpr, E: tl.constexpr, EB: tl.constexpr, CP: tl.constexpr,
                  KM: tl.constexpr, BUILD_A: tl.constexpr, BUILD_QK: tl.constexpr, lst=None,
                  LMAX: tl.constexpr = 0):
    """Entries ``[E0, E1)`` of token ``i``: their cumulative decays and per-entry weights
    (stored), and their terms of the Gram rows ``A[i, :]`` (write entries, if ``BUILD_A``)
    and ``QK[i, :]`` (read entries, if ``BUILD_QK``), returned. Each entry walks its group;
    the first ``KM`` members of every group load as one tile (one round trip for the whole
    block of entries); only groups with more writes in the chunk take the loops, one
    member per round trip.

    ``LMAX`` > 0 (one Gram row built: the split kernel): the row's terms go to the
    program's term list ``lst`` (``_list_add``) and one-hot sums run over that list
    only, instead of over every (entry, member) lane."""
    km = tl.arange(0, KM)[None, :]
    COMPACT: tl.constexpr = LMAX > 0
    LB: tl.constexpr = EB
    # terms in the list (COMPACT); a reduction's scalar, the type _list_add returns
    n = tl.sum(tl.zeros([1], tl.int32), axis=0)
    if COMPACT:
        a_row = tl.zeros([CP], tl.float32)
        qk_row = tl.zeros([CP], tl.float32)
    else:
        a_row = tl.zeros([EB, CP], tl.float32)
        qk_row = tl.zeros([EB, CP], tl.float32)
    # entry blocks unrolled: a block of only write (read) entries builds only A (QK) rows
    for e0 in tl.static_range(E0, E1, EB):
        e = e0 + tl.arange(0, EB)
        em = e < E1
        off = seg + i * E + e
        val = tl.load(val_ptr + off, mask=em, other=0.0)
        gs = tl.load(gs_ptr + off, mask=em, other=0)
        nw = tl.load(nw_ptr + off, mask=em, other=0)
        is_w = e < W
        n_max = tl.max(nw, axis=0)
        mt = km < nw[:, None]                                   # [EB, KM]
        gt, kt, tt = _member(sorted_ptrs, seg, gs[:, None] + km, mt)
        # cumulative log-decay of the entry's slot: at this token (causal) and at the end
        gend = tl.sum(gt, axis=1)
        gam = tl.sum(tl.where(tt <= i, gt, 0.0), axis=1)
        m = KM
        while m < n_max:  # data-dependent trip count: groups of more than KM writes
            mm = m < nw
            gf, _, tf = _member(sorted_ptrs, seg, gs + m, mm)
            gend += gf
            gam += tl.where(tf <= i, gf, 0.0)
            m += 1
        # Gram rows: the write members are in token order, so their own cumulative
        # decay is the running sum of the gates up to them
        xt = val[:, None] * kt * tl.exp(gam[:, None] - tl.cumsum(gt, axis=1))
        for k in tl.static_range(KM):
            if k < n_max:
                sel = km == k
                x = tl.sum(tl.where(sel, xt, 0.0), axis=1)
                tf = tl.sum(tl.where(sel, tt, 0), axis=1)
                mm = k < nw
                if BUILD_A and e0 < W:
                    n, a_row = _add_terms(a_row, n, x, tf, mm & is_w & (tf < i), cols, lst,
                                          LB, LMAX)
                if BUILD_QK and e0 + EB > W:
                    n, qk_row = _add_terms(qk_row, n, x, tf, mm & (~is_w) & (tf <= i), cols,
                                           lst, LB, LMAX)
        run = tl.sum(gt, axis=1)
        m = KM
        while m < n_max:  # data-dependent trip count
            mm = m < nw
            gf, kf, tf = _member(sorted_ptrs, seg, gs + m, mm)
            run += gf
            x = val * kf * tl.exp(gam - run)
            if BUILD_A and e0 < W:
                n, a_row = _add_terms(a_row, n, x, tf, mm & is_w & (tf < i), cols, lst,
                                      LB, LMAX)
            if BUILD_QK and e0 + EB > W:
                n, qk_row = _add_terms(qk_row, n, x, tf, mm & (~is_w) & (tf <= i), cols, lst,
                                       LB, LMAX)
            m += 1
        tl.store(gam_ptr + off, gam, mask=em)
        tl.store(gend_ptr + off, gend, mask=em)
        tl.store(ev_ptr + off, val * tl.exp(gam), mask=em)
        tl.store(coef_ptr + off, tl.where(is_w, val * tl.exp(gend - gam), 0.0), mask=em)
        tl.store(decay_ptr + off, tl.exp(gend), mask=em)
    if COMPACT:
        if BUILD_A:
            a_row = _list_flush(lst[0], lst[1], n, a_row, cols, LB)
        if BUILD_QK:
            qk_row = _list_flush(lst[0], lst[1], n, qk_row, cols, LB)
    else:
        a_row = tl.sum(a_row, axis=0)
        qk_row = tl.sum(qk_row, axis=0)
    return a_row, qk_row


@triton.jit
def _pairs_kernel(val_ptr, sgate_ptr, sval_ptr, stok_ptr, gs_ptr, nw_ptr, gam_ptr, gend_ptr,
                  ev_ptr, coef_ptr, decay_ptr, A_ptr, QK_ptr, lx_ptr, lt_ptr, C, W: tl.constexpr,
                  R: tl.constexpr, EB: tl.constexpr, CP: tl.constexpr, KM: tl.constexpr,
                  SPLIT: tl.constexpr, LMAX: tl.constexpr = 0):
    """One program per (segment, token i), or with ``SPLIT`` two (grid ``(B * C, 2)``):
    one for the write entries and ``A[i, :]``, one for the read entries and ``QK[i, :]``.
    Split, each program keeps one Gram row's accumulator instead of two: fewer registers,
    more programs per SM for a kernel bound by its loads' latency. The members' gates,
    weights and tokens come from sorted-order copies (``_member``). ``LMAX`` > 0
    (``SPLIT`` only): each program's Gram terms through its term list of ``LMAX`` places
    at ``lx_ptr`` / ``lt_ptr`` (``_list_add``)."""
    srt = (sgate_ptr, sval_ptr, stok_ptr)
    pid = tl.program_id(0)            # b * C + i
    b = pid // C
    i = pid % C
    E: tl.constexpr = W + R
    seg = b.to(tl.int64) * C * E      # first entry of the segment
    cols = tl.arange(0, CP)
    cm = cols < C
    row = pid.to(tl.int64) * C + cols
    if SPLIT:
        lo = (pid.to(tl.int64) * 2 + tl.program_id(1)) * LMAX
        lst = (lx_ptr + lo, lt_ptr + lo)
        if tl.program_id(1) == 0:
            a_row, _ = _pair_entries(val_ptr, srt, gs_ptr, nw_ptr, gam_ptr, gend_ptr, ev_ptr,
                                     coef_ptr, decay_ptr, seg, i, cols, 0, W, W, E, EB, CP,
                                     KM, True, False, lst, LMAX)
            tl.store(A_ptr + row, a_row, mask=cm)
        else:
            _, qk_row = _pair_entries(val_ptr, srt, gs_ptr, nw_ptr, gam_ptr, gend_ptr, ev_ptr,
                                      coef_ptr, decay_ptr, seg, i, cols, W, E, W, E, EB, CP,
                                      KM, False, True, lst, LMAX)
            tl.store(QK_ptr + row, qk_row, mask=cm)
    else:
        a_row, qk_row = _pair_entries(val_ptr, srt, gs_ptr, nw_ptr, gam_ptr, gend_ptr, ev_ptr,
                                      coef_ptr, decay_ptr, seg, i, cols, 0, E, W, E, EB, CP,
                                      KM, True, True)
        tl.store(A_ptr + row, a_row, mask=cm)
        tl.store(QK_ptr + row, qk_row, mask=cm)


# places of the split ``_pairs_kernel``'s per-program term list, in entry blocks
# (``_list_add``): the few Gram terms of a row summed one-hot over the list, not over
# every (entry, member) lane
PAIR_LIST = 2

# Write members per group that ``_pairs_kernel`` loads as one tile (a power of 2); longer
# groups loop over the rest. PAIR_ENTRIES / _128 / _WIDE: entries per block of the split
# kernel at C <= 64, <= 128, > 128 (the single form keeps 32 up to 128); the Gram
# rows' one-hot sums are [entries, C]: 255 registers at 32 x 256, 149 at 16 x 256.
PAIR_MEMBERS = 4
PAIR_ENTRIES = 32
PAIR_ENTRIES_128 = 16
PAIR_ENTRIES_WIDE = 16


# the pairs kernel as two programs per token, write entries / A and read entries / QK
# (eager and traced calls; the single form serves W = 0 or R = 0)
PAIR_SPLIT = True

# warps of the split ``_pairs_kernel`` at C <= 64, 64 < C <= 128 and C > 128; the single
# form keeps four. One warp at C=64 (128 registers): the kernel 193 -> 121
# us at A. At C=128 one warp over blocks of 32 entries measured 354
# against 342 us for four, over blocks of 16 (PAIR_ENTRIES_128: no shared-memory layout
# conversions at all) 326 us; 8 warps need more registers per thread, not fewer;
# one warp would spill at C > 128
PAIR_WARPS = 1
PAIR_WARPS_128 = 1
PAIR_WARPS_WIDE = 4


def _pair_warps(C: int) -> int:
    return PAIR_WARPS if C <= 64 else PAIR_WARPS_128 if C <= 128 else PAIR_WARPS_WIDE


def _pair_block(C: int) -> int:
    return PAIR_ENTRIES if C <= 64 else PAIR_ENTRIES_128 if C <= 128 else PAIR_ENTRIES_WIDE


def _pair_launch_blocks(C: int, W: int, R: int, split: bool) -> tuple[int, int]:
    """``_pairs_kernel``'s entries per block (``EB``) and term-list places (``LMAX``, 0:
    no lists) for chunk ``C``, in the split form or the single one."""
    eb = min(_pair_block(C) if split else 32 if C <= 128 else PAIR_ENTRIES_WIDE,
             pow2(max(W, R) if split else W + R))
    return eb, PAIR_LIST * eb if split else 0


def pair_terms(val: Tensor, srt, gs: Tensor, nw: Tensor, B: int, C: int, W: int, R: int):
    """``gam, gend, ev, coef, decay`` (per entry, ``val``'s shape) and the Gram matrices
    ``A, QK`` (``[B, C, C]``) by ``_pairs_kernel``: two programs per token (``PAIR_SPLIT``;
    one where ``W`` or ``R`` is 0). ``srt``: the sorted positions' gates, weights
    and tokens (``groups._scan_groups``)."""
    dev = val.device
    gam = torch.empty_like(val)
    ev = torch.empty_like(val)
    coef = torch.empty_like(val)
    decay = torch.empty_like(val)
    A = torch.empty(B, C, C, dtype=torch.float32, device=dev)
    QK = torch.empty(B, C, C, dtype=torch.float32, device=dev)
    gend = torch.empty_like(val)
    split = PAIR_SPLIT and W > 0 and R > 0
    EB, lmax = _pair_launch_blocks(C, W, R, split)
    lx = torch.empty(B * C * 2 * lmax if lmax else 1, dtype=torch.float32, device=dev)
    lt = torch.empty(lx.shape, dtype=torch.int32, device=dev)
    launch(_pairs_kernel, (B * C, 2 if split else 1), val, *srt, gs, nw, gam, gend, ev, coef,
           decay, A, QK, lx, lt, C, W=W, R=R, EB=EB, CP=pow2(C), KM=PAIR_MEMBERS,
           SPLIT=split, LMAX=lmax, num_warps=_pair_warps(C) if split else 4)
    return gam, gend, ev, coef, decay, A, QK
