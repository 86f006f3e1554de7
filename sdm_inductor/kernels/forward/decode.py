"""Decode path (few tokens, no backward): the token loop of docs/spec.md section 1 itself.

For ``T <= DECODE_MAX_T`` the chunked machinery (sort, Gram matrices, solve) costs
more than it saves. One program owns (stream, column block) and runs the tokens in
order: gather the written rows, decay, retrieve, write each distinct slot once (the
dense-key prep of ``phase1.entries._prep_kernel`` switched repeats off), then read. A barrier
between the write and the read orders them across the program's lanes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..phase1 import prep
from ..common.tiles import row_length
from ..runtime.launch import launch, multiple_of_16, pow2

DECODE_MAX_T = 16


@triton.jit(do_not_specialize=["T"])
def _decode_kernel(bank_ptr, slot_ptr, val_ptr, gate_ptr, v_ptr, beta_ptr, out_ptr, T, hd,
                   W: tl.constexpr, R: tl.constexpr, WP: tl.constexpr, RP: tl.constexpr,
                   BD: tl.constexpr, HD16: tl.constexpr):
    hd = row_length(hd, HD16)
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


def decode(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, config: dict,
           gate_params=None) -> Tensor:
    """Token loop for short sequences (no backward): advances ``bank``, returns readings.
    With ``gate_params`` the prep kernel computes the gates (see ``phase1.entries.prep``)."""
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    S, hd = bank.shape
    # one chunk of T tokens: prep's per-segment beta is [P, T]
    slot, val, gate, _, _, _, beta = prep(S, k_idx, k_val, beta, g, q_idx, q_val, T, gate_params)
    out = torch.empty(P, T, hd, dtype=bank.dtype, device=bank.device)
    BD = config["BD_DECODE"]
    launch(_decode_kernel, (P, -(-hd // BD)), bank, slot, val, gate, v, beta, out, T, hd,
           W=W, R=R, WP=pow2(W), RP=pow2(R), BD=BD, HD16=multiple_of_16(hd),
           num_warps=config["WARPS"])
    return out
