"""Where the backward's step walk finds each entry's chunk-start row: a row of the undo log,
or the final bank's row.

Walking the chunks in reverse, the backward needs at chunk ``c`` the bank as it was when
chunk ``c`` began, but only at the slots that chunk touches. Slot ``s`` held then what it
held just before the first write to it at or after ``c``: the old row that write saved to
the undo log, or, when nothing writes ``s`` from ``c`` on, the final bank's row. Neither
is written during the backward, so with these sources the walk needs no working copy of
the bank and no restore launch per chunk, which read every written row of the chunk from
the log and wrote it back into the copy (about 44 MB per chunk step at config A), and the
walk's row loads depend on nothing the walk itself writes.

One sort of the write runs' starts by (stream, slot, chunk) and one binary search per entry
give the sources: shapes-only host code, the same launches for every call of a shape.
"""
from __future__ import annotations

import torch
from torch import Tensor


def chunk_start_sources(pl, S: int) -> Tensor:
    """``[B, C, E]`` int32 for the entries of plan ``pl`` (``phase1.Plan``, with its runs)
    on a bank of ``S`` rows: the undo-log row (``(c * P + p) * C * W + run start``, the
    forward's layout, ``quant.UndoLog``) that holds the entry's chunk-start row, or -1
    where that is the final bank's row ``pl.slot`` (also where the entry touches nothing)."""
    B, C, W, E, P, NC = pl.B, pl.C, pl.W, pl.E, pl.P, pl.NC
    CW = C * W
    if NC * P * CW >= 2 ** 31:
        raise ValueError(f"the undo log's {NC * P * CW} rows do not fit int32 sources")
    dev = pl.slot.device
    b = torch.arange(B, device=dev)
    p, c = b // NC, b % NC
    # keys (p * S + slot) * NC + c: a slot's writes in chunk order within its stream; the
    # run starts are unique keys (one run per written slot and chunk), others sort last
    none = P * S * NC
    kdt = torch.int32 if none < 2 ** 31 else torch.int64
    stream = (p * S)[:, None]
    rs = pl.runs.slot.long()
    skey, order = torch.sort(torch.where(rs >= 0, (stream + rs) * NC + c[:, None], none)
                             .to(kdt).view(-1))
    rows = ((c * P + p)[:, None] * CW + torch.arange(CW, device=dev)).view(-1)[order]
    es = pl.slot.view(B, C * E).long()
    q = torch.where(es >= 0, (stream + es) * NC + c[:, None], none).to(kdt).view(-1)
    # the first write of the entry's slot at or after its chunk, if in its stream and slot
    i = torch.searchsorted(skey, q).clamp_(max=skey.numel() - 1)
    hit = (skey[i] // NC == q // NC) & (es.view(-1) >= 0)
    return torch.where(hit, rows[i], -1).to(torch.int32).view(B, C, E)
