"""Decode path (few tokens, no backward): the token loop of SDM_SPEC section 1 itself.

For ``T <= DECODE_MAX_T`` the chunked machinery (sort, Gram matrices, solve) costs
more than it saves. One program owns (stream, column block) and runs the tokens in
order: gather the written rows, decay, retrieve, write each distinct slot once (the
dense-key prep of ``phase1._prep_kernel`` switched repeats off), then read. A barrier
between the write and the read orders them across the program's lanes.
"""
from __future__ import annotations

import triton
import triton.language as tl

DECODE_MAX_T = 16


@triton.jit(do_not_specialize=["T"])
def _decode_kernel(bank_ptr, slot_ptr, val_ptr, gate_ptr, v_ptr, beta_ptr, out_ptr, T, hd,
                   W: tl.constexpr, R: tl.constexpr, WP: tl.constexpr, RP: tl.constexpr,
                   BD: tl.constexpr):
    p = tl.program_id(0)
    cb = tl.program_id(1)
    E: tl.constexpr = W + R
    cols = cb * BD + tl.arange(0, BD)
    cm = cols < hd
    w = tl.arange(0, WP)
    r = tl.arange(0, RP)
    t = 0
    while t < T:  # runtime trip count
        row = p.to(tl.int64) * T + t
        off = row * E
        sl = tl.load(slot_ptr + off + w, mask=w < W, other=-1)
        kv = tl.load(val_ptr + off + w, mask=w < W, other=0.0)
        gt = tl.load(gate_ptr + off + w, mask=w < W, other=0.0)
        rm = (sl >= 0)[:, None] & cm[None, :]
        ro = sl.to(tl.int64)[:, None] * hd + cols[None, :]
        decayed = tl.load(bank_ptr + ro, mask=rm, other=0.0).to(tl.float32) * tl.exp(gt)[:, None]
        retrieved = tl.sum(kv[:, None] * decayed, axis=0)
        vv = tl.load(v_ptr + row * hd + cols, mask=cm, other=0.0).to(tl.float32)
        delta = tl.load(beta_ptr + row) * (vv - retrieved)
        tl.store(bank_ptr + ro, (decayed + kv[:, None] * delta[None, :]).to(
            bank_ptr.dtype.element_ty), mask=rm)
        tl.debug_barrier()
        qs = tl.load(slot_ptr + off + W + r, mask=r < R, other=-1)
        qv = tl.load(val_ptr + off + W + r, mask=r < R, other=0.0)
        rows = tl.load(bank_ptr + qs.to(tl.int64)[:, None] * hd + cols[None, :],
                       mask=(qs >= 0)[:, None] & cm[None, :], other=0.0).to(tl.float32)
        tl.store(out_ptr + row * hd + cols, tl.sum(qv[:, None] * rows, axis=0).to(
            out_ptr.dtype.element_ty), mask=cm)
        tl.debug_barrier()
        t += 1
