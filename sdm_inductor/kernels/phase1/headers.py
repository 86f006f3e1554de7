"""The backward's dB groups (``Groups``): each segment's group headers, split (groups of
several members packed at the front of the segment's row, groups of one from its end),
and every position's token and weight, by a program per block of positions."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime.launch import launch, pow2
from .layout import Groups, Plan


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
def _block(CE, NB, BLOCK: tl.constexpr):
    """This program's segment ``b`` and block ``k`` of ``BLOCK`` positions ``pos`` (of ``NB``
    per segment, ``m``: inside it).

    Both kernels then load the entries there, where a group starts, its members, and
    which starts go to the front of the row (groups of several members) themselves: the
    mutation analysis of a traced launch follows a store's offsets back through the calls
    that made them and counts every pointer those calls were handed as written (``perm``,
    ``gs``, ``na``: inputs of a traced backward that Inductor would then copy)."""
    b = tl.program_id(0) // NB
    k = tl.program_id(0) % NB
    base = b.to(tl.int64) * CE
    pos = k * BLOCK + tl.arange(0, BLOCK)
    return b, k, base, pos, pos < CE


@triton.jit
def _group_counts_kernel(perm_ptr, gs_ptr, na_ptr, cnt_ptr, CE, NB, BLOCK: tl.constexpr):
    """Per block of a segment's positions: its front groups and its other groups (the
    first pass of ``entry_groups``: the second places each block's headers after the
    counts of the blocks before it)."""
    b, k, base, pos, m = _block(CE, NB, BLOCK)
    e = tl.load(perm_ptr + base + pos, mask=m, other=0)   # the entry at this position
    st = m & (tl.load(gs_ptr + base + e, mask=m, other=-1) == pos)
    na = tl.load(na_ptr + base + e, mask=st, other=0)
    front = st & (na > 1)
    back = st & ~front
    out = cnt_ptr + (b * NB + k).to(tl.int64) * 2
    tl.store(out, tl.sum(front.to(tl.int32), axis=0))
    tl.store(out + 1, tl.sum(back.to(tl.int32), axis=0))


@triton.jit
def _entry_groups_kernel(perm_ptr, gs_ptr, slot_ptr, na_ptr, nw_ptr, decay_ptr, ev_ptr, cnt_ptr,
                         o_slot_ptr, o_len_ptr, o_nw_ptr, o_decay_ptr, o_pos_ptr, o_tok_ptr,
                         o_ev_ptr, o_tok0_ptr, o_ev0_ptr, CE, NB, E: tl.constexpr,
                         BLOCK: tl.constexpr, NBP: tl.constexpr):
    """One block of a segment's positions: its ``Groups``. The block's starts of groups of
    several members go to the header columns after those of the blocks before it (their
    counts, ``_group_counts_kernel``, and the block's prefix sum), groups of one from the
    row's end likewise; then the header columns of the block that lie between the two get
    the empty header."""
    b, k, base, pos, m = _block(CE, NB, BLOCK)
    e = tl.load(perm_ptr + base + pos, mask=m, other=0)
    st = m & (tl.load(gs_ptr + base + e, mask=m, other=-1) == pos)
    na = tl.load(na_ptr + base + e, mask=st, other=0)
    front = st & (na > 1)
    tok = e // E
    ev = tl.load(ev_ptr + base + e, mask=m, other=0.0)
    tl.store(o_tok_ptr + base + pos, tok, mask=m)
    tl.store(o_ev_ptr + base + pos, ev, mask=m)
    # where no group starts, the empty header: -1 / 0 / 0 / 1 / -1 / 0 / 0
    sl = tl.load(slot_ptr + base + e, mask=st, other=-1)
    nw = tl.load(nw_ptr + base + e, mask=st, other=0)
    dec = tl.where(nw > 0, tl.load(decay_ptr + base + e, mask=st, other=1.0), 1.0)
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
    _store_headers(o_slot_ptr, o_len_ptr, o_nw_ptr, o_decay_ptr, o_pos_ptr, o_tok0_ptr,
                   o_ev0_ptr, base + col, hm, sl, na, nw, dec, tl.where(st, pos, -1),
                   tl.where(st, tok, 0), tl.where(st, ev, 0.0))
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


def entry_groups(pl: "Plan") -> Groups:
    """The groups of ``pl`` (``Groups``): a program per block of ``GROUPS_BLOCK`` positions
    of every segment, in two launches (the blocks' group counts, then the headers after
    the counts of the blocks before). Packed headers let the dB launch's tiles hold only
    groups (at config A, C=128, ~13 k of a stream's 16 k positions start one), and its
    programs past the last group skip their work: the launch is bound by instruction
    issue. Split, most tiles hold groups of one member only (~80 % of the groups at config
    A, C=128, ~95 % at B), which the launch sums without a second member's loads or the
    loop over long groups (the slower tiles of longer groups come first in each segment:
    measured no faster or slower than last)."""
    B, CE = pl.B, pl.C * pl.E
    dev = pl.perm.device
    i32 = dict(dtype=torch.int32, device=dev)
    f32 = dict(dtype=torch.float32, device=dev)
    out = Groups(*(torch.empty(B, CE, **i32) for _ in range(3)), torch.empty(B, CE, **f32),
                 torch.empty(B, CE, **i32), torch.empty(B, CE, **f32), torch.empty(B, CE, **i32),
                 torch.empty(B, CE, **i32), torch.empty(B, CE, **f32))
    NB = -(-CE // GROUPS_BLOCK)
    cnt = torch.empty(B, NB, 2, **i32)
    launch(_group_counts_kernel, (B * NB,), pl.perm, pl.gs, pl.na, cnt, CE, NB,
           BLOCK=GROUPS_BLOCK, num_warps=4)
    launch(_entry_groups_kernel, (B * NB,), pl.perm, pl.gs, pl.slot, pl.na, pl.nw, pl.decay,
           pl.ev, cnt, out.slot, out.length, out.n_w, out.decay, out.pos, out.tok, out.ev,
           out.tok0, out.ev0, CE, NB, E=pl.E, BLOCK=GROUPS_BLOCK, NBP=pow2(NB), num_warps=4)
    return out
