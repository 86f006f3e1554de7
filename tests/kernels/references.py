"""Torch forms of Phase 1's group structures, the references the kernel tests compare
the Triton launches against."""
from __future__ import annotations

import torch
from torch import Tensor

from sdm_inductor.kernels.phase1 import Groups
from sdm_inductor.kernels.backward.sources import key_dtype as source_key_dtype


def reference_groups(pl, pack: int = 2) -> Groups:
    """``entry_groups`` in torch ops."""
    B, C, E = pl.B, pl.C, pl.E
    CE = C * E
    perm = pl.perm.long()
    take = lambda x: x.reshape(B, CE).gather(1, perm)
    at = torch.arange(CE, device=perm.device).expand(B, CE)
    start = take(pl.gs) == at
    slot = torch.where(start, take(pl.slot), -1)
    length = torch.where(start, take(pl.na), 0)
    n_w = torch.where(start, take(pl.nw), 0)
    decay = torch.where(n_w > 0, take(pl.decay), 1.0)
    pos = torch.where(start, at, -1)
    tok, ev = perm // E, take(pl.ev)
    tok0, ev0 = torch.where(start, tok, 0), torch.where(start, ev, 0.0)
    if pack:
        # a permutation of each row: the front groups to columns 0, 1, ..., the back
        # groups (pack 2: those of one member) to columns CE - 1, CE - 2, ..., the other
        # positions (whose headers are already the empty one) in between
        front = start & (length > 1) if int(pack) == 2 else start
        back = start & ~front
        n_front = front.sum(1, keepdim=True)
        rest = ~start
        dst = torch.where(front, front.cumsum(1) - 1,
                          torch.where(back, CE - back.cumsum(1), n_front + rest.cumsum(1) - 1))
        slot, length, n_w, decay, pos, tok0, ev0 = (
            torch.empty_like(x).scatter_(1, dst, x)
            for x in (slot, length, n_w, decay, pos, tok0, ev0))
    i32 = lambda x: x.to(torch.int32)
    return Groups(i32(slot), i32(length), i32(n_w), decay, i32(tok), ev, i32(pos), i32(tok0), ev0)


def search_groups(key: Tensor, skey: Tensor):
    """``gs, nw, na`` (entry order) by binary searches of the sorted keys."""
    even = key & ~1
    gs = torch.searchsorted(skey, even)
    nw = torch.searchsorted(skey, even, right=True) - gs
    na = torch.searchsorted(skey, even + 1, right=True) - gs
    return gs.to(torch.int32), nw.to(torch.int32), na.to(torch.int32)


def search_runs(key: Tensor, slot: Tensor, C: int, W: int, R: int):
    """The write runs' ``slot, length, tok`` and entry index (run order) by a second sort
    of the write keys and a binary search (what ``_groups_kernel``'s scans give)."""
    B, E = key.shape[0], W + R
    wkey = key.view(B, C, E)[:, :, :W].reshape(B, C * W)
    skey, wperm = torch.sort(wkey, dim=-1, stable=True)
    start = torch.ones_like(skey, dtype=torch.bool)
    start[:, 1:] = skey[:, 1:] != skey[:, :-1]
    pos = torch.arange(C * W, device=key.device)
    length = torch.searchsorted(skey, skey, right=True) - pos
    ent = (wperm // W) * E + wperm % W
    rslot = torch.where(start, slot.gather(1, ent), -1)
    return (rslot.to(torch.int32), torch.where(start & (rslot >= 0), length, 0).to(torch.int32),
            (wperm // W).to(torch.int32), ent.to(torch.int32))


def reference_sources(pl, S: int) -> Tensor:
    """``chunk_start_sources`` in torch ops (``torch.searchsorted``)."""
    kdt = source_key_dtype(pl, S)
    B, C, W, E, P, NC = pl.B, pl.C, pl.W, pl.E, pl.P, pl.NC
    CW = C * W
    dev = pl.slot.device
    b = torch.arange(B, device=dev)
    p, c = b // NC, b % NC
    stream = (p * S)[:, None]
    rs = pl.runs.slot.long()
    skey, order = torch.sort(torch.where(rs >= 0, (stream + rs) * NC + c[:, None], P * S * NC)
                             .to(kdt).view(-1))
    rows = ((c * P + p)[:, None] * CW + torch.arange(CW, device=dev)).view(-1)[order]
    es = pl.slot.view(B, C * E).long()
    q = torch.where(es >= 0, (stream + es) * NC + c[:, None], P * S * NC).to(kdt).view(-1)
    i = torch.searchsorted(skey, q).clamp_(max=skey.numel() - 1)
    hit = (skey[i] // NC == q // NC) & (es.view(-1) >= 0)
    return torch.where(hit, rows[i], -1).to(torch.int32).view(B, C, E)
