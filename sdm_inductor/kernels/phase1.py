"""Phase 1 of the chunked form (SDM_SPEC section 3): everything that needs no bank.

Layout. The tokens of each stream are padded to ``NC * C`` and cut into *segments*
``b = p * NC + c`` (stream-major), so a per-token array ``[P, NC*C, X]`` is also the
per-segment array ``[B, C, X]`` with no copy. Each token has ``E = W + R`` *entries*:
``W`` writes then ``R`` reads. Entry ``(i, e)`` of a segment has the flat index
``i * E + e`` there.

Kernels:

- ``_prep_kernel`` (one program per token): the dense-key meaning of repeated write
  slots (weights summed into the first occurrence, later repeats switched off), masks
  of padded tokens and out-of-range rows (an entry that touches nothing gets slot -1),
  and the sort keys ``2 * slot + is_read``.
- torch: a stable sort of each segment's keys, and three ``searchsorted`` that give
  every entry its *group* (the entries of its segment touching the same slot): the
  write members first, in token order, then the read members.
- ``_pairs_kernel`` (one program per token; in eager calls two, one for the write
  entries and A, one for the read entries and QK: ``PAIR_SPLIT``): per-slot cumulative
  log-decays by walking each entry's group (a fixed order: deterministic, and no long
  cumsum), the rows of the Gram matrices A and QK (split: each row's few terms through a
  per-program term list, ``PAIR_LIST``), and the per-entry weights Phase 2 uses.
- ``solve.inverse``: the unit-lower-triangular inverse ``X = (I + tril(beta A, -1))^-1``
  and ``QKX = QK @ X`` of every chunk (fp32).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from .launch import launch, pow2
from .solve import inverse


@triton.jit
def _softplus(x):
    """``torch.nn.functional.softplus`` (beta=1, threshold=20) in fp32: ``x`` above the
    threshold, else ``max(x, 0) + log1p(exp(-|x|))``; log1p by the ``log(u) * y / (u - 1)``
    correction (exact to rounding for tiny ``y``, where ``log(1 + y)`` would give 0)."""
    y = tl.exp(-tl.abs(x))
    u = 1.0 + y
    d = u - 1.0
    l1p = tl.where(d == 0.0, y, tl.log(u) * (y / tl.where(d == 0.0, 1.0, d)))
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + l1p)


@triton.jit
def _repeat_sums(kv, first, w, ok):
    """Each entry's weight summed over the live entries whose slot first occurs at it (the
    dense-key meaning of a slot repeated in one token): a W x W one-hot sum."""
    return tl.sum(tl.where((first[None, :] == w[:, None]) & ok[None, :], kv[None, :], 0.0),
                  axis=1)


@triton.jit(do_not_specialize=["T", "Tp", "sb_b", "sa_b", "SPAN"])
def _prep_kernel(kidx_ptr, kval_ptr, g_ptr, qidx_ptr, qval_ptr, beta_ptr, alog_ptr, dtb_ptr,
                 slot_ptr, val_ptr, gate_ptr, key_ptr, first_ptr, bout_ptr,
                 T, Tp, S, C, GH, sb_b, sb_h, sb_t, sa_b, sa_h, sa_t, SPAN,
                 W: tl.constexpr, R: tl.constexpr, G: tl.constexpr,
                 WP: tl.constexpr, RP: tl.constexpr, GATED: tl.constexpr,
                 REPEAT_BRANCH: tl.constexpr = True):
    pid = tl.program_id(0)            # p * Tp + t
    p = pid // Tp
    t = pid % Tp
    i = t % C
    E: tl.constexpr = W + R
    tvalid = t < T
    src = p.to(tl.int64) * T + t      # row of the unpadded [P, T] inputs
    out = pid.to(tl.int64) * E        # row of the padded [P, Tp, E] outputs
    # keys of segment b (= pid // C) start at b * SPAN: one flat sort of all segments
    # sorts each (SPAN = 0: a segmented sort)
    koff = (pid // C).to(tl.int64) * SPAN
    if GATED:
        # the raw gate inputs [Bg, T, GH] (stream p = pb * GH + ph), read through their
        # strides: a projection's [B, T, H] output needs no head-split copy
        pb = (p // GH).to(tl.int64)
        ph = (p % GH).to(tl.int64)
        boff = pb * sb_b + ph * sb_h + t.to(tl.int64) * sb_t
        aoff = pb * sa_b + ph * sa_h + t.to(tl.int64) * sa_t
        braw = tl.load(beta_ptr + boff, mask=tvalid, other=0.0).to(tl.float32)
        bv = 1.0 / (1.0 + tl.exp(-braw))                                   # sigmoid
    else:
        bv = tl.load(beta_ptr + src, mask=tvalid, other=0.0).to(tl.float32)
    # per-token write strength, padded to Tp (0 on padded tokens): Phase 1's solve,
    # Phase 2 and the decode loop read this copy
    tl.store(bout_ptr + pid, tl.where(tvalid, bv, 0.0))

    w = tl.arange(0, WP)
    wm = w < W
    kid = tl.load(kidx_ptr + src * W + w, mask=wm & tvalid, other=-1).to(tl.int64)
    kv = tl.load(kval_ptr + src * W + w, mask=wm & tvalid, other=0.0).to(tl.float32)
    ok = wm & tvalid & (kid >= 0) & (kid < S)
    # first occurrence of each entry's slot in this token (dense-key meaning of repeats)
    wc = tl.arange(0, WP)
    same = (kid[:, None] == kid[None, :]) & ok[:, None] & ok[None, :]
    first = tl.min(tl.where(same, wc[None, :], WP), axis=1)
    first = tl.where(ok, first, w)
    active = ok & (first == w)
    if REPEAT_BRANCH:
        # a token without repeated slots (the common case) keeps its weights: the W x W
        # sum would give each entry its own weight alone
        if tl.sum((ok & (first != w)).to(tl.int32), axis=0) > 0:
            kd = _repeat_sums(kv, first, w, ok)
        else:
            kd = kv
    else:
        kd = _repeat_sums(kv, first, w, ok)
    kd = tl.where(active, kd, 0.0)
    if GATED:
        # g = -exp(A_log[p]) * softplus(a + dt_bias[p]), one per token (G == 1)
        araw = tl.load(g_ptr + aoff + w * 0, mask=wm & tvalid, other=0.0).to(tl.float32)
        alog = tl.load(alog_ptr + p).to(tl.float32)
        dtb = tl.load(dtb_ptr + p).to(tl.float32)
        gv = -tl.exp(alog) * _softplus(araw + dtb)
    elif G == 1:
        gv = tl.load(g_ptr + src + w * 0, mask=wm & tvalid, other=0.0)
    else:
        gv = tl.load(g_ptr + src * W + w, mask=wm & tvalid, other=0.0)
    gv = tl.where(active, gv.to(tl.float32), 0.0)
    wslot = tl.where(active, kid, -1)
    # entries that touch nothing get a private key past the bank: a group of their own
    wkey = 2 * tl.where(active, kid, S + i.to(tl.int64) * E + w) + koff
    tl.store(slot_ptr + out + w, wslot.to(tl.int32), mask=wm)
    tl.store(val_ptr + out + w, kd, mask=wm)
    tl.store(gate_ptr + out + w, gv, mask=wm)
    tl.store(key_ptr + out + w, wkey, mask=wm)
    tl.store(first_ptr + pid.to(tl.int64) * W + w, first.to(tl.int32), mask=wm)

    r = tl.arange(0, RP)
    rm = r < R
    qid = tl.load(qidx_ptr + src * R + r, mask=rm & tvalid, other=-1).to(tl.int64)
    qv = tl.load(qval_ptr + src * R + r, mask=rm & tvalid, other=0.0).to(tl.float32)
    rok = rm & tvalid & (qid >= 0) & (qid < S)
    qkey = 2 * tl.where(rok, qid, S + i.to(tl.int64) * E + W + r) + 1 + koff
    tl.store(slot_ptr + out + W + r, tl.where(rok, qid, -1).to(tl.int32), mask=rm)
    tl.store(val_ptr + out + W + r, tl.where(rok, qv, 0.0), mask=rm)
    tl.store(gate_ptr + out + W + r, tl.zeros([RP], tl.float32), mask=rm)
    tl.store(key_ptr + out + W + r, qkey, mask=rm)


@triton.jit
def _max_fn(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min_fn(a, b):
    return tl.minimum(a, b)


@triton.jit
def _store_sizes(skey_ptr, perm_ptr, slot_ptr, gs_ptr, nw_ptr, na_ptr, rslot_ptr, rlen_ptr,
                 rtok_ptr, rent_ptr, wex_ptr, seg, rseg, j, m, k, gst, gen, E: tl.constexpr):
    """Sorted positions ``j`` (mask ``m``, keys ``k``) with their groups' first and last
    positions: each entry's group start and sizes to entry order (scattered), each write
    to its place in the write runs (its exclusive write rank ``wex``)."""
    w_lo = tl.load(wex_ptr + seg + gst, mask=m, other=0)
    w_hi = tl.load(wex_ptr + seg + gen, mask=m, other=0)
    k_end = tl.load(skey_ptr + seg + gen, mask=m, other=1)
    nw = w_hi + ((k_end & 1) == 0).to(tl.int32) - w_lo
    ent = tl.load(perm_ptr + seg + j, mask=m, other=0)
    tl.store(gs_ptr + seg + ent, gst.to(tl.int32), mask=m)
    tl.store(nw_ptr + seg + ent, nw, mask=m)
    tl.store(na_ptr + seg + ent, (gen - gst + 1).to(tl.int32), mask=m)
    isw = m & ((k & 1) == 0)
    dest = tl.load(wex_ptr + seg + j, mask=isw, other=0)
    sl = tl.load(slot_ptr + seg + ent, mask=isw, other=-1)
    lead = (j == gst) & (sl >= 0)
    tl.store(rslot_ptr + rseg + dest, tl.where(lead, sl, -1), mask=isw)
    tl.store(rlen_ptr + rseg + dest, tl.where(lead, nw, 0), mask=isw)
    tl.store(rtok_ptr + rseg + dest, (ent // E).to(tl.int32), mask=isw)
    tl.store(rent_ptr + rseg + dest, ent.to(tl.int32), mask=isw)


@triton.jit
def _groups_kernel(skey_ptr, perm_ptr, slot_ptr, gs_ptr, nw_ptr, na_ptr,
                   rslot_ptr, rlen_ptr, rtok_ptr, rent_ptr, wex_ptr, gsp_ptr,
                   CE, CW, E: tl.constexpr, BLK: tl.constexpr):
    """Groups and write runs of one segment from its sorted keys, by two scans (no
    binary searches, no second sort). A group is a run of equal ``key >> 1`` (one slot);
    its write members (even keys) come first. Filtering the stably sorted entries to the
    writes is the stable sort of the writes alone, so a write's place in the runs
    order is its exclusive rank among the writes of the sorted order."""
    b = tl.program_id(0).to(tl.int64)
    seg = b * CE
    rseg = b * CW
    # forward: each sorted position's group start (running max of the starts) and its
    # exclusive write rank (running count), with carries across blocks
    carry_g = 0
    carry_w = 0
    j0 = 0
    while j0 < CE:  # runtime trip count
        j = j0 + tl.arange(0, BLK)
        m = j < CE
        k = tl.load(skey_ptr + seg + j, mask=m, other=0)
        kp = tl.load(skey_ptr + seg + j - 1, mask=m & (j > 0), other=0)
        start = (j == 0) | ((k >> 1) != (kp >> 1))
        isw = (m & ((k & 1) == 0)).to(tl.int32)
        wex = carry_w + tl.cumsum(isw, 0) - isw
        gst = tl.maximum(tl.associative_scan(tl.where(start & m, j, -1), 0, _max_fn), carry_g)
        tl.store(wex_ptr + seg + j, wex, mask=m)
        tl.store(gsp_ptr + seg + j, gst, mask=m)
        carry_w += tl.sum(isw, 0)
        carry_g = tl.maximum(carry_g, tl.max(gst, 0))
        j0 += BLK
    tl.debug_barrier()
    # reverse: each position's group end (running min of the ends from the right); then
    # the group's sizes go to every member (entry order) and each write to its run place
    carry_e = CE
    j0 = CE - BLK
    while j0 > -BLK:  # runtime trip count, blocks from the last
        j = j0 + tl.arange(0, BLK)
        m = j >= 0
        jn = tl.where(m, j, 0)
        k = tl.load(skey_ptr + seg + jn, mask=m, other=0)
        kn = tl.load(skey_ptr + seg + jn + 1, mask=m & (jn + 1 < CE), other=0)
        end = (jn == CE - 1) | ((k >> 1) != (kn >> 1))
        gen = tl.minimum(tl.associative_scan(tl.where(end & m, jn, CE), 0, _min_fn,
                                             reverse=True), carry_e)
        carry_e = tl.minimum(carry_e, tl.min(gen, 0))
        gst = tl.load(gsp_ptr + seg + jn, mask=m, other=0)
        _store_sizes(skey_ptr, perm_ptr, slot_ptr, gs_ptr, nw_ptr, na_ptr, rslot_ptr, rlen_ptr,
                     rtok_ptr, rent_ptr, wex_ptr, seg, rseg, jn, m, k, gst, gen, E)
        j0 -= BLK


@triton.jit
def _block_writes_kernel(skey_ptr, sperm_ptr, perm_ptr, cnt_ptr, gate_ptr, val_ptr, sgate_ptr,
                         sval_ptr, stok_ptr, CE, NB, E: tl.constexpr, BLK: tl.constexpr,
                         FLAT: tl.constexpr, SORTED: tl.constexpr):
    """The write entries (even keys) of each block of ``BLK`` sorted positions of each
    segment (grid ``(B * NB,)``): the carries of ``_group_bounds_kernel``'s write ranks.
    Also the sort's int64 permutation as int32 positions within the segment (``FLAT``: it
    came from the flat sort of all segments, offset by the segment's first position), and
    with ``SORTED`` each sorted write position's gate, weight and token, so that the pairs
    kernel reads a group's members at their positions instead of through ``perm`` (the
    read positions stay unwritten)."""
    b = (tl.program_id(0) // NB).to(tl.int64)
    blk = tl.program_id(0) % NB
    j = blk * BLK + tl.arange(0, BLK)
    m = j < CE
    k = tl.load(skey_ptr + b * CE + j, mask=m, other=1)
    tl.store(cnt_ptr + b * NB + blk, tl.sum(((k & 1) == 0).to(tl.int32), 0))
    sp = tl.load(sperm_ptr + b * CE + j, mask=m, other=0)
    if FLAT:
        sp -= b * CE
    tl.store(perm_ptr + b * CE + j, sp.to(tl.int32), mask=m)
    if SORTED:
        # write entries only: the pairs kernel reads no other member (a group's first nw)
        wm = m & ((k & 1) == 0)
        tl.store(sgate_ptr + b * CE + j, tl.load(gate_ptr + b * CE + sp, mask=wm), mask=wm)
        tl.store(sval_ptr + b * CE + j, tl.load(val_ptr + b * CE + sp, mask=wm), mask=wm)
        tl.store(stok_ptr + b * CE + j, (sp // E).to(tl.int32), mask=wm)


@triton.jit
def _bound_search(skey_ptr, seg, lo, hi, half):
    """The first position in ``[lo, hi)`` of the segment whose ``key >> 1`` exceeds
    ``half`` (``hi`` if none): a binary search of the sorted keys, one program's scalar."""
    while lo < hi:  # data-dependent trip count (log2 of the range)
        mid = (lo + hi) // 2
        if (tl.load(skey_ptr + seg + mid) >> 1) <= half:
            lo = mid + 1
        else:
            hi = mid
    return lo


@triton.jit
def _group_bounds_kernel(skey_ptr, cnt_ptr, wex_ptr, gsp_ptr, gep_ptr, CE, NB,
                         BLK: tl.constexpr, NBP: tl.constexpr):
    """Each sorted position's group start and end and its exclusive write rank, one block of
    ``BLK`` positions per program (grid ``(B * NB,)``): in-block scans, with the two groups
    that cross the block's edges found by binary searches and the write ranks carried by
    ``_block_writes_kernel``'s counts. ``_groups_kernel`` does the same in one program per
    segment, a chain of dependent blocks (NOTES.md run 16)."""
    b = (tl.program_id(0) // NB).to(tl.int64)
    blk = tl.program_id(0) % NB
    seg = b * CE
    j0 = blk * BLK
    j = j0 + tl.arange(0, BLK)
    m = j < CE
    jl = tl.minimum(j, CE - 1)
    k = tl.load(skey_ptr + seg + jl)
    kp = tl.load(skey_ptr + seg + jl - 1, mask=jl > 0, other=0)
    kn = tl.load(skey_ptr + seg + jl + 1, mask=jl + 1 < CE, other=0)
    start = (jl == 0) | ((k >> 1) != (kp >> 1))
    end = (jl == CE - 1) | ((k >> 1) != (kn >> 1))
    # the group reaching in from the left starts at the first position of its slot; the
    # one reaching out to the right ends before the first position past its slot
    first_half = tl.load(skey_ptr + seg + j0) >> 1
    g0 = _bound_search(skey_ptr, seg, j0 * 0, j0, first_half - 1)
    j1 = tl.minimum(j0 + BLK, CE)
    last_half = tl.load(skey_ptr + seg + j1 - 1) >> 1
    g1 = _bound_search(skey_ptr, seg, j1, CE, last_half) - 1
    gst = tl.associative_scan(tl.where(start & m, j, -1), 0, _max_fn)
    gst = tl.where(gst < 0, g0, gst)
    gen = tl.associative_scan(tl.where(end & m, j, CE), 0, _min_fn, reverse=True)
    gen = tl.where(gen == CE, g1, gen)
    nb = tl.arange(0, NBP)
    carry = tl.sum(tl.load(cnt_ptr + b * NB + nb, mask=nb < blk, other=0), 0)
    isw = (m & ((k & 1) == 0)).to(tl.int32)
    tl.store(wex_ptr + seg + j, carry + tl.cumsum(isw, 0) - isw, mask=m)
    tl.store(gsp_ptr + seg + j, gst.to(tl.int32), mask=m)
    tl.store(gep_ptr + seg + j, gen.to(tl.int32), mask=m)


@triton.jit
def _group_sizes_kernel(skey_ptr, perm_ptr, slot_ptr, gs_ptr, nw_ptr, na_ptr,
                        rslot_ptr, rlen_ptr, rtok_ptr, rent_ptr, wex_ptr, gsp_ptr, gep_ptr,
                        CE, CW, NB, E: tl.constexpr, BLK: tl.constexpr):
    """From ``_group_bounds_kernel``'s bounds and ranks: every entry's group start and
    sizes (entry order) and each write's place in the write runs, as ``_groups_kernel``'s
    second scan does. Grid ``(B * NB,)``, a segment's blocks adjacent: the programs
    resident at once cover few segments, so the scattered entry-order stores land in a
    small region of L2 (the segment's 64 KB per array at A C=128) rather than all of it."""
    b = (tl.program_id(0) // NB).to(tl.int64)
    seg = b * CE
    rseg = b * CW
    j = tl.program_id(0) % NB * BLK + tl.arange(0, BLK)
    m = j < CE
    gst = tl.load(gsp_ptr + seg + j, mask=m, other=0)
    gen = tl.load(gep_ptr + seg + j, mask=m, other=0)
    k = tl.load(skey_ptr + seg + j, mask=m, other=1)
    _store_sizes(skey_ptr, perm_ptr, slot_ptr, gs_ptr, nw_ptr, na_ptr, rslot_ptr, rlen_ptr,
                 rtok_ptr, rent_ptr, wex_ptr, seg, rseg, j, m, k, gst, gen, E)


@triton.jit
def _gram_add(acc, x, tf, ok, cols, ACC: tl.constexpr):
    """``row[tf] += x`` for the lanes in ``ok`` by a one-hot sum over the lanes (no two
    writers, a fixed order). ``ACC``: ``acc`` is ``[lanes, CP]`` and keeps each lane's
    one-hot terms; the caller sums the lanes once at the end (one cross-warp reduction
    per token instead of one per member and entry block). Otherwise ``acc`` is the row."""
    t = tl.where(ok, tf, -1)
    hot = tl.where(t[:, None] == cols[None, :], x[:, None], 0.0)
    if ACC:
        return acc + hot
    else:
        return acc + tl.sum(hot, axis=0)


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
def _add_terms(row, n, x, tf, ok, cols, lst, ACC: tl.constexpr, LB: tl.constexpr,
               LMAX: tl.constexpr):
    """The lanes in ``ok`` (``x`` at column ``tf``) into a Gram row: through the term list
    ``lst`` if ``LMAX`` > 0 (``_list_add``; ``n`` terms in it), else by one-hot sums over
    the lanes (``_gram_add``). Returns the new ``(n, row)``."""
    if LMAX > 0:
        n, row = _list_add(lst[0], lst[1], n, row, x, tf, ok, cols, LB, LMAX)
    else:
        row = _gram_add(row, x, tf, ok, cols, ACC)
    return n, row


@triton.jit
def _member(val_ptr, gate_ptr, perm_ptr, sorted_ptrs, seg, pos, mask, E: tl.constexpr,
            SORTED: tl.constexpr):
    """The gate, weight and token of the entries at sorted positions ``pos``: read at those
    positions (``SORTED``: ``sorted_ptrs``, the copies ``_block_writes_kernel`` made), or
    through ``perm`` (a second, dependent round trip)."""
    if SORTED:
        sg, sv, st = sorted_ptrs
        return (tl.load(sg + seg + pos, mask=mask, other=0.0),
                tl.load(sv + seg + pos, mask=mask, other=0.0),
                tl.load(st + seg + pos, mask=mask, other=0))
    f = tl.load(perm_ptr + seg + pos, mask=mask, other=0)
    return (tl.load(gate_ptr + seg + f, mask=mask, other=0.0),
            tl.load(val_ptr + seg + f, mask=mask, other=0.0), f // E)


@triton.jit
def _pair_entries(val_ptr, gate_ptr, perm_ptr, sorted_ptrs, gs_ptr, nw_ptr, gam_ptr, gend_ptr,
                  ev_ptr, coef_ptr, decay_ptr, seg, i, cols, E0: tl.constexpr,
                  E1: tl.constexpr, W: tl.constexpr, E: tl.constexpr, EB: tl.constexpr,
                  CP: tl.constexpr, KM: tl.constexpr, ACC: tl.constexpr,
                  BUILD_A: tl.constexpr, BUILD_QK: tl.constexpr, SORTED: tl.constexpr,
                  lst=None, LMAX: tl.constexpr = 0):
    """Entries ``[E0, E1)`` of token ``i``: their cumulative decays and per-entry weights
    (stored), and their terms of the Gram rows ``A[i, :]`` (write entries, if ``BUILD_A``)
    and ``QK[i, :]`` (read entries, if ``BUILD_QK``), returned. Each entry walks its group;
    the first ``KM`` members of every group load as one tile (one round trip for the whole
    block of entries with ``SORTED``, else two dependent ones through ``perm``); only
    groups with more writes in the chunk take the loops, one member per round trip.

    ``LMAX`` > 0 (one Gram row built: the split kernel): the row's terms go to the
    program's term list ``lst`` (``_list_add``) and one-hot sums run over that list
    only, instead of over every (entry, member) lane; ``ACC`` is then unused."""
    km = tl.arange(0, KM)[None, :]
    COMPACT: tl.constexpr = LMAX > 0
    LB: tl.constexpr = EB
    # terms in the list (COMPACT); a reduction's scalar, the type _list_add returns
    n = tl.sum(tl.zeros([1], tl.int32), axis=0)
    if COMPACT:
        a_row = tl.zeros([CP], tl.float32)
        qk_row = tl.zeros([CP], tl.float32)
    elif ACC:
        a_row = tl.zeros([EB, CP], tl.float32)
        qk_row = tl.zeros([EB, CP], tl.float32)
    else:
        a_row = tl.zeros([CP], tl.float32)
        qk_row = tl.zeros([CP], tl.float32)
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
        gt, kt, tt = _member(val_ptr, gate_ptr, perm_ptr, sorted_ptrs, seg, gs[:, None] + km,
                             mt, E, SORTED)
        # cumulative log-decay of the entry's slot: at this token (causal) and at the end
        gend = tl.sum(gt, axis=1)
        gam = tl.sum(tl.where(tt <= i, gt, 0.0), axis=1)
        m = KM
        while m < n_max:  # data-dependent trip count: groups of more than KM writes
            mm = m < nw
            gf, _, tf = _member(val_ptr, gate_ptr, perm_ptr, sorted_ptrs, seg, gs + m, mm, E,
                                SORTED)
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
                                          ACC, LB, LMAX)
                if BUILD_QK and e0 + EB > W:
                    n, qk_row = _add_terms(qk_row, n, x, tf, mm & (~is_w) & (tf <= i), cols,
                                           lst, ACC, LB, LMAX)
        run = tl.sum(gt, axis=1)
        m = KM
        while m < n_max:  # data-dependent trip count
            mm = m < nw
            gf, kf, tf = _member(val_ptr, gate_ptr, perm_ptr, sorted_ptrs, seg, gs + m, mm, E,
                                 SORTED)
            run += gf
            x = val * kf * tl.exp(gam - run)
            if BUILD_A and e0 < W:
                n, a_row = _add_terms(a_row, n, x, tf, mm & is_w & (tf < i), cols, lst, ACC,
                                      LB, LMAX)
            if BUILD_QK and e0 + EB > W:
                n, qk_row = _add_terms(qk_row, n, x, tf, mm & (~is_w) & (tf <= i), cols, lst,
                                       ACC, LB, LMAX)
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
    elif ACC:
        a_row = tl.sum(a_row, axis=0)
        qk_row = tl.sum(qk_row, axis=0)
    return a_row, qk_row


@triton.jit
def _pairs_kernel(val_ptr, gate_ptr, perm_ptr, sgate_ptr, sval_ptr, stok_ptr, gs_ptr, nw_ptr,
                  gam_ptr, gend_ptr, ev_ptr, coef_ptr, decay_ptr, A_ptr, QK_ptr, lx_ptr, lt_ptr,
                  C, W: tl.constexpr, R: tl.constexpr, EB: tl.constexpr, CP: tl.constexpr,
                  KM: tl.constexpr, ACC: tl.constexpr, SPLIT: tl.constexpr,
                  SORTED: tl.constexpr = False, LMAX: tl.constexpr = 0):
    """One program per (segment, token i), or with ``SPLIT`` two (grid ``(B * C, 2)``):
    one for the write entries and ``A[i, :]``, one for the read entries and ``QK[i, :]``.
    Split, each program keeps one Gram row's accumulator instead of two: fewer registers,
    more programs per SM for a kernel bound by its loads' latency. ``SORTED``: the members'
    gates, weights and tokens come from sorted-order copies (``_member``). ``LMAX`` > 0
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
            a_row, _ = _pair_entries(val_ptr, gate_ptr, perm_ptr, srt, gs_ptr, nw_ptr, gam_ptr,
                                     gend_ptr, ev_ptr, coef_ptr, decay_ptr, seg, i, cols, 0, W,
                                     W, E, EB, CP, KM, ACC, True, False, SORTED, lst, LMAX)
            tl.store(A_ptr + row, a_row, mask=cm)
        else:
            _, qk_row = _pair_entries(val_ptr, gate_ptr, perm_ptr, srt, gs_ptr, nw_ptr, gam_ptr,
                                      gend_ptr, ev_ptr, coef_ptr, decay_ptr, seg, i, cols, W, E,
                                      W, E, EB, CP, KM, ACC, False, True, SORTED, lst, LMAX)
            tl.store(QK_ptr + row, qk_row, mask=cm)
    else:
        a_row, qk_row = _pair_entries(val_ptr, gate_ptr, perm_ptr, srt, gs_ptr, nw_ptr, gam_ptr,
                                      gend_ptr, ev_ptr, coef_ptr, decay_ptr, seg, i, cols, 0, E,
                                      W, E, EB, CP, KM, ACC, True, True, SORTED)
        tl.store(A_ptr + row, a_row, mask=cm)
        tl.store(QK_ptr + row, qk_row, mask=cm)


@dataclass
class Plan:
    """Phase 1 of a whole call: per-entry ``[B, C, E]`` and per-segment ``[B, C, C]``."""
    P: int
    T: int
    C: int
    NC: int
    W: int
    R: int
    slot: Tensor    # int32, -1: touches nothing (padding, out of range, repeated write)
    val: Tensor     # fp32 dense-key weight (writes) / read weight (reads)
    gate: Tensor    # fp32 log-decay of an active write entry, else 0
    first: Tensor   # [P, Tp, W] int32, first occurrence of the entry's slot in its token
    perm: Tensor    # [B, C*E] int32, entries sorted by (slot, write-before-read, token)
    gs: Tensor      # int32, start of the entry's group in perm
    nw: Tensor      # int32, number of write members of the group
    na: Tensor      # int32, number of members of the group
    gam: Tensor     # fp32 cumulative log-decay of the slot at the entry's token (causal)
    gend: Tensor    # fp32 same at the end of the chunk
    ev: Tensor      # fp32 val * exp(gam): weight of the chunk-start row in r0 / inter
    coef: Tensor    # fp32 k * exp(gend - gam): weight of delta in the chunk-end row
    decay: Tensor   # fp32 exp(gend): decay of the slot over the whole chunk
    beta: Tensor    # [B, C] fp32, 0 on padded tokens
    A: Tensor       # [B, C, C]
    QK: Tensor      # [B, C, C]
    X: Tensor       # [B, C, C] (I + tril(beta A, -1))^-1
    QKX: Tensor     # [B, C, C] QK @ X
    runs: "Runs | None" = None  # the write pass of the forward, in sorted order

    @property
    def E(self) -> int:
        return self.W + self.R

    @property
    def B(self) -> int:
        return self.P * self.NC


@dataclass
class Runs:
    """Per segment, the ``C*W`` write entries sorted by slot (``[B, C*W]``): one *run* per
    distinct written slot, its members contiguous and in token order. Only a run's first
    position carries the slot (others -1) and the run length, so a kernel lane that owns
    a run reads its members with contiguous loads and no indirection."""
    slot: Tensor    # int32 slot at a run start, else -1
    length: Tensor  # int32 run length at a run start, else 0
    decay: Tensor   # fp32 exp(gend) of the slot
    tok: Tensor     # int32 token of the entry at this position
    coef: Tensor    # fp32 coef of the entry at this position
    # a run's start position is also its row of the segment's undo log (``quant.UndoLog``)


@dataclass
class Groups:
    """The same for all ``C*E`` entries (``[B, C*E]``, ``perm`` order): one group per
    distinct touched slot, write members first; used by the backward's ``dB`` pass.
    The headers (``slot``, ``length``, ``n_w``, ``decay``, ``pos``, ``tok0``, ``ev0``) are
    indexed by group,
    in one of ``entry_groups``' layouts (``pack``): 2 (split), the segment's groups of
    several members packed to the front of its row and those of one member packed from its
    end, both in position order (from the end: the last column holds the first of them),
    the empty
    header -1 / 0 / 0 / 1 / -1 / 0 / 0 between; 1 (packed), all groups at the front in position
    order, then the empty header; 0, by position, the empty header where no group starts.
    ``tok`` and ``ev`` are by position: group ``i``'s members sit at positions ``pos[i]``
    to ``pos[i] + length[i] - 1``."""
    slot: Tensor    # int32 slot of the group, else -1
    length: Tensor  # int32 members (na) of the group, else 0
    n_w: Tensor     # int32 write members of the group
    decay: Tensor   # fp32 exp(gend) if the slot is written in the chunk, else 1
    tok: Tensor     # int32 token of the entry at this position
    ev: Tensor      # fp32 ev of the entry at this position
    pos: Tensor     # int32 position of the group's first member, else -1
    tok0: Tensor    # int32 token of the group's first member (a header: tok[pos]), else 0
    ev0: Tensor     # fp32 ev of the group's first member (ev[pos]), else 0


# The split ``_pairs_kernel``'s Gram terms through a per-program term list of PAIR_LIST
# entry blocks (``_list_add``; 0: one-hot sums over every (entry, member) lane, ``PAIR_ACC``).
# Eager calls only, like PAIR_SPLIT.
PAIR_LIST = 2
# Write members per group that ``_pairs_kernel`` loads as one tile (a power of 2); longer
# groups loop over the rest. PAIR_ENTRIES / _128 / _WIDE: entries per block of the split
# kernel at C <= 64, <= 128, > 128 (the single form keeps 32 up to 128); the Gram
# rows' one-hot sums are [entries, C]: 255 registers at 32 x 256, 149 at 16 x 256.
PAIR_MEMBERS = 4
PAIR_ENTRIES = 32
PAIR_ENTRIES_128 = 16
PAIR_ENTRIES_WIDE = 16
# Gram rows summed over the entry lanes once per token (``_gram_add``'s ``ACC``)
PAIR_ACC = True
# the pairs kernel as two programs per token, write entries / A and read entries / QK
# (run 14). Eager calls only, like PREP_REPEAT_BRANCH: traced calls (torch.compile, export,
# AOTInductor) keep the earlier kernel forms. With both on, the AOTInductor CUDA test with a
# dynamic length (tests/test_export_aoti.py) failed once on the H200 (relative error 0.24);
# its cause was not found before the session's device time ran out, and the earlier forms
# are the ones that passed it (NOTES.md run 14).
PAIR_SPLIT = True
# warps of the split ``_pairs_kernel`` at C <= 64, 64 < C <= 128 and C > 128; the single
# form (traced calls) keeps four. One warp at C=64 (128 registers): the kernel 193 -> 121
# us at A (NOTES.md run 16). At C=128 one warp over blocks of 32 entries measured 354
# against 342 us for four, over blocks of 16 (PAIR_ENTRIES_128: no shared-memory layout
# conversions at all) 326 us; 8 warps need more registers per thread, not fewer (run 14);
# one warp would spill at C > 128
PAIR_WARPS = 1
PAIR_WARPS_128 = 1
PAIR_WARPS_WIDE = 4
# warps of ``_prep_kernel`` (one program per token). One: its W x W slot comparisons
# and sums stay in one warp's registers and shuffles, 2.4 k instructions per token
# against 4 x 1.5 k for four warps (an issue-bound kernel, run 13); NOTES.md run 15:
# no-grad 1-2.5 % faster at A and B (the plan alone: 0.92 at A C=128, 1.07 at C=64)
PREP_WARPS = 1
# the prep kernel sums repeated slots' weights only in tokens that repeat a slot (run 14;
# eager calls only, see PAIR_SPLIT)
PREP_REPEAT_BRANCH = True
# ``_groups_kernel`` (one program per segment): positions per block of its two scans, warps
GROUPS_BLK = 2048
GROUPS_WARPS = 8
# The groups in three launches over blocks of GROUPS_SPLIT_BLK sorted positions
# (``_block_writes_kernel``, ``_group_bounds_kernel``, ``_group_sizes_kernel``: every block
# at once) instead of ``_groups_kernel``'s one program per segment: 132 against 166 us at
# A C=128 (NOTES.md run 16). Both are bound by the scattered stores to entry order, which
# the split form keeps in a small region of L2. Eager calls only, like PAIR_SPLIT.
GROUPS_SPLIT = True
GROUPS_SPLIT_BLK = 1024
# With the split groups, ``_block_writes_kernel`` also writes each sorted write position's
# gate, weight and token, and the pairs kernel reads a group's members there (one round trip)
# instead of through ``perm`` (two dependent ones: NOTES.md run 16 found the kernel bound
# by them). The same values: bitwise the same plan.
PAIR_SORTED = True


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


def _scan_groups(skey: Tensor, sperm: Tensor, flat: bool, slot: Tensor, gate: Tensor,
                 val: Tensor, C: int, W: int, R: int):
    """``perm`` (int32 positions within the segment), ``gs, nw, na`` (entry order), the
    write runs' ``slot, length, tok`` and entry index (run order) of every segment, and
    (split form with ``PAIR_SORTED``, else None) the sorted positions' gates, weights and
    tokens, from the sorted keys ``skey`` and the sort's int64 permutation ``sperm``
    (``flat``: of the flat sort, ``_flat_span``), by ``_groups_kernel`` or its split form."""
    B, CE = skey.shape
    CW = C * W
    dev = skey.device
    i32 = dict(dtype=torch.int32, device=dev)
    gs, nw, na, wex, gsp = (torch.empty(B, CE, **i32) for _ in range(5))
    rslot, rlen, rtok, rent = (torch.empty(B, CW, **i32) for _ in range(4))
    srt = None
    if GROUPS_SPLIT and not is_fake(skey):
        blk = min(GROUPS_SPLIT_BLK, pow2(CE))
        nb = -(-CE // blk)
        cnt = torch.empty(B, nb, **i32)
        gep = torch.empty(B, CE, **i32)
        perm = torch.empty(B, CE, **i32)
        if PAIR_SORTED:
            srt = (torch.empty_like(gate), torch.empty_like(val), torch.empty(B, CE, **i32))
        launch(_block_writes_kernel, (B * nb,), skey, sperm, perm, cnt, gate, val,
               *(srt or (perm,) * 3), CE, nb, E=W + R, BLK=blk, FLAT=flat,
               SORTED=srt is not None, num_warps=4)
        launch(_group_bounds_kernel, (B * nb,), skey, cnt, wex, gsp, gep, CE, nb, BLK=blk,
               NBP=pow2(nb), num_warps=4)
        launch(_group_sizes_kernel, (B * nb,), skey, perm, slot, gs, nw, na, rslot, rlen, rtok,
               rent, wex, gsp, gep, CE, CW, nb, E=W + R, BLK=blk, num_warps=4)
    else:
        perm = _local_perm(sperm, flat)
        launch(_groups_kernel, (B,), skey, perm, slot, gs, nw, na, rslot, rlen, rtok, rent,
               wex, gsp, CE, CW, E=W + R, BLK=min(GROUPS_BLK, pow2(CE)), num_warps=GROUPS_WARPS)
    return perm, gs, nw, na, (rslot, rlen, rtok, rent), srt


def _local_perm(sperm: Tensor, flat: bool) -> Tensor:
    """The sort's permutation as int32 positions within each segment."""
    if flat:   # a segment's keys sort to its own range of the flat order
        B, CE = sperm.shape
        sperm = sperm - torch.arange(0, B * CE, CE, device=sperm.device)[:, None]
    return sperm.to(torch.int32)


def _key_dtype(S, C: int, E: int) -> torch.dtype:
    """int32 sort keys when every key fits (``2 * (S + C*E) + 1 < 2**31``): the radix
    sort then makes half the passes. A symbolic bank size keeps int64 (no guard on S)."""
    return torch.int32 if isinstance(S, int) and S + C * E < 2 ** 30 else torch.int64


# One device-wide sort of all segments' keys (each offset by its segment) instead of a
# segmented sort, when those keys fit int32. torch's segmented sort runs one block per
# segment from 128 segments up (cub's segmented radix sort: a segment's latency) and
# two full sorts below; the flat sort is one radix sort over all entries.
FLAT_SORT = True


def _flat_span(S, B, C: int, E: int) -> int:
    """The key offset between segments for the flat sort (``2 * (S + C*E)``), or 0 for
    the segmented sort: a symbolic size (traced code) or keys past int32 keep it. A
    nonzero span implies ``_key_dtype``'s int32 keys."""
    if not (FLAT_SORT and isinstance(S, int) and isinstance(B, int)):
        return 0
    span = 2 * (S + C * E)
    return span if B * span < 2 ** 31 else 0


# positions per program of ``entry_groups``' two launches
GROUPS_BLOCK = 1024


@triton.jit
def _store_headers(o_slot_ptr, o_len_ptr, o_nw_ptr, o_decay_ptr, o_pos_ptr, o_tok0_ptr,
                   o_ev0_ptr, off, mask, sl, na, nw, dec, gpos, tok0, ev0):
    """Group headers (slot, members, write members, decay, first position, the first
    member's token and weight) at ``off``."""
    tl.store(o_slot_ptr + off, sl, mask=mask)
    tl.store(o_len_ptr + off, na, mask=mask)
    tl.store(o_nw_ptr + off, nw, mask=mask)
    tl.store(o_decay_ptr + off, dec, mask=mask)
    tl.store(o_pos_ptr + off, gpos, mask=mask)
    tl.store(o_tok0_ptr + off, tok0, mask=mask)
    tl.store(o_ev0_ptr + off, ev0, mask=mask)


@triton.jit
def _block_starts(perm_ptr, gs_ptr, na_ptr, CE, NB, PACK: tl.constexpr, BLOCK: tl.constexpr):
    """This program's segment ``b`` and block ``k`` of ``BLOCK`` positions ``pos`` (of
    ``NB`` per segment, ``m``: inside it), the entries there, where a group starts, its
    members, and which starts go to the front of the row (``PACK`` 2: groups of several
    members; 1: all)."""
    b = tl.program_id(0) // NB
    k = tl.program_id(0) % NB
    base = b.to(tl.int64) * CE
    pos = k * BLOCK + tl.arange(0, BLOCK)
    m = pos < CE
    e = tl.load(perm_ptr + base + pos, mask=m, other=0)   # the entry at this position
    st = m & (tl.load(gs_ptr + base + e, mask=m, other=-1) == pos)
    na = tl.load(na_ptr + base + e, mask=st, other=0)
    front = st & (na > 1) if PACK == 2 else st
    return b, k, base, pos, m, e, st, na, front


@triton.jit
def _group_counts_kernel(perm_ptr, gs_ptr, na_ptr, cnt_ptr, CE, NB, PACK: tl.constexpr,
                         BLOCK: tl.constexpr):
    """Per block of a segment's positions: its front groups and its other groups (the
    first pass of ``entry_groups``: the second places each block's headers after the
    counts of the blocks before it)."""
    b, k, base, pos, m, e, st, na, front = _block_starts(perm_ptr, gs_ptr, na_ptr, CE, NB,
                                                         PACK, BLOCK)
    back = st & ~front
    out = cnt_ptr + (b * NB + k).to(tl.int64) * 2
    tl.store(out, tl.sum(front.to(tl.int32), axis=0))
    tl.store(out + 1, tl.sum(back.to(tl.int32), axis=0))


@triton.jit
def _entry_groups_kernel(perm_ptr, gs_ptr, slot_ptr, na_ptr, nw_ptr, decay_ptr, ev_ptr, cnt_ptr,
                         o_slot_ptr, o_len_ptr, o_nw_ptr, o_decay_ptr, o_pos_ptr, o_tok_ptr,
                         o_ev_ptr, o_tok0_ptr, o_ev0_ptr, CE, NB, E: tl.constexpr,
                         PACK: tl.constexpr, BLOCK: tl.constexpr, NBP: tl.constexpr):
    """One block of a segment's positions: its ``Groups``. ``PACK`` 1: the block's group
    starts go to the header columns after the groups of the blocks before it (their
    counts, ``_group_counts_kernel``, and the block's prefix sum); 2: the same for groups
    of several members, and from the row's end for groups of one; then the header
    columns of the block that lie between the two get the empty header."""
    b, k, base, pos, m, e, st, na, front = _block_starts(perm_ptr, gs_ptr, na_ptr, CE, NB,
                                                         PACK, BLOCK)
    tok = e // E
    ev = tl.load(ev_ptr + base + e, mask=m, other=0.0)
    tl.store(o_tok_ptr + base + pos, tok, mask=m)
    tl.store(o_ev_ptr + base + pos, ev, mask=m)
    # where no group starts, the empty header: -1 / 0 / 0 / 1 / -1 / 0 / 0
    sl = tl.load(slot_ptr + base + e, mask=st, other=-1)
    nw = tl.load(nw_ptr + base + e, mask=st, other=0)
    dec = tl.where(nw > 0, tl.load(decay_ptr + base + e, mask=st, other=1.0), 1.0)
    if PACK != 0:
        j = tl.arange(0, NBP)
        cm = j < NB
        cf = tl.load(cnt_ptr + (b * NB + j).to(tl.int64) * 2, mask=cm, other=0)
        cb = tl.load(cnt_ptr + (b * NB + j).to(tl.int64) * 2 + 1, mask=cm, other=0)
        n = tl.sum(tl.where(j < k, cf, 0), axis=0)   # front groups of the blocks before
        n_end = tl.sum(tl.where(j < k, cb, 0), axis=0)
        back = st & ~front
        col = tl.where(front, n + tl.cumsum(front.to(tl.int32), axis=0) - 1,
                       CE - n_end - tl.cumsum(back.to(tl.int32), axis=0))
        hm = st
    else:
        col = pos
        hm = m
    _store_headers(o_slot_ptr, o_len_ptr, o_nw_ptr, o_decay_ptr, o_pos_ptr, o_tok0_ptr,
                   o_ev0_ptr, base + col, hm, sl, na, nw, dec, tl.where(st, pos, -1),
                   tl.where(st, tok, 0), tl.where(st, ev, 0.0))
    if PACK != 0:
        # this block's columns between the front and the back groups: the empty header
        # (those columns get no group, so no other program stores there)
        n_all = tl.sum(cf, axis=0)
        gap = m & (pos >= n_all) & (pos < CE - tl.sum(cb, axis=0))
        none = tl.full([BLOCK], -1, tl.int32)
        zero = tl.zeros([BLOCK], tl.int32)
        _store_headers(o_slot_ptr, o_len_ptr, o_nw_ptr, o_decay_ptr, o_pos_ptr, o_tok0_ptr,
                       o_ev0_ptr, base + pos, gap, none, zero, zero,
                       tl.full([BLOCK], 1.0, tl.float32), none, zero,
                       tl.zeros([BLOCK], tl.float32))


def entry_groups(pl: "Plan", pack: int = 2) -> Groups:
    """The groups of ``pl`` (``Groups``): a program per block of ``GROUPS_BLOCK`` positions
    of every segment, in two launches for the packed layouts (the blocks' group counts,
    then the headers after the counts of the blocks before). ``pack``
    (``Groups``' layouts): packed headers let the dB launch's tiles hold only groups (at
    config A, C=128, ~13 k of a stream's 16 k positions start one), and its programs past
    the last group skip their work: the launch is bound by instruction issue (NOTES.md
    runs 13 and 22). Split (2), most tiles hold groups of one member only (~80 % of the
    groups at config A, C=128, ~95 % at B), which the launch sums without a second member's
    loads or the loop over long groups (the slower tiles of longer groups come first in
    each segment: measured no faster or slower than last)."""
    pack = int(pack)
    B, CE = pl.B, pl.C * pl.E
    dev = pl.perm.device
    i32 = dict(dtype=torch.int32, device=dev)
    f32 = dict(dtype=torch.float32, device=dev)
    out = Groups(*(torch.empty(B, CE, **i32) for _ in range(3)), torch.empty(B, CE, **f32),
                 torch.empty(B, CE, **i32), torch.empty(B, CE, **f32), torch.empty(B, CE, **i32),
                 torch.empty(B, CE, **i32), torch.empty(B, CE, **f32))
    NB = -(-CE // GROUPS_BLOCK)
    cnt = torch.empty(B, NB, 2, **i32)
    if pack:
        launch(_group_counts_kernel, (B * NB,), pl.perm, pl.gs, pl.na, cnt, CE, NB, PACK=pack,
               BLOCK=GROUPS_BLOCK, num_warps=4)
    launch(_entry_groups_kernel, (B * NB,), pl.perm, pl.gs, pl.slot, pl.na, pl.nw, pl.decay,
           pl.ev, cnt, out.slot, out.length, out.n_w, out.decay, out.pos, out.tok, out.ev,
           out.tok0, out.ev0, CE, NB, E=pl.E, PACK=pack, BLOCK=GROUPS_BLOCK, NBP=pow2(NB),
           num_warps=4)
    return out


def prep(S: int, k_idx, k_val, beta, g, q_idx, q_val, C: int, gate_params=None, span: int = 0):
    """Dense keys, masks and sort keys of every entry, and the padded per-token write
    strength ``[P, Tp]``; returns ``(slot, val, gate, key, first, NC, beta)``.

    ``gate_params=None``: ``beta [P, T]`` and ``g [P, T, 1 or W]`` are the gates.
    ``gate_params=(A_log, dt_bias)`` (``[P]`` each): ``beta`` and ``g`` are the *raw*
    gate inputs ``b``, ``a`` as ``[Bg, T, GH]`` with ``Bg * GH = P`` (any strides; a
    ``[P, T]`` input is ``[P, T, 1]``), and the kernel computes ``beta = sigmoid(b)``
    and ``g = -exp(A_log) * softplus(a + dt_bias)`` in fp32 itself.

    ``span`` (``_flat_span``): each segment's keys are offset by ``segment * span``, for one
    flat sort of all segments; 0 leaves them per segment.
    """
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    NC = -(-T // C)
    Tp = NC * C
    E: tl.constexpr = W + R
    dev = k_idx.device
    slot = torch.empty(P, Tp, E, dtype=torch.int32, device=dev)
    val = torch.empty(P, Tp, E, dtype=torch.float32, device=dev)
    gate = torch.empty(P, Tp, E, dtype=torch.float32, device=dev)
    key = torch.empty(P, Tp, E, dtype=_key_dtype(S, C, E), device=dev)
    first = torch.empty(P, Tp, W, dtype=torch.int32, device=dev)
    bout = torch.empty(P, Tp, dtype=torch.float32, device=dev)
    if gate_params is None:
        G, GH, sb, sa = g.shape[2], 1, (0, 0, 0), (0, 0, 0)
        # placeholders for pointers compiled out (never a written buffer: Inductor treats
        # pointer arguments as possibly written and clones aliased ones separately)
        A_log = dt_bias = torch.empty(1, dtype=torch.float32, device=dev)
    else:
        A_log, dt_bias = gate_params
        # strides in the kernel's order (stream-batch, stream-head, token)
        G, GH = 1, beta.shape[2]
        sb, sa = ((x.stride(0), x.stride(2), x.stride(1)) for x in (beta, g))
    launch(_prep_kernel, (P * Tp,), k_idx, k_val, g, q_idx, q_val, beta, A_log, dt_bias,
           slot, val, gate, key, first, bout, T, Tp, S, C, GH, *sb, *sa, span,
           W=W, R=R, G=G, WP=pow2(W), RP=pow2(R), GATED=gate_params is not None,
           REPEAT_BRANCH=PREP_REPEAT_BRANCH and not is_fake(k_idx), num_warps=PREP_WARPS)
    return slot, val, gate, key, first, NC, bout


def plan(S: int, k_idx, k_val, beta, g, q_idx, q_val, C: int, gate_params=None) -> Plan:
    """Phase 1 for all chunks of all streams. Inputs contiguous ``[P, T, *]`` (with
    ``gate_params``, ``beta`` / ``g`` are the raw gate inputs: see ``prep``)."""
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    E: tl.constexpr = W + R
    B = P * -(-T // C)
    span = _flat_span(S, B, C, E)
    slot, val, gate, key, first, NC, bp = prep(S, k_idx, k_val, beta, g, q_idx, q_val, C,
                                               gate_params, span)
    dev = k_idx.device
    key = key.view(B, C * E)
    if span:
        skey, sperm = (x.view(B, C * E) for x in torch.sort(key.view(-1), stable=True))
    else:
        skey, sperm = torch.sort(key, dim=-1, stable=True)
    perm, gs, nw, na, runs, srt = _scan_groups(skey, sperm, bool(span), slot.view(B, C * E),
                                               gate.view(B, C * E), val.view(B, C * E), C, W, R)
    gam = torch.empty_like(val)
    ev = torch.empty_like(val)
    coef = torch.empty_like(val)
    decay = torch.empty_like(val)
    A = torch.empty(B, C, C, dtype=torch.float32, device=dev)
    QK = torch.empty(B, C, C, dtype=torch.float32, device=dev)
    gend = torch.empty_like(val)
    split = PAIR_SPLIT and W > 0 and R > 0 and not is_fake(val)
    EB, lmax = _pair_launch_blocks(C, W, R, split)
    lx = torch.empty(B * C * 2 * lmax if lmax else 1, dtype=torch.float32, device=dev)
    lt = torch.empty(lx.shape, dtype=torch.int32, device=dev)
    launch(_pairs_kernel, (B * C, 2 if split else 1), val, gate, perm, *(srt or (perm,) * 3),
           gs, nw, gam, gend, ev, coef, decay, A, QK, lx, lt, C, W=W, R=R,
           SORTED=srt is not None, EB=EB, CP=pow2(C), KM=PAIR_MEMBERS, ACC=PAIR_ACC,
           SPLIT=split, LMAX=lmax, num_warps=_pair_warps(C) if split else 4)

    bp = bp.view(B, C)
    X, QKX = inverse(A, QK, bp)
    pl = Plan(P, T, C, NC, W, R, slot, val, gate, first, perm, gs, nw, na, gam, gend, ev,
              coef, decay, bp, A, QK, X, QKX)
    rslot, rlen, rtok, rent = runs   # the runs' weights are the pairs kernel's
    ent = rent.long()   # once for both gathers (one cast launch fewer)
    take = lambda x: x.view(B, C * E).gather(1, ent)
    pl.runs = Runs(rslot, rlen, take(pl.decay), rtok, take(pl.coef))
    return pl
