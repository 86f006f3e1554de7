"""Groups and write runs from each segment's sorted keys: every entry's group (the entries
of its segment touching the same slot: write members first, in token order, then the
read members) as its start, write members and members, and the write runs (``Runs``) in
slot order, by three launches over blocks of sorted positions (every block at once)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..common.tiles import _max_fn, _min_fn
from ..runtime.launch import launch, pow2


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
def _block_writes_kernel(skey_ptr, sperm_ptr, perm_ptr, cnt_ptr, gate_ptr, val_ptr, sgate_ptr,
                         sval_ptr, stok_ptr, CE, NB, E: tl.constexpr, BLK: tl.constexpr,
                         FLAT: tl.constexpr):
    """The write entries (even keys) of each block of ``BLK`` sorted positions of each
    segment (grid ``(B * NB,)``): the carries of ``_group_bounds_kernel``'s write ranks.
    Also the sort's int64 permutation as int32 positions within the segment (``FLAT``: it
    came from the flat sort of all segments, offset by the segment's first position), and
    each sorted write position's gate, weight and token, so that the pairs
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
    # write entries only: the pairs kernel reads no other member (a group's first nw)
    wm = m & ((k & 1) == 0)
    tl.store(sgate_ptr + b * CE + j, tl.load(gate_ptr + b * CE + sp, mask=wm), mask=wm)
    tl.store(sval_ptr + b * CE + j, tl.load(val_ptr + b * CE + sp, mask=wm), mask=wm)
    tl.store(stok_ptr + b * CE + j, (sp // E).to(tl.int32), mask=wm)


@triton.jit
def _bound_search(skey_ptr, seg, lo, hi, half):
    """The first position in ``[lo, hi)`` of the segment whose ``key >> 1`` exceeds
    ``half`` (``hi`` if none): a binary search of the sorted keys, one program's scalar."""
    # the bounds are loop-carried: as tensors even where a caller passes an integer
    # argument, which torch 2.11's mutation analysis builds as a constant
    lo = tl.cast(lo, tl.int32)
    hi = tl.cast(hi, tl.int32)
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
    ``_block_writes_kernel``'s counts."""
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
    g0 = _bound_search(skey_ptr, seg, 0, j0, first_half - 1)
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
    sizes (entry order) and each write's place in the write runs. Grid ``(B * NB,)``, a
    segment's blocks adjacent: the programs resident at once cover few segments, so the
    scattered entry-order stores land in a small region of L2 (the segment's 64 KB per
    array at A C=128) rather than all of it."""
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


# The groups in three launches over blocks of GROUPS_BLK sorted positions
# (``_block_writes_kernel``, ``_group_bounds_kernel``, ``_group_sizes_kernel``: every block
# at once; 132 us at A C=128, against 166 us for one program per segment scanning it).
# They are bound by the scattered stores to entry order, which blocks keep in a small
# region of L2.
GROUPS_BLK = 1024


def _scan_groups(skey: Tensor, sperm: Tensor, flat: bool, slot: Tensor, gate: Tensor,
                 val: Tensor, C: int, W: int, R: int):
    """``perm`` (int32 positions within the segment), ``gs, nw, na`` (entry order), the
    write runs' ``slot, length, tok`` and entry index (run order) of every segment, and
    the sorted positions' gates, weights and tokens, from the sorted keys ``skey`` and the
    sort's int64 permutation ``sperm`` (``flat``: of the flat sort, ``_flat_span``)."""
    B, CE = skey.shape
    CW = C * W
    dev = skey.device
    i32 = dict(dtype=torch.int32, device=dev)
    gs, nw, na, wex, gsp = (torch.empty(B, CE, **i32) for _ in range(5))
    rslot, rlen, rtok, rent = (torch.empty(B, CW, **i32) for _ in range(4))
    blk = min(GROUPS_BLK, pow2(CE))
    nb = -(-CE // blk)
    cnt = torch.empty(B, nb, **i32)
    gep = torch.empty(B, CE, **i32)
    perm = torch.empty(B, CE, **i32)
    # each sorted write position's gate, weight and token: the pairs kernel reads a
    # group's members there (one round trip) instead of through ``perm`` (two dependent
    # ones, which bound that kernel); the same values, bitwise the same plan
    srt = (torch.empty_like(gate), torch.empty_like(val), torch.empty(B, CE, **i32))
    launch(_block_writes_kernel, (B * nb,), skey, sperm, perm, cnt, gate, val, *srt,
           CE, nb, E=W + R, BLK=blk, FLAT=flat, num_warps=4)
    launch(_group_bounds_kernel, (B * nb,), skey, cnt, wex, gsp, gep, CE, nb, BLK=blk,
           NBP=pow2(nb), num_warps=4)
    launch(_group_sizes_kernel, (B * nb,), skey, perm, slot, gs, nw, na, rslot, rlen, rtok,
           rent, wex, gsp, gep, CE, CW, nb, E=W + R, BLK=blk, num_warps=4)
    return perm, gs, nw, na, (rslot, rlen, rtok, rent), srt

