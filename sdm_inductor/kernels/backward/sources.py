"""Where the backward's step and queue walks find each entry's chunk-start row: a row of
the undo log, or the final bank's row.

Walking the chunks in reverse, the backward needs at chunk ``c`` the bank as it was when
chunk ``c`` began, but only at the slots that chunk touches. Slot ``s`` held then what it
held just before the first write to it at or after ``c``: the old row that write saved to
the undo log, or, when nothing writes ``s`` from ``c`` on, the final bank's row. Neither
is written during the backward, so with these sources the walk needs no working copy of
the bank and no restore launch per chunk, which read every written row of the chunk from
the log and wrote it back into the copy (about 44 MB per chunk step at config A), and the
walk's row loads depend on nothing the walk itself writes.

Two forms give the same sources, both shapes-only host code:

- dense (``DENSE_MAX``, when the table is small against the log's positions, ``_dense_fits``):
  a table ``[P, NC, S]`` int32 holds at ``(p, c, s)`` the log row of chunk ``c``'s write
  run of slot ``s`` (one writer: a slot has one run per chunk), then a reverse running
  minimum over the chunks of every (stream, slot) column makes it the first such row at
  or after ``c`` (a slot's log rows grow with the chunk), and each entry reads its own
  place: a fill, a scatter, a scan and a gather, no sort.
- sorted: one sort of the write runs' starts by (stream, slot, chunk) and one binary
  search per entry among its slot's run starts: a key launch, torch's sort, a launch for
  each slot's range of sorted keys, a search launch. For banks whose table would be large.
``reference_sources`` is the same in torch ops (the tests' reference: what torch's own
``searchsorted`` finds).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..common.tiles import _min_fn
from ..runtime.launch import holds, launch

BLOCK = 1024   # positions / entries per program of the launches over them

# The dense form when its table has at most DENSE_MAX places per write position of the
# plan (``_dense_fits``): the table's fill and scan move ~12 bytes a place, the sorted
# form's sort and searches ~200 bytes of scattered traffic a write position. At config A
# the table is 4.5 places a position (19 MB), at B 18 (38 MB); a bank of millions of rows
# takes the sorted form. Measured (CUDA graph): 0.214 -> 0.068 ms at A C=128,
# 0.132 -> 0.061 at B; autograd, the sorted form against the dense: 1.020 (A), 1.010 (B).
# The scan's tiles barely matter (0.067-0.075 ms over six shapes at A).
DENSE_MAX = 32
SCAN_SLOTS = 256   # (stream, slot) columns per program of the scan
SCAN_CHUNKS = 16   # chunks per tile of the scan (a runtime loop over the tiles)
NONE = 2 ** 31 - 1  # the table's "no run at or after this chunk"


@triton.jit
def _run_keys_kernel(run_slot_ptr, key_ptr, S, NC, N, CW: tl.constexpr, BLOCK: tl.constexpr):
    """Sort keys of the write positions: ``(p * S + slot) * NC + c`` at a run start (a
    slot's writes in chunk order within its stream), ``P * S * NC`` (last) elsewhere."""
    pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = pos < N
    b = pos // CW
    p, c = b // NC, b % NC
    rs = tl.load(run_slot_ptr + pos, mask=m, other=-1)
    none = (N // CW // NC) * S * NC   # P * S * NC
    key = tl.where(rs >= 0, (p.to(tl.int64) * S + rs) * NC + c, none)
    tl.store(key_ptr + pos, key.to(key_ptr.dtype.element_ty), mask=m)


@triton.jit
def _ranges_kernel(skey_ptr, lo_ptr, hi_ptr, NK, NC, NONE, BLOCK: tl.constexpr):
    """Each (stream, slot)'s range ``[lo, hi)`` of the sorted run-start keys (they are
    contiguous: the key is ``(p * S + slot) * NC + c``); slots never written keep the
    empty range the caller zeroed. One writer per range end: the positions where the
    (stream, slot) changes."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < NK
    k = tl.load(skey_ptr + i, mask=m, other=0).to(tl.int64) // NC
    kp = tl.load(skey_ptr + i - 1, mask=m & (i > 0), other=-1).to(tl.int64)
    kn = tl.load(skey_ptr + i + 1, mask=m & (i + 1 < NK), other=-1).to(tl.int64)
    valid = m & (k < NONE)   # not the key of a position that starts no run
    # the ends are tested by position: the masked loads' -1 divides (truncating) to 0,
    # which is stream 0's slot 0
    first = valid & ((i == 0) | (kp // NC != k))
    last = valid & ((i + 1 == NK) | (kn // NC != k))
    tl.store(lo_ptr + k, i, mask=first)
    tl.store(hi_ptr + k, i + 1, mask=last)


@triton.jit(do_not_specialize=["STEPS"])
def _search_kernel(slot_ptr, lo_ptr, hi_ptr, order_ptr, src_ptr, skey_ptr, S, NC, P, NE, STEPS,
                   CE: tl.constexpr, CW: tl.constexpr, BLOCK: tl.constexpr):
    """Each entry's source: the first run start in sorted order whose key is at least the
    entry's own (``(p * S + slot) * NC + c``) among its (stream, slot)'s run starts
    (``_ranges_kernel``), as its log row ``(c' * P + p) * CW + f``; else -1. A lower-bound
    binary search of ``STEPS`` halvings over that range (at most ``NC`` keys: a runtime
    count, one compilation for every length), not over all run starts: a few dependent
    loads per entry instead of ~20 (the launch was bound by their L2 traffic)."""
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = e < NE
    b = e // CE
    p, c = b // NC, b % NC
    sl = tl.load(slot_ptr + e, mask=m, other=-1)
    live = m & (sl >= 0)
    ps = p.to(tl.int64) * S + sl
    q = ps * NC + c
    lo = tl.load(lo_ptr + ps, mask=live, other=0).to(tl.int64)
    hi = tl.load(hi_ptr + ps, mask=live, other=0).to(tl.int64)
    n = hi - lo   # the search range [lo, lo + n)
    step = 0
    while step < STEPS:   # a while: the interpreter's range() refuses a runtime bound
        step += 1
        half = n // 2
        mid = lo + half
        k = tl.load(skey_ptr + mid, mask=live & (n > 0), other=0).to(tl.int64)
        right = (n > 0) & (k < q)
        lo = tl.where(right, mid + 1, lo)
        n = tl.where(right, n - half - 1, half)
    found = live & (lo < hi)   # a key of the entry's own (stream, slot), at least its own
    pos = tl.load(order_ptr + lo, mask=found, other=0)
    bw, f = pos // CW, pos % CW
    row = ((bw % NC) * P + bw // NC) * CW + f
    tl.store(src_ptr + e, tl.where(found, row, -1).to(tl.int32), mask=m)


@triton.jit
def _table_runs_kernel(run_slot_ptr, table_ptr, S, NC, P, N, CW: tl.constexpr,
                       BLOCK: tl.constexpr):
    """``table[b, slot] = `` the log row of the run starting at each write position of
    segment ``b = p * NC + c`` (the table is ``[P, NC, S]``): one run per (stream, slot,
    chunk), so one writer per place."""
    pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = pos < N
    rs = tl.load(run_slot_ptr + pos, mask=m, other=-1)
    b, f = pos // CW, pos % CW
    row = ((b % NC) * P + b // NC) * CW + f   # the forward's log layout (c * P + p)
    tl.store(table_ptr + b.to(tl.int64) * S + rs, row, mask=m & (rs >= 0))


@triton.jit(do_not_specialize=["NC"])
def _table_scan_kernel(table_ptr, S, NC, NONE: tl.constexpr, SB: tl.constexpr,
                       CB: tl.constexpr):
    """Each (stream, slot) column of the table ``[P, NC, S]`` becomes its reverse running
    minimum over the chunks: at chunk ``c`` the first run's row at or after ``c`` (rows
    grow with the chunk). Grid ``(P, cdiv(S, SB))``; tiles of ``CB`` chunks from the last,
    a column's minimum so far carried between them (a runtime count of tiles)."""
    p = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1) * SB + tl.arange(0, SB)
    sm = s < S
    r = tl.arange(0, CB)
    carry = tl.full([SB], NONE, tl.int32)
    c0 = (NC - 1) // CB * CB
    while c0 >= 0:   # the interpreter's range() refuses a runtime bound
        c = c0 + r
        m = (c < NC)[:, None] & sm[None, :]
        at = table_ptr + (p * NC + c)[:, None] * S + s[None, :]
        x = tl.minimum(tl.load(at, mask=m, other=NONE), carry[None, :])
        x = tl.associative_scan(x, 0, _min_fn, reverse=True)
        tl.store(at, x, mask=m)
        carry = tl.min(x, axis=0)
        c0 -= CB


@triton.jit
def _table_gather_kernel(slot_ptr, table_ptr, src_ptr, S, NE, NONE: tl.constexpr,
                         CE: tl.constexpr, BLOCK: tl.constexpr):
    """Each entry's source: its segment's place of the scanned table at its slot, -1
    where no run comes at or after its chunk (the final bank's row) or it touches none."""
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = e < NE
    sl = tl.load(slot_ptr + e, mask=m, other=-1)
    live = m & (sl >= 0)
    row = tl.load(table_ptr + (e // CE).to(tl.int64) * S + sl, mask=live, other=NONE)
    tl.store(src_ptr + e, tl.where(live & (row != NONE), row, -1), mask=m)


def _dense_fits(pl, S: int) -> bool:
    return pl.P * pl.NC * S <= DENSE_MAX * pl.B * pl.C * pl.W


def _dense_sources(pl, S: int) -> Tensor:
    B, C, W, E, P, NC = pl.B, pl.C, pl.W, pl.E, pl.P, pl.NC
    dev = pl.slot.device
    N, NE = B * C * W, B * C * E
    # [P, NC, S], allocated flat: a traced call would guard on NC being 1 (design.md, traced shapes)
    table = torch.full((P * NC * S,), NONE, dtype=torch.int32, device=dev)
    launch(_table_runs_kernel, (triton.cdiv(N, BLOCK),), pl.runs.slot, table, S, NC, P, N,
           CW=C * W, BLOCK=BLOCK)
    launch(_table_scan_kernel, (P, triton.cdiv(S, SCAN_SLOTS)), table, S, NC, NONE=NONE,
           SB=SCAN_SLOTS, CB=SCAN_CHUNKS)
    src = torch.empty(B, C, E, dtype=torch.int32, device=dev)
    launch(_table_gather_kernel, (triton.cdiv(NE, BLOCK),), pl.slot, table, src, S, NE,
           NONE=NONE, CE=C * E, BLOCK=BLOCK)
    return src


def key_dtype(pl, S: int):
    """The sort keys' dtype; the undo log's rows must have int32 indices (the sources'
    dtype). Symbolic sizes make the bound a runtime check, as the queue walks' tickets."""
    rows = pl.NC * pl.P * pl.C * pl.W
    torch._check(rows < 2 ** 31, lambda: f"sdm: the undo log's {rows} rows exceed the int32 "
                 "sources of the backward: split the sequence")
    # int32 keys when (stream, slot, chunk) fits (by ``holds``, as Phase 1's sort keys)
    return torch.int32 if holds(pl.P * S * pl.NC < 2 ** 31) else torch.int64


def chunk_start_sources(pl, S: int, dense: bool | None = None) -> Tensor:
    """``[B, C, E]`` int32 for the entries of plan ``pl`` (``phase1.Plan``, with its runs)
    on a bank of ``S`` rows: the undo-log row (``(c * P + p) * C * W + run start``, the
    forward's layout, ``quant.UndoLog``) that holds the entry's chunk-start row, or -1
    where that is the final bank's row ``pl.slot`` (also where the entry touches nothing).
    ``dense``: the table form or the sorted one (None: the table where it fits)."""
    kdt = key_dtype(pl, S)
    if dense is None:
        dense = _dense_fits(pl, S)
    if dense:
        return _dense_sources(pl, S)
    B, C, W, E = pl.B, pl.C, pl.W, pl.E
    N, NE = B * C * W, B * C * E
    keys = torch.empty(N, dtype=kdt, device=pl.slot.device)
    launch(_run_keys_kernel, (triton.cdiv(N, BLOCK),), pl.runs.slot, keys, S, pl.NC, N,
           CW=C * W, BLOCK=BLOCK)
    # the run starts are unique keys (one run per written slot and chunk): any sort will do
    skey, order = torch.sort(keys)
    # each (stream, slot)'s range of sorted keys; zeros: empty ranges (slots never written)
    ranges = torch.zeros(2, pl.P * S, dtype=torch.int32, device=pl.slot.device)
    launch(_ranges_kernel, (triton.cdiv(N, BLOCK),), skey, ranges[0], ranges[1], N, pl.NC,
           pl.P * S, BLOCK=BLOCK)
    src = torch.empty(B, C, E, dtype=torch.int32, device=pl.slot.device)
    launch(_search_kernel, (triton.cdiv(NE, BLOCK),), pl.slot, ranges[0], ranges[1], order, src,
           skey, S, pl.NC, pl.P, NE, int(pl.NC).bit_length(), CE=C * E, CW=C * W, BLOCK=BLOCK)
    return src
