"""The oracle: SDM write/read as the plain token loop of docs/spec.md section 1.

Used by tests (and by nothing on the fast path). Written with differentiable,
out-of-place torch ops so that autograd through it gives the reference gradients.

Layout (the op's canonical one): ``P`` streams of ``T`` tokens.

    bank   [S, hd]       k_idx [P, T, W]   k_val [P, T, W]   v [P, T, hd]
    beta   [P, T]        g     [P, T, G]   (G == 1 or W)     q_idx/q_val [P, T, R]

Indices are global bank rows. Streams run step-synchronously; each stream's
token step is applied in stream order within a step, which is exact because
streams touch disjoint slots.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["sdm_write_read_reference", "token_step"]


def _dense_key(idx: Tensor, val: Tensor, gate: Tensor):
    """Distinct slots of one token with the dense-key meaning of repeats.

    Returns (slots, weights, gates) where weights of repeated slots are summed and
    the gate of a slot is the one of its first occurrence (spec section 1).
    """
    W = idx.shape[0]
    eq = idx[:, None] == idx[None, :]
    first = eq.int().argmax(dim=1)  # first occurrence of each entry's slot
    active = first == torch.arange(W, device=idx.device)
    # k of a distinct slot: sum over its occurrences (differentiable in val)
    summed = torch.zeros_like(val).index_add(0, first, val)
    return idx[active], summed[active], gate.expand(W)[active]


def token_step(M: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor, beta: Tensor,
               g: Tensor, q_idx: Tensor, q_val: Tensor):
    """One token of spec section 1 on bank ``M`` ([S, hd]); returns (new M, reading)."""
    idx, kv, gate = _dense_key(k_idx, k_val, g)
    rows = M[idx]                                    # rows before this token
    decayed = rows * torch.exp(gate)[:, None]        # only the written rows decay
    retrieved = (kv[:, None] * decayed).sum(0)
    delta = beta * (v - retrieved)
    M = M.index_put((idx,), decayed + kv[:, None] * delta[None, :])
    reading = (q_val[:, None] * M[q_idx]).sum(0)     # read after the write
    return M, reading


def sdm_write_read_reference(bank: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor,
                             beta: Tensor, g: Tensor, q_idx: Tensor, q_val: Tensor,
                             compute_dtype: torch.dtype | None = None):
    """Token loop over ``T`` steps for ``P`` streams. Returns (readings [P,T,hd], final bank).

    ``compute_dtype`` (e.g. float64) upcasts every float input first; by default the
    loop runs in the bank's dtype with every float input cast to it (beta and g through
    fp32).
    """
    dt = compute_dtype or bank.dtype
    gdt = compute_dtype or torch.float32
    M = bank.to(dt)
    k_val, v, q_val = k_val.to(dt), v.to(dt), q_val.to(dt)
    beta, g = beta.to(gdt), g.to(gdt)
    P, T = k_idx.shape[:2]
    readings = []
    for t in range(T):
        step = []
        for p in range(P):
            M, r = token_step(M, k_idx[p, t].long(), k_val[p, t], v[p, t],
                              beta[p, t].to(dt), g[p, t].to(dt), q_idx[p, t].long(), q_val[p, t])
            step.append(r)
        if step:
            readings.append(torch.stack(step))
    if T == 0 or P == 0:
        return v.new_zeros(P, T, bank.shape[1], dtype=dt), M
    return torch.stack(readings, dim=1), M
