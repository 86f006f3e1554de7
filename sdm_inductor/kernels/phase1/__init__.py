"""Phase 1 of the chunked form (docs/spec.md section 3): everything that needs no bank.

Layout. The tokens of each stream are padded to ``NC * C`` and cut into *segments*
``b = p * NC + c`` (stream-major), so a per-token array ``[P, NC*C, X]`` is also the
per-segment array ``[B, C, X]`` with no copy. Each token has ``E = W + R`` *entries*:
``W`` writes then ``R`` reads. Entry ``(i, e)`` of a segment has the flat index
``i * E + e`` there.

Stages, in the order ``plan`` runs them:

- ``entries``: dense keys, masks and sort keys of every entry (``_prep_kernel``);
- torch: a stable sort of the keys (one flat sort of all segments: ``entries._flat_span``);
- ``groups``: every entry's group and the write runs, from the sorted keys;
- ``pairs``: cumulative log-decays, the Gram matrices A and QK, per-entry weights;
- ``solve``: ``X = (I + tril(beta A, -1))^-1`` and ``QKX = QK @ X`` of every chunk (fp32).

``headers.entry_groups`` gives the backward's dB ``Groups`` of a plan.
"""
from __future__ import annotations

import torch

from . import entries, groups, pairs
from .entries import prep
from .headers import entry_groups
from .layout import Groups, Plan, Runs
from .solve import inverse

__all__ = ["Groups", "Plan", "Runs", "entry_groups", "plan", "prep"]


def plan(S: int, k_idx, k_val, beta, g, q_idx, q_val, C: int, gate_params=None) -> Plan:
    """Phase 1 for all chunks of all streams. Inputs contiguous ``[P, T, *]`` (with
    ``gate_params``, ``beta`` / ``g`` are the raw gate inputs: see ``prep``)."""
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    E = W + R
    B = P * -(-T // C)
    span = entries._flat_span(S, B, C, E)   # None: the segmented sort (a traced span may
    flat = span is not None                  # be symbolic: no truth test, no guard)
    slot, val, gate, key, first, NC, bp = prep(S, k_idx, k_val, beta, g, q_idx, q_val, C,
                                               gate_params, span if flat else 0)
    # [P, NC * C, X] -> [B, C * X] through the flat view: viewing it directly makes the
    # symbolic reshape ask whether B == P (one chunk), a guard that recompiles a compiled
    # program when its length first passes C
    seg = lambda x, n: x.view(-1).view(B, n)
    key = seg(key, C * E)
    if flat:
        skey, sperm = (x.view(B, C * E) for x in torch.sort(key.view(-1), stable=True))
    else:
        skey, sperm = torch.sort(key, dim=-1, stable=True)
    perm, gs, nw, na, runs, srt = groups._scan_groups(skey, sperm, flat, seg(slot, C * E),
                                                      seg(gate, C * E), seg(val, C * E), C,
                                                      W, R)
    gam, gend, ev, coef, decay, A, QK = pairs.pair_terms(val, srt, gs, nw, B, C, W, R)
    X, QKX = inverse(A, QK, bp)
    pl = Plan(P, T, C, NC, W, R, slot, val, gate, first, perm, gs, nw, na, gam, gend, ev,
              coef, decay, bp, A, QK, X, QKX)
    rslot, rlen, rtok, rent = runs   # the runs' weights are the pairs kernel's
    ent = rent.long()   # once for both gathers (one cast launch fewer)
    take = lambda x: seg(x, C * E).gather(1, ent)
    pl.runs = Runs(rslot, rlen, take(pl.decay), rtok, take(pl.coef))
    return pl
