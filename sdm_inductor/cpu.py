"""The chunked form of SDM (docs/spec.md section 3) in plain torch: the CPU implementation.

Work is organised in *segments*: one segment is one chunk of ``C`` tokens of one
stream. Phase 1 (no bank needed) runs vectorised over a block of chunks of all
streams: per-slot cumulative log-decays, the Gram matrices ``A`` and ``QK`` by
sparse intersection, and the grouping of each chunk's written slots. Phase 2 walks
the chunks in order: gather the chunk's starting rows, solve, read, and write every
distinct touched row exactly once. The backward recomputes Phase 1 per block and
walks the chunks in reverse on a copy of the final bank, putting back each chunk's
written rows from the undo log (optionally quantized) that the forward saved.

Sparse intersections are enumerated as *pairs* of entries with equal keys, where the
key of an entry is ``segment * S + slot``: entries of different segments never meet, and
padded entries get private keys past ``B * S`` (after every real key) so they touch
nothing.
Per-pair sums are small and exact in fp32 (no long cumsum, spec section 3), and every
reduction is a sequential CPU ``index_add_``, so results are bitwise reproducible.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from . import quant
from .gates import LOG_DECAY_FLOOR
from .validation import no_work

NAME = "cpu-chunked"

# A call with no backward and at most this many tokens runs the token loop (``_decode``).
DECODE_MAX_T = 8

# Phase 1 of this many entries (tokens x slots) at once bounds working memory.
_BLOCK_ENTRIES = 1 << 18


@dataclass
class _Pairs:
    left: Tensor   # flat entry index on the left side
    right: Tensor  # flat write-entry index with the same key


def _pairs(lo: Tensor, counts: Tensor, order: Tensor) -> _Pairs:
    """All (left, right) with equal keys, given for each left entry the range
    ``[lo, lo + counts)`` of its equal keys in the sorted right entries."""
    left = torch.repeat_interleave(torch.arange(lo.numel(), device=lo.device), counts)
    starts = torch.cumsum(counts, 0) - counts
    within = torch.arange(left.numel(), device=lo.device) - starts.index_select(0, left)
    return _Pairs(left, order.index_select(0, lo.index_select(0, left) + within))


@dataclass
class _Block:
    """Phase 1 of a block of chunks: everything that needs no bank."""
    n_seg: int
    kidx: Tensor     # [B, C, W] long, bank rows (padded tokens: row 0)
    qidx: Tensor     # [B, C, R] long
    rows_idx: Tensor  # [B, C, W + R] long, the rows a chunk gathers (writes, then reads)
    k: Tensor        # [B, C, W] fp32, dense-key weights (0 for repeats, padding)
    q: Tensor        # [B, C, R] fp32
    beta: Tensor     # [B, C] fp32
    v: Tensor        # [B, C, hd] fp32
    first: Tensor    # [B, C, W] first occurrence of each entry's slot in its token
    active: Tensor   # [B, C, W] bool, entry is a first occurrence
    gam: Tensor      # [B, C, W] cumulative log-decay of the entry's slot at its token
    gend: Tensor     # [B, C, W] same at the end of the chunk
    gamq: Tensor     # [B, C, R] cumulative log-decay of a read slot at its token
    ek: Tensor       # [B, C, W] k * exp(gam): weight of a starting row in r0
    eq: Tensor       # [B, C, R] q * exp(gamq): weight of a starting row in the reading
    coef: Tensor     # [B, C, W] k * exp(gend - gam): weight of delta in the final row
    mix: Tensor      # [B, C, 2, W + R] rows -> (beta * r0, inter) in one batched matmul
    A: Tensor        # [B, C, C]
    QK: Tensor       # [B, C, C]
    X: Tensor        # [B, C, C] (I + tril(beta A, -1))^-1
    ww: _Pairs       # write-write pairs (same key)
    rw: _Pairs       # read-write pairs (same key)
    gid: Tensor      # [B*C*W] group of each write entry, local to its chunk (padding: n)
    rep: Tensor      # [n_groups] first entry of each group, local to its chunk
    rep_row: Tensor  # [n_groups] the same entry's row in the chunk's gathered rows
    slot: Tensor     # [n_groups] bank row of each group
    decay: Tensor    # [n_groups] exp(gend) of each group
    log_pos: Tensor  # [n_groups] the group's undo-log row in the block (None: not needed)
    chunk_groups: list  # group range of chunk c: [chunk_groups[c], chunk_groups[c + 1])


def _phase1(kidx, kval, g, qidx, qval, beta, v, valid, S: int, P: int,
            log: bool = True) -> _Block:
    """Phase 1 over segments [B, C, *] (chunk-major: segment = chunk * P + stream);
    ``log``: also the groups' undo-log rows (a saving forward, the backward)."""
    B, C, W = kidx.shape
    R = qidx.shape[-1]
    dev = kidx.device
    # dense-key meaning of repeated slots within a token (spec section 1)
    first = (kidx[..., :, None] == kidx[..., None, :]).int().argmax(-1)
    active = (first == torch.arange(W, device=dev)) & valid[..., None]
    k = torch.zeros_like(kval).scatter_add_(-1, first, kval) * active
    gflat = (g.expand(B, C, W) * active).reshape(-1)
    q = qval * valid[..., None]

    # keys: segment-major so that each chunk's groups are contiguous; padded write
    # entries get private keys after every real one (they touch nothing)
    seg = torch.arange(B, device=dev)[:, None, None] * S
    pad_key = B * S + torch.arange(B * C * W, device=dev).view(B, C, W)
    flat_kw = torch.where(valid[..., None], kidx + seg, pad_key).reshape(-1)
    sorted_kw, order = torch.sort(flat_kw, stable=True)
    # groups of equal written keys, in key order; chunk c owns a contiguous range
    group_keys, gid_sorted, group_size = torch.unique_consecutive(
        sorted_kw, return_inverse=True, return_counts=True)
    group_start = torch.cumsum(group_size, 0) - group_size
    gid = torch.empty_like(gid_sorted).scatter_(0, order, gid_sorted)
    ww = _pairs(group_start.index_select(0, gid), group_size.index_select(0, gid), order)
    key_r = (qidx + seg).reshape(-1)
    lo = torch.searchsorted(sorted_kw, key_r).clamp_(max=sorted_kw.numel() - 1)
    hit = sorted_kw.index_select(0, lo) == key_r
    rw = _pairs(lo, group_size.index_select(0, gid_sorted.index_select(0, lo)) * hit, order)

    tok_w = torch.arange(C, device=dev).view(1, C, 1).expand(B, C, W).reshape(-1)
    tok_r = torch.arange(C, device=dev).view(1, C, 1).expand(B, C, R).reshape(-1)
    seg_w = torch.arange(B, device=dev).view(B, 1, 1).expand(B, C, W).reshape(-1)
    seg_r = torch.arange(B, device=dev).view(B, 1, 1).expand(B, C, R).reshape(-1)

    # cumulative decays: sums over same-key entries at or before the token
    wl, wr = tok_w.index_select(0, ww.left), tok_w.index_select(0, ww.right)
    g_right = gflat.index_select(0, ww.right)
    gam = torch.zeros_like(gflat).index_add_(0, ww.left, g_right * (wr <= wl))
    gend = torch.zeros_like(gflat).index_add_(0, ww.left, g_right)
    rl = tok_r.index_select(0, rw.left)
    causal_rw = tok_w.index_select(0, rw.right) <= rl
    gamq = torch.zeros(B * C * R, device=dev).index_add_(
        0, rw.left, gflat.index_select(0, rw.right) * causal_rw)

    kflat, qflat = k.reshape(-1), q.reshape(-1)
    neg_inf = torch.tensor(float("-inf"), device=dev)
    # masked pairs contribute exp(-inf) = 0 (never inf * 0)
    e = torch.exp(torch.where(wr < wl, gam.index_select(0, ww.left) - gam.index_select(0, ww.right), neg_inf))
    A = torch.zeros(B * C * C, device=dev).index_add_(
        0, seg_w.index_select(0, ww.left) * C * C + wl * C + wr, kflat.index_select(0, ww.left) * kflat.index_select(0, ww.right) * e)
    e = torch.exp(torch.where(causal_rw, gamq.index_select(0, rw.left) - gam.index_select(0, rw.right), neg_inf))
    QK = torch.zeros(B * C * C, device=dev).index_add_(
        0, seg_r.index_select(0, rw.left) * C * C + rl * C + tok_w.index_select(0, rw.right), qflat.index_select(0, rw.left) * kflat.index_select(0, rw.right) * e)
    A, QK = A.view(B, C, C), QK.view(B, C, C)
    beta = beta * valid
    eye = torch.eye(C, device=dev)
    X = torch.linalg.solve_triangular(eye + torch.tril(beta[..., None] * A, -1), eye.expand(B, C, C),
                                      upper=False, unitriangular=True)

    bounds = torch.searchsorted(group_keys, torch.arange(0, B + 1, P, device=dev) * S).tolist()
    n_chunks = B // P
    chunk_of_entry = torch.arange(B * C * W, device=dev) // (P * C * W)
    counts = torch.tensor([b - a for a, b in zip(bounds[:-1], bounds[1:])], device=dev)
    g0 = torch.tensor(bounds[:-1], device=dev).index_select(0, chunk_of_entry)
    n_of = counts.index_select(0, chunk_of_entry)
    gid = torch.where(valid[..., None].expand(B, C, W).reshape(-1), gid - g0, n_of)
    n_real = bounds[-1]
    rep = order.index_select(0, group_start[:n_real])  # stable sort: first entry of each group
    group_chunk = torch.repeat_interleave(torch.arange(n_chunks, device=dev), counts)
    rep_local = rep - group_chunk * (P * C * W)
    log_pos = _log_positions(group_keys[:n_real], gid_sorted, order, active, S) if log else None
    gam3, gend3, gamq3 = gam.view(B, C, W), gend.view(B, C, W), gamq.view(B, C, R)
    ek, eq = k * torch.exp(gam3), q * torch.exp(gamq3)
    return _Block(
        B, kidx, qidx, torch.cat([kidx, qidx], -1), k, q, beta, v, first, active,
        gam3, gend3, gamq3, ek, eq, k * torch.exp(gend3 - gam3), _mix(beta, ek, eq),
        A, QK, X, ww, rw, gid, rep_local,
        torch.div(rep_local, W, rounding_mode="floor") * (W + R) + rep_local % W,
        kidx.reshape(-1).index_select(0, rep), torch.exp(gend.index_select(0, rep)), log_pos,
        bounds)


def _log_positions(group_keys, gid_sorted, order, active, S: int) -> Tensor:
    """Undo-log row of each (real) group: the number of active write entries (first
    occurrences in their token) of its segment with a smaller slot, i.e. its run's start
    in the slot order of the CUDA write pass (``quant.UndoLog``)."""
    B, C, W = active.shape
    n_real = group_keys.numel()
    dev = group_keys.device
    act = torch.zeros(gid_sorted.numel(), dtype=torch.long, device=dev).index_add_(
        0, gid_sorted, active.reshape(-1).index_select(0, order).long())[:n_real]
    before = torch.cumsum(act, 0) - act
    group_seg = torch.div(group_keys, S, rounding_mode="floor")
    seg_first = torch.searchsorted(group_keys, torch.arange(B, device=dev) * S)
    seg_base = torch.cat([before, act.sum().view(1)]).index_select(0, seg_first)
    return group_seg * (C * W) + before - seg_base.index_select(0, group_seg)


def _mix(beta: Tensor, ek: Tensor, eq: Tensor) -> Tensor:
    """Weights that turn a chunk's gathered rows [W + R, hd] into (beta * r0, inter)."""
    B, C, W = ek.shape
    mix = ek.new_zeros(B, C, 2, W + eq.shape[-1])
    mix[:, :, 0, :W] = beta[..., None] * ek
    mix[:, :, 1, W:] = eq
    return mix


def _segments(x: Tensor, C: int, n_chunks: int, fill=0):
    """[P, T, *] -> [n_chunks * P, C, *] chunk-major, padding T up to n_chunks * C."""
    P, T = x.shape[:2]
    pad = n_chunks * C - T
    if pad:
        x = torch.cat([x, x.new_full((P, pad) + x.shape[2:], fill)], 1)
    x = x.reshape(P, n_chunks, C, *x.shape[2:]).transpose(0, 1)
    return x.reshape(n_chunks * P, C, *x.shape[3:])


class _Inputs:
    """Inputs cut into segments, block by block (only a block lives at a time)."""

    def __init__(self, k_idx, k_val, v, beta, g, q_idx, q_val, C: int, S: int):
        self.P, self.T, self.W = k_idx.shape
        self.R = q_idx.shape[-1]
        self.hd = v.shape[-1]
        self.C, self.S = C, S
        self.n_chunks = max(1, math.ceil(self.T / C))
        per_chunk = self.P * C * max(self.W, self.R)
        self.chunks_per_block = max(1, min(self.n_chunks, _BLOCK_ENTRIES // per_chunk))
        self.raw = (k_idx, k_val, v, beta, g, q_idx, q_val)

    def blocks(self):
        return range(0, self.n_chunks, self.chunks_per_block)

    def block(self, c0: int, log: bool = True) -> _Block:
        c1 = min(self.n_chunks, c0 + self.chunks_per_block)
        t0, t1 = c0 * self.C, min(self.T, c1 * self.C)
        n = c1 - c0
        k_idx, k_val, v, beta, g, q_idx, q_val = (x[:, t0:t1] for x in self.raw)
        valid = torch.ones(self.P, t1 - t0, dtype=torch.bool, device=k_idx.device)
        seg = lambda x: _segments(x, self.C, n)
        # gates floored: a full forget (-inf) without inf - inf in the cumulative decays
        g = g.float().clamp(min=LOG_DECAY_FLOOR)
        return _phase1(seg(k_idx.long()), seg(k_val.float()), seg(g),
                       seg(q_idx.long()), seg(q_val.float()), seg(beta.float()),
                       seg(v.float()), seg(valid), self.S, self.P, log)


def _forward_chunk(blk: _Block, s: slice, rows: Tensor):
    """Phase 2 maths of one chunk given its starting rows [P, C, W+R, hd] (fp32)."""
    W = blk.k.shape[-1]
    M0w, M0q = rows[:, :, :W], rows[:, :, W:]
    r0 = (blk.ek[s][..., None] * M0w).sum(2)
    u = blk.beta[s][..., None] * (blk.v[s] - r0)
    delta = blk.X[s] @ u
    return M0w, M0q, r0, u, delta


def _gather(bank: Tensor, rows_idx: Tensor, n_valid: int) -> Tensor:
    """A chunk's rows ``[P, C, W + R, hd]``; those of padded tokens (from ``n_valid`` on)
    are zeros, not the row 0 their indices point at: a row of another stream, whose
    non-finite values would otherwise reach this stream through 0 * inf."""
    P, C, E = rows_idx.shape
    rows = bank.index_select(0, rows_idx.reshape(-1)).view(P, C, E, bank.shape[1])
    if n_valid < C:
        rows[:, n_valid:] = 0
    return rows


def _groups(blk: _Block, c: int, P: int):
    """Chunk c's distinct written rows: (entry -> group, rep entry, the rep entry's row in
    the gathered rows, bank row, decay, count)."""
    C, W = blk.k.shape[1:]
    n = P * C * W
    g0, g1 = blk.chunk_groups[c], blk.chunk_groups[c + 1]
    return (blk.gid[c * n:(c + 1) * n], blk.rep[g0:g1], blk.rep_row[g0:g1], blk.slot[g0:g1],
            blk.decay[g0:g1], g1 - g0)


def _log_rows(blk: _Block, c: int, c0: int, P: int) -> Tensor:
    """Flat undo-log positions of chunk c's distinct written rows (block starting at c0)."""
    C, W = blk.k.shape[1:]
    g0, g1 = blk.chunk_groups[c], blk.chunk_groups[c + 1]
    return c0 * P * C * W + blk.log_pos[g0:g1]


def _decode(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, readings: Tensor):
    """The token loop of spec section 1 for a short call with no backward (a decode step),
    the P streams of a token at once, in fp32 like the chunked form: the chunked form's
    fixed cost (Phase 1's bookkeeping, ~1 ms) is most of such a call. A slot repeated in
    a token takes the dense-key meaning, as in the chunked form: its weights add up in its
    first occurrence, which alone decays (by its own gate) and is written."""
    P, T, W = k_idx.shape
    entry = torch.arange(W, device=bank.device)
    for t in range(T):
        idx = k_idx[:, t].long()                                       # [P, W]
        first = (idx[:, :, None] == idx[:, None, :]).int().argmax(-1)  # first occurrence
        kv = torch.zeros(P, W, device=bank.device).scatter_add_(1, first, k_val[:, t].float())
        # (a gate at or below LOG_DECAY_FLOOR has exp 0 in fp32 already: no floor needed)
        decay = g[:, t].float().exp().expand(P, W)
        decayed = bank[idx].float() * decay[..., None]                 # [P, W, hd]
        retrieved = torch.bmm(kv[:, None], decayed)[:, 0]
        delta = beta[:, t, None].float() * (v[:, t].float() - retrieved)
        new = torch.baddbmm(decayed, kv[..., None], delta[:, None])
        written = first == entry
        bank.index_copy_(0, idx[written], new[written].to(bank.dtype))
        rows = bank[q_idx[:, t].long()].float()                        # read after the write
        readings[:, t] = torch.bmm(q_val[:, t, None].float(), rows)[:, 0].to(bank.dtype)


def forward(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size: int,
            snapshot_quant: str, save: bool):
    """Advance ``bank`` in place; return (readings [P,T,hd], saved rows, saved scales).

    The saved rows are the undo log (``quant.UndoLog``): the chunk-start value of each
    distinct row a chunk writes, which is the old row its write pass reads anyway."""
    S, hd = bank.shape
    P, T, W = k_idx.shape
    R, C = q_idx.shape[2], chunk_size
    readings = torch.empty(P, T, hd, dtype=bank.dtype, device=bank.device)
    # sized like ops._saved_shapes: no rows at T = 0
    store = quant.UndoLog(-(-T // C) * P * C, W, hd, bank.dtype, snapshot_quant,
                          bank.device, enabled=save)
    from .ops import record_dispatch   # (ops imports this module)
    path = ("empty" if no_work(bank, k_idx) else
            "decode" if not save and T <= DECODE_MAX_T else "chunked")
    record_dispatch(kernel_path=path)
    if path == "empty":
        return readings, *store.tensors()
    if path == "decode":
        _decode(bank, k_idx, k_val, v, beta, g, q_idx, q_val, readings)
        return readings, *store.tensors()
    inp = _Inputs(k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, S)
    for c0 in inp.blocks():
        blk = inp.block(c0, log=save)
        for c in range(blk.n_seg // P):
            s = slice(c * P, (c + 1) * P)
            rows = _gather(bank, blk.rows_idx[s], T - (c0 + c) * C).view(P * C, W + R, hd)
            gid, _, rep_row, slot, decay, n_groups = _groups(blk, c, P)
            if save:
                store.put(_log_rows(blk, c, c0, P), rows.view(-1, hd).index_select(0, rep_row))
            rows = rows.float()
            # one batched matmul gives beta * r0 and the readings' inter-chunk part
            r0b, inter = torch.bmm(blk.mix[s].reshape(P * C, 2, W + R), rows).view(
                P, C, 2, hd).unbind(2)
            delta = blk.X[s] @ (blk.beta[s][..., None] * blk.v[s] - r0b)
            y = torch.baddbmm(inter, blk.QK[s], delta)
            t0 = (c0 + c) * C
            n = min(C, T - t0)
            readings[:, t0:t0 + n] = y[:, :n]
            # M_end of each distinct written row, written exactly once
            contrib = (blk.coef[s][..., None] * delta[:, :, None, :]).reshape(-1, hd)
            acc = torch.zeros(n_groups + 1, hd, device=bank.device).index_add_(0, gid, contrib)
            new = decay[:, None] * rows.view(-1, hd).index_select(0, rep_row) + acc[:n_groups]
            bank.index_copy_(0, slot, new.to(bank.dtype))
    return readings, *store.tensors()


def backward(grad_readings: Tensor, grad_final: Tensor, final_bank: Tensor, saved_rows: Tensor,
             saved_scales: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size: int,
             snapshot_quant: str, grad_bank_fp32: bool):
    """Gradients (bank, k_val, v, beta, g, q_val) by walking the chunks in reverse.

    The chunk-start bank is rebuilt on a copy of ``final_bank``: before chunk c, its
    written rows get their chunk-start values back from the undo log; every other row
    already holds its value at the start of chunk c."""
    S, hd = grad_final.shape
    bank_dtype = grad_final.dtype
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    acc_dtype = torch.float32 if (grad_bank_fp32 or bank_dtype == torch.float32) else bank_dtype
    dB = grad_final.to(acc_dtype, copy=True)
    dk_val = torch.zeros(P, T, W)
    dv = torch.zeros(P, T, hd)
    dbeta = torch.zeros(P, T)
    dg_full = torch.zeros(P, T, W)
    dq_val = torch.zeros(P, T, R)
    if no_work(grad_final, k_idx):
        return (dB.to(bank_dtype), dk_val.to(k_val.dtype), dv.to(v.dtype), dbeta.to(beta.dtype),
                torch.zeros_like(g), dq_val.to(q_val.dtype))
    inp = _Inputs(k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, S)
    C = inp.C
    store = quant.UndoLog.from_tensors(saved_rows, saved_scales, hd, snapshot_quant)
    work = final_bank.clone()
    dy_all = grad_readings.float()
    for c0 in reversed(list(inp.blocks())):
        blk = inp.block(c0)
        n_chunks = blk.n_seg // P
        grads = _BlockGrads(blk.n_seg, C, W, R, hd)
        for c in reversed(range(n_chunks)):
            t0 = (c0 + c) * C
            n = min(C, T - t0)
            dy = torch.zeros(P, C, hd)
            dy[:, :n] = dy_all[:, t0:t0 + n]
            slot = _groups(blk, c, P)[3]
            work.index_copy_(0, slot, store.get(_log_rows(blk, c, c0, P)).to(work.dtype))
            s = slice(c * P, (c + 1) * P)
            rows = _gather(work, blk.rows_idx[s], n).float()
            _chunk_backward(blk, c, P, rows, dy, dB, grads)
        dk, dq, dgw = _pair_backward(blk, grads)
        # back from the dense-key entries to the user's entries
        dk = torch.gather(dk, -1, blk.first)
        dgw = dgw * blk.active
        t0, t1 = c0 * C, min(T, (c0 + n_chunks) * C)
        unseg = lambda x: _unsegment(x, P, n_chunks, t1 - t0)
        dk_val[:, t0:t1] = unseg(dk)
        dq_val[:, t0:t1] = unseg(dq)
        dg_full[:, t0:t1] = unseg(dgw)
        dv[:, t0:t1] = unseg(grads.dv)
        dbeta[:, t0:t1] = unseg(grads.dbeta)
    dg = dg_full if g.shape[-1] == W else dg_full.sum(-1, keepdim=True)
    return (dB.to(bank_dtype), dk_val.to(k_val.dtype), dv.to(v.dtype), dbeta.to(beta.dtype),
            dg.to(g.dtype), dq_val.to(q_val.dtype))


def _unsegment(x: Tensor, P: int, n_chunks: int, T: int) -> Tensor:
    """[n_chunks * P, C, *] -> [P, T, *] (drops padding)."""
    C = x.shape[1]
    x = x.reshape(n_chunks, P, C, *x.shape[2:]).transpose(0, 1)
    return x.reshape(P, n_chunks * C, *x.shape[3:])[:, :T]


class _BlockGrads:
    """Per-entry gradients gathered by phase-2 backward, consumed by the pair backward."""

    def __init__(self, B, C, W, R, hd):
        self.dA = torch.zeros(B, C, C)
        self.dQK = torch.zeros(B, C, C)
        self.dek = torch.zeros(B, C, W)    # d loss / d (k * exp(gam))
        self.deq = torch.zeros(B, C, R)    # d loss / d (q * exp(gamq))
        self.dcoef = torch.zeros(B, C, W)  # d loss / d (k * exp(gend - gam))
        self.dgend = torch.zeros(B * C * W)  # direct, from the decay of M0 rows
        self.dv = torch.zeros(B, C, hd)
        self.dbeta = torch.zeros(B, C)


def _chunk_backward(blk: _Block, c: int, P: int, rows, dy, dB: Tensor, gr: _BlockGrads):
    s = slice(c * P, (c + 1) * P)
    hd = rows.shape[-1]
    M0w, M0q, r0, u, delta = _forward_chunk(blk, s, rows)
    _, rep, rep_row, slot, decay, _ = _groups(blk, c, P)

    Dw = dB.index_select(0, blk.kidx[s].reshape(-1)).float().view(M0w.shape)  # dL/dM_end per entry
    gr.dcoef[s] = (Dw * delta[:, :, None, :]).sum(-1)
    ddelta = (blk.coef[s][..., None] * Dw).sum(2) + blk.QK[s].transpose(-1, -2) @ dy
    gr.dQK[s] = torch.tril(dy @ delta.transpose(-1, -2))
    D_rep = Dw.reshape(-1, hd).index_select(0, rep)
    gr.dgend[c * P * M0w.shape[1] * M0w.shape[2] + rep] = (
        D_rep * decay[:, None] * rows.reshape(-1, hd).index_select(0, rep_row)).sum(-1)
    gr.deq[s] = (dy[:, :, None, :] * M0q).sum(-1)
    dM0q = blk.eq[s][..., None] * dy[:, :, None, :]

    du = blk.X[s].transpose(-1, -2) @ ddelta
    dL = torch.tril(-(du @ delta.transpose(-1, -2)), -1)
    beta = blk.beta[s]
    gr.dA[s] = beta[..., None] * dL
    gr.dbeta[s] = (blk.A[s] * dL).sum(-1) + ((blk.v[s] - r0) * du).sum(-1)
    gr.dv[s] = beta[..., None] * du
    dr0 = -beta[..., None] * du
    gr.dek[s] = (dr0[:, :, None, :] * M0w).sum(-1)
    dM0w = blk.ek[s][..., None] * dr0[:, :, None, :]

    # the bank gradient at the chunk start: written rows are replaced by their decay term
    dB.index_copy_(0, slot, (decay[:, None] * D_rep).to(dB.dtype))
    dM0 = torch.cat([dM0w, dM0q], 2).reshape(-1, hd)
    dB.index_add_(0, blk.rows_idx[s].reshape(-1), dM0.to(dB.dtype))


def _pair_backward(blk: _Block, gr: _BlockGrads):
    """Gradients of the Phase 1 quantities back to k, q and the per-entry gates."""
    B, C, W = blk.k.shape
    R = blk.q.shape[-1]
    k, q = blk.k.reshape(-1), blk.q.reshape(-1)
    gam, gend, gamq = blk.gam.reshape(-1), blk.gend.reshape(-1), blk.gamq.reshape(-1)
    eg, egq, ec = torch.exp(gam), torch.exp(gamq), torch.exp(gend - gam)
    dek, deq, dcoef = gr.dek.reshape(-1), gr.deq.reshape(-1), gr.dcoef.reshape(-1)
    dk = dek * eg + dcoef * ec
    dgam = dek * k * eg - dcoef * k * ec
    dgend = gr.dgend + dcoef * k * ec
    dq = deq * egq
    dgamq = deq * q * egq

    tok_w = torch.arange(C).view(1, C, 1).expand(B, C, W).reshape(-1)
    tok_r = torch.arange(C).view(1, C, 1).expand(B, C, R).reshape(-1)
    seg_w = torch.arange(B).view(B, 1, 1).expand(B, C, W).reshape(-1)
    seg_r = torch.arange(B).view(B, 1, 1).expand(B, C, R).reshape(-1)
    ww, rw = blk.ww, blk.rw
    neg_inf = torch.tensor(float("-inf"))

    a, b = ww.left, ww.right
    wl, wr = tok_w.index_select(0, a), tok_w.index_select(0, b)
    e = torch.exp(torch.where(wr < wl, gam.index_select(0, a) - gam.index_select(0, b), neg_inf))
    d = gr.dA.reshape(-1).index_select(0, seg_w.index_select(0, a) * C * C + wl * C + wr) * e
    dk.index_add_(0, a, d * k.index_select(0, b))
    dk.index_add_(0, b, d * k.index_select(0, a))
    t = d * k.index_select(0, a) * k.index_select(0, b)
    dgam.index_add_(0, a, t)
    dgam.index_add_(0, b, -t)

    r, b = rw.left, rw.right
    rl, rr = tok_r.index_select(0, r), tok_w.index_select(0, b)
    causal_rw = rr <= rl
    e = torch.exp(torch.where(causal_rw, gamq.index_select(0, r) - gam.index_select(0, b), neg_inf))
    d = gr.dQK.reshape(-1).index_select(0, seg_r.index_select(0, r) * C * C + rl * C + rr) * e
    dq.index_add_(0, r, d * k.index_select(0, b))
    dk.index_add_(0, b, d * q.index_select(0, r))
    t = d * q.index_select(0, r) * k.index_select(0, b)
    dgamq.index_add_(0, r, t)
    dgam.index_add_(0, b, -t)

    # gates: each cumulative decay is a sum of same-key gates at or before its token
    dg = torch.zeros_like(k)
    dg.index_add_(0, ww.right, dgam.index_select(0, ww.left) * (wr <= wl) + dgend.index_select(0, ww.left))
    dg.index_add_(0, rw.right, dgamq.index_select(0, rw.left) * causal_rw)
    return dk.view(B, C, W), dq.view(B, C, R), dg.view(B, C, W)
