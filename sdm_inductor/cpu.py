"""The chunked form of SDM (SDM_SPEC section 3) in plain torch: the CPU implementation.

Work is organised in *segments*: one segment is one chunk of ``C`` tokens of one
stream. Phase 1 (no bank needed) runs vectorised over a block of chunks of all
streams: per-slot cumulative log-decays, the Gram matrices ``A`` and ``QK`` by
sparse intersection, and the grouping of each chunk's written slots. Phase 2 walks
the chunks in order: gather the chunk's starting rows, solve, read, and write every
distinct touched row exactly once. The backward recomputes Phase 1 per block and
walks the chunks in reverse with the rows saved (optionally quantized) by the
forward.

Sparse intersections are enumerated as *pairs* of entries with equal keys, where the
key of an entry is ``segment * (S + C*W) + slot``: entries of different segments
never meet, and padded tokens get private keys past ``S`` so they touch nothing.
Per-pair sums are small and exact in fp32 (no long cumsum, spec section 3), and every
reduction is a sequential CPU ``index_add_``, so results are bitwise reproducible.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from . import quant

NAME = "cpu-chunked"

# Phase 1 of this many entries (tokens x slots) at once bounds working memory.
_BLOCK_ENTRIES = 1 << 18


@dataclass
class _Pairs:
    left: Tensor   # flat entry index on the left side
    right: Tensor  # flat write-entry index with the same key


def _pairs(left_keys: Tensor, sorted_keys: Tensor, order: Tensor) -> _Pairs:
    """All (left, right) with equal keys; right entries given sorted by key."""
    lo = torch.searchsorted(sorted_keys, left_keys, right=False)
    hi = torch.searchsorted(sorted_keys, left_keys, right=True)
    counts = hi - lo
    left = torch.repeat_interleave(torch.arange(left_keys.numel()), counts)
    starts = torch.cumsum(counts, 0) - counts
    within = torch.arange(left.numel()) - starts[left]
    return _Pairs(left, order[lo[left] + within])


@dataclass
class _Block:
    """Phase 1 of a block of chunks: everything that needs no bank."""
    n_seg: int
    kidx: Tensor     # [B, C, W] long, bank rows (padded tokens: row 0)
    qidx: Tensor     # [B, C, R] long
    k: Tensor        # [B, C, W] fp32, dense-key weights (0 for repeats, padding)
    q: Tensor        # [B, C, R] fp32
    beta: Tensor     # [B, C] fp32
    v: Tensor        # [B, C, hd] fp32
    first: Tensor    # [B, C, W] first occurrence of each entry's slot in its token
    active: Tensor   # [B, C, W] bool, entry is a first occurrence
    gam: Tensor      # [B, C, W] cumulative log-decay of the entry's slot at its token
    gend: Tensor     # [B, C, W] same at the end of the chunk
    gamq: Tensor     # [B, C, R] cumulative log-decay of a read slot at its token
    A: Tensor        # [B, C, C]
    QK: Tensor       # [B, C, C]
    ww: _Pairs       # write-write pairs (same key)
    rw: _Pairs       # read-write pairs (same key)
    gid: Tensor      # [B*C*W] group (distinct written key) of each write entry
    rep: Tensor      # [n_groups] first entry of each group
    rep_valid: Tensor  # [n_groups] bool, group is a real slot (not padding)
    chunk_groups: Tensor  # [n_chunks + 1] group range of each chunk in the block


def _phase1(kidx, kval, g, qidx, qval, beta, v, valid, S: int) -> _Block:
    """Phase 1 over segments [B, C, *] (chunk-major: segment = chunk * P + stream)."""
    B, C, W = kidx.shape
    R = qidx.shape[-1]
    dev = kidx.device
    # dense-key meaning of repeated slots within a token (spec section 1)
    first = (kidx[..., :, None] == kidx[..., None, :]).int().argmax(-1)
    active = (first == torch.arange(W, device=dev)) & valid[..., None]
    k = torch.zeros_like(kval).scatter_add_(-1, first, kval) * active
    gw = g.expand(B, C, W) * active
    q = qval * valid[..., None]

    span = S + C * W
    seg = torch.arange(B, device=dev)[:, None, None] * span
    pad_key = S + torch.arange(C * W, device=dev).view(1, C, W)
    key_w = torch.where(valid[..., None], kidx, pad_key) + seg
    key_r = qidx + seg
    flat_kw = key_w.reshape(-1)
    sorted_kw, order = torch.sort(flat_kw, stable=True)
    ww = _pairs(flat_kw, sorted_kw, order)
    rw = _pairs(key_r.reshape(-1), sorted_kw, order)

    tok_w = torch.arange(C, device=dev).view(1, C, 1).expand(B, C, W).reshape(-1)
    tok_r = torch.arange(C, device=dev).view(1, C, 1).expand(B, C, R).reshape(-1)
    seg_w = torch.arange(B, device=dev).view(B, 1, 1).expand(B, C, W).reshape(-1)
    seg_r = torch.arange(B, device=dev).view(B, 1, 1).expand(B, C, R).reshape(-1)
    gflat = gw.reshape(-1)

    # cumulative decays: sums over same-key entries at or before the token
    causal_ww = tok_w[ww.right] <= tok_w[ww.left]
    gam = torch.zeros_like(gflat).index_add_(
        0, ww.left[causal_ww], gflat[ww.right[causal_ww]])
    gend = torch.zeros_like(gflat).index_add_(0, ww.left, gflat[ww.right])
    causal_rw = tok_w[rw.right] <= tok_r[rw.left]
    gamq = torch.zeros(B * C * R, device=dev).index_add_(
        0, rw.left[causal_rw], gflat[rw.right[causal_rw]])

    kflat, qflat = k.reshape(-1), q.reshape(-1)
    strict = tok_w[ww.right] < tok_w[ww.left]
    a, b = ww.left[strict], ww.right[strict]
    A = torch.zeros(B * C * C, device=dev).index_add_(
        0, seg_w[a] * C * C + tok_w[a] * C + tok_w[b],
        kflat[a] * kflat[b] * torch.exp(gam[a] - gam[b]))
    r, b = rw.left[causal_rw], rw.right[causal_rw]
    QK = torch.zeros(B * C * C, device=dev).index_add_(
        0, seg_r[r] * C * C + tok_r[r] * C + tok_w[b],
        qflat[r] * kflat[b] * torch.exp(gamq[r] - gam[b]))

    # groups of equal written keys, in key order: chunk c owns a contiguous range
    new_group = torch.ones_like(sorted_kw, dtype=torch.bool)
    new_group[1:] = sorted_kw[1:] != sorted_kw[:-1]
    gid_sorted = torch.cumsum(new_group, 0) - 1
    gid = torch.empty_like(gid_sorted).scatter_(0, order, gid_sorted)
    rep = order[new_group]  # stable sort: the first entry of each group
    rep_valid = (sorted_kw[new_group] % span) < S
    P_chunk_keys = torch.arange(0, B + 1, device=dev) * span
    group_keys = sorted_kw[new_group]
    return _Block(
        B, kidx, qidx, k, q, beta * valid, v, first, active,
        gam.view(B, C, W), gend.view(B, C, W), gamq.view(B, C, R),
        A.view(B, C, C), QK.view(B, C, C), ww, rw, gid, rep, rep_valid,
        torch.searchsorted(group_keys, P_chunk_keys))


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

    def block(self, c0: int) -> _Block:
        c1 = min(self.n_chunks, c0 + self.chunks_per_block)
        t0, t1 = c0 * self.C, min(self.T, c1 * self.C)
        n = c1 - c0
        k_idx, k_val, v, beta, g, q_idx, q_val = (x[:, t0:t1] for x in self.raw)
        valid = torch.ones(self.P, t1 - t0, dtype=torch.bool, device=k_idx.device)
        seg = lambda x: _segments(x, self.C, n)
        return _phase1(seg(k_idx.long()), seg(k_val.float()), seg(g.float()),
                       seg(q_idx.long()), seg(q_val.float()), seg(beta.float()),
                       seg(v.float()), seg(valid), self.S)


def _chunk_slices(blk: _Block, c: int, P: int):
    return slice(c * P, (c + 1) * P)


def _unit_lower(blk: _Block, s: slice) -> Tensor:
    A = blk.A[s]
    C = A.shape[-1]
    return torch.eye(C, device=A.device) + torch.tril(blk.beta[s][..., None] * A, -1)


def _chunk_forward(blk: _Block, c: int, P: int, M0w: Tensor, M0q: Tensor):
    """Phase 2 maths of chunk c of a block given its starting rows (fp32)."""
    s = _chunk_slices(blk, c, P)
    ek = blk.k[s] * torch.exp(blk.gam[s])
    eq = blk.q[s] * torch.exp(blk.gamq[s])
    r0 = (ek[..., None] * M0w).sum(2)
    inter = (eq[..., None] * M0q).sum(2)
    u = blk.beta[s][..., None] * (blk.v[s] - r0)
    L = _unit_lower(blk, s)
    delta = torch.linalg.solve_triangular(L, u, upper=False, unitriangular=True)
    y = inter + blk.QK[s] @ delta
    return ek, eq, r0, L, delta, y


def _chunk_groups(blk: _Block, c: int, P: int, C: int, W: int):
    """This chunk's distinct written keys: local entry ids of their reps, and entry->group."""
    g0, g1 = int(blk.chunk_groups[c * P]), int(blk.chunk_groups[(c + 1) * P])
    e0 = c * P * C * W
    gid = blk.gid[e0:e0 + P * C * W] - g0
    rep = blk.rep[g0:g1] - e0
    valid = blk.rep_valid[g0:g1]
    return gid, rep[valid], valid, g1 - g0


def forward(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size: int,
            snapshot_quant: str, save: bool):
    """Advance ``bank`` in place; return (readings [P,T,hd], saved rows, saved scales)."""
    S, hd = bank.shape
    inp = _Inputs(k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, S)
    P, T, W, R, C = inp.P, inp.T, inp.W, inp.R, inp.C
    readings = torch.empty(P, T, hd, dtype=bank.dtype, device=bank.device)
    store = quant.SnapshotStore(inp.n_chunks * P * C, W + R, hd, bank.dtype,
                                snapshot_quant, bank.device, enabled=save)
    if T == 0:
        return readings, *store.tensors()
    for c0 in inp.blocks():
        blk = inp.block(c0)
        for c in range(blk.n_seg // P):
            s = _chunk_slices(blk, c, P)
            rows = bank[torch.cat([blk.kidx[s], blk.qidx[s]], -1)]   # [P, C, W+R, hd]
            store.put((c0 + c) * P * C, rows.reshape(P * C, W + R, hd))
            rows = rows.float()
            M0w, M0q = rows[:, :, :W], rows[:, :, W:]
            ek, eq, r0, L, delta, y = _chunk_forward(blk, c, P, M0w, M0q)
            t0 = (c0 + c) * C
            n = min(C, T - t0)
            readings[:, t0:t0 + n] = y[:, :n].to(bank.dtype)
            _write_rows(bank, blk, c, P, M0w, delta)
    return readings, *store.tensors()


def _write_rows(bank, blk: _Block, c: int, P: int, M0w: Tensor, delta: Tensor):
    """M_end of each distinct written slot of the chunk, written exactly once."""
    s = _chunk_slices(blk, c, P)
    _, C, W = blk.k[s].shape
    gid, rep, _, n_groups = _chunk_groups(blk, c, P, C, W)
    coef = blk.k[s] * torch.exp(blk.gend[s] - blk.gam[s])          # [P, C, W]
    contrib = (coef[..., None] * delta[:, :, None, :]).reshape(-1, delta.shape[-1])
    acc = torch.zeros(n_groups, delta.shape[-1], device=delta.device).index_add_(0, gid, contrib)
    valid_groups = blk.rep_valid[int(blk.chunk_groups[c * P]):int(blk.chunk_groups[(c + 1) * P])]
    acc = acc[valid_groups]
    M0w = M0w.reshape(-1, M0w.shape[-1])
    gend = blk.gend[s].reshape(-1)
    new = torch.exp(gend[rep])[:, None] * M0w[rep] + acc
    bank[blk.kidx[s].reshape(-1)[rep]] = new.to(bank.dtype)


def backward(grad_readings: Tensor, grad_final: Tensor, saved_rows: Tensor, saved_scales: Tensor,
             k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size: int, snapshot_quant: str,
             grad_bank_fp32: bool):
    """Gradients (bank, k_val, v, beta, g, q_val) by walking the chunks in reverse."""
    S, hd = grad_final.shape
    bank_dtype = grad_final.dtype
    inp = _Inputs(k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, S)
    P, T, W, R, C = inp.P, inp.T, inp.W, inp.R, inp.C
    acc_dtype = torch.float32 if (grad_bank_fp32 or bank_dtype == torch.float32) else bank_dtype
    dB = grad_final.to(acc_dtype, copy=True)
    store = quant.SnapshotStore.from_tensors(saved_rows, saved_scales, W + R, hd, snapshot_quant)
    dk_val = torch.zeros(P, T, W)
    dv = torch.zeros(P, T, hd)
    dbeta = torch.zeros(P, T)
    dg_full = torch.zeros(P, T, W)
    dq_val = torch.zeros(P, T, R)
    if T == 0:
        return (dB.to(bank_dtype), dk_val.to(k_val.dtype), dv.to(v.dtype), dbeta.to(beta.dtype),
                torch.zeros_like(g), dq_val.to(q_val.dtype))
    dy_all = grad_readings.float()
    for c0 in reversed(list(inp.blocks())):
        blk = inp.block(c0)
        n_chunks = blk.n_seg // P
        B = blk.n_seg
        grads = _BlockGrads(B, C, W, R, hd)
        for c in reversed(range(n_chunks)):
            t0 = (c0 + c) * C
            n = min(C, T - t0)
            dy = torch.zeros(P, C, hd)
            dy[:, :n] = dy_all[:, t0:t0 + n]
            rows = store.get((c0 + c) * P * C, P * C).view(P, C, W + R, hd)
            _chunk_backward(blk, c, P, rows[:, :, :W], rows[:, :, W:], dy, dB, grads)
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


def _chunk_backward(blk: _Block, c: int, P: int, M0w, M0q, dy, dB: Tensor, gr: _BlockGrads):
    s = _chunk_slices(blk, c, P)
    M0w, M0q = M0w.float(), M0q.float()
    _, C, W = blk.k[s].shape
    ek, eq, r0, L, delta, _ = _chunk_forward(blk, c, P, M0w, M0q)
    kidx, qidx = blk.kidx[s], blk.qidx[s]
    gid, rep, _, _ = _chunk_groups(blk, c, P, C, W)

    Dw = dB[kidx].float()                                            # dL/dM_end of each entry's slot
    coef = blk.k[s] * torch.exp(blk.gend[s] - blk.gam[s])
    gr.dcoef[s] = (Dw * delta[:, :, None, :]).sum(-1)
    ddelta = (coef[..., None] * Dw).sum(2) + blk.QK[s].transpose(-1, -2) @ dy
    gr.dQK[s] = torch.tril(dy @ delta.transpose(-1, -2))

    flatw = M0w.reshape(-1, M0w.shape[-1])
    Dflat = Dw.reshape(-1, Dw.shape[-1])
    decay = torch.exp(blk.gend[s].reshape(-1)[rep])[:, None]
    e0 = c * P * C * W
    gr.dgend[e0 + rep] = (Dflat[rep] * decay * flatw[rep]).sum(-1)

    gr.deq[s] = (dy[:, :, None, :] * M0q).sum(-1)
    dM0q = eq[..., None] * dy[:, :, None, :]

    du = torch.linalg.solve_triangular(L.transpose(-1, -2), ddelta, upper=True, unitriangular=True)
    dL = torch.tril(-(du @ delta.transpose(-1, -2)), -1)
    beta = blk.beta[s]
    gr.dA[s] = beta[..., None] * dL
    gr.dbeta[s] = (blk.A[s] * dL).sum(-1) + ((blk.v[s] - r0) * du).sum(-1)
    gr.dv[s] = beta[..., None] * du
    dr0 = -beta[..., None] * du
    gr.dek[s] = (dr0[:, :, None, :] * M0w).sum(-1)
    dM0w = ek[..., None] * dr0[:, :, None, :]

    # the bank gradient at the chunk start: written rows are replaced by their decay term
    kflat = kidx.reshape(-1)
    dB[kflat[rep]] = (decay * Dflat[rep]).to(dB.dtype)
    dB.index_add_(0, kflat, dM0w.reshape(-1, dM0w.shape[-1]).to(dB.dtype))
    dB.index_add_(0, qidx.reshape(-1), dM0q.reshape(-1, dM0q.shape[-1]).to(dB.dtype))


def _pair_backward(blk: _Block, gr: _BlockGrads):
    """Gradients of the Phase 1 quantities back to k, q and the per-entry gates."""
    B, C, W = blk.k.shape
    R = blk.q.shape[-1]
    k, q = blk.k.reshape(-1), blk.q.reshape(-1)
    gam, gend, gamq = blk.gam.reshape(-1), blk.gend.reshape(-1), blk.gamq.reshape(-1)
    eg = torch.exp(gam)
    egq = torch.exp(gamq)
    ec = torch.exp(gend - gam)
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

    strict = tok_w[ww.right] < tok_w[ww.left]
    a, b = ww.left[strict], ww.right[strict]
    e = torch.exp(gam[a] - gam[b])
    d = gr.dA.reshape(-1)[seg_w[a] * C * C + tok_w[a] * C + tok_w[b]]
    dk.index_add_(0, a, d * k[b] * e)
    dk.index_add_(0, b, d * k[a] * e)
    t = d * k[a] * k[b] * e
    dgam.index_add_(0, a, t)
    dgam.index_add_(0, b, -t)

    causal_rw = tok_w[rw.right] <= tok_r[rw.left]
    r, b = rw.left[causal_rw], rw.right[causal_rw]
    e = torch.exp(gamq[r] - gam[b])
    d = gr.dQK.reshape(-1)[seg_r[r] * C * C + tok_r[r] * C + tok_w[b]]
    dq.index_add_(0, r, d * k[b] * e)
    dk.index_add_(0, b, d * q[r] * e)
    t = d * q[r] * k[b] * e
    dgamq.index_add_(0, r, t)
    dgam.index_add_(0, b, -t)

    # gates: each cumulative decay is a sum of same-key gates at or before its token
    causal_ww = tok_w[ww.right] <= tok_w[ww.left]
    dg = torch.zeros_like(k)
    dg.index_add_(0, ww.right[causal_ww], dgam[ww.left[causal_ww]])
    dg.index_add_(0, ww.right, dgend[ww.left])
    dg.index_add_(0, b, dgamq[r])
    return dk.view(B, C, W), dq.view(B, C, R), dg.view(B, C, W)
