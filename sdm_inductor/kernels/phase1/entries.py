"""Phase 1's first pass: every entry's dense key, mask and sort key (``_prep_kernel``, one
program per token), and with the raw gate inputs the gates themselves.

The dense-key meaning of repeated write slots (weights summed into the first occurrence,
later repeats switched off), masks of padded tokens and out-of-range rows (an entry that
touches nothing gets slot -1), and the sort keys ``2 * slot + is_read``, whose stable sort
puts each segment's entries of one slot together, writes first, in token order."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import is_fake

from ...gates import LOG_DECAY_FLOOR
from ..runtime.launch import holds, launch, pow2


@triton.jit
def _softplus(x):
    """``torch.nn.functional.softplus`` (beta=1, threshold=20) in fp32: ``x`` above the
    threshold, else ``max(x, 0) + log1p(exp(-|x|))``; log1p by the ``log(u) * y / (u - 1)``
    correction (exact to rounding for tiny ``y``, where ``log(1 + y)`` would give 0)."""
    y = tl.exp(-tl.abs(x))
    u = 1.0 + y
    d = u - 1.0
    l1p = tl.where(d == 0.0, y, tl.log(u) * (y / tl.where(d == 0.0, 1.0, d)))
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + l1p)


@triton.jit
def _repeat_sums(kv, first, w, ok):
    """Each entry's weight summed over the live entries whose slot first occurs at it (the
    dense-key meaning of a slot repeated in one token): a W x W one-hot sum."""
    return tl.sum(tl.where((first[None, :] == w[:, None]) & ok[None, :], kv[None, :], 0.0),
                  axis=1)


_G_FLOOR = tl.constexpr(LOG_DECAY_FLOOR)


@triton.jit(do_not_specialize=["T", "Tp", "sb_b", "sa_b", "SPAN"])
def _prep_kernel(kidx_ptr, kval_ptr, g_ptr, qidx_ptr, qval_ptr, beta_ptr, alog_ptr, dtb_ptr,
                 slot_ptr, val_ptr, gate_ptr, key_ptr, first_ptr, bout_ptr,
                 T, Tp, S, C, GH, sb_b, sb_h, sb_t, sa_b, sa_h, sa_t, SPAN,
                 W: tl.constexpr, R: tl.constexpr, G: tl.constexpr,
                 WP: tl.constexpr, RP: tl.constexpr, GATED: tl.constexpr):
    pid = tl.program_id(0)            # p * Tp + t
    p = pid // Tp
    t = pid % Tp
    i = t % C
    E: tl.constexpr = W + R
    tvalid = t < T
    src = p.to(tl.int64) * T + t      # row of the unpadded [P, T] inputs
    out = pid.to(tl.int64) * E        # row of the padded [P, Tp, E] outputs
    # keys of segment b (= pid // C) start at b * SPAN: one flat sort of all segments
    # sorts each (SPAN = 0: a segmented sort)
    koff = (pid // C).to(tl.int64) * SPAN
    if GATED:
        # the raw gate inputs [Bg, T, GH] (stream p = pb * GH + ph), read through their
        # strides: a projection's [B, T, H] output needs no head-split copy
        pb = (p // GH).to(tl.int64)
        ph = (p % GH).to(tl.int64)
        boff = pb * sb_b + ph * sb_h + t.to(tl.int64) * sb_t
        aoff = pb * sa_b + ph * sa_h + t.to(tl.int64) * sa_t
        braw = tl.load(beta_ptr + boff, mask=tvalid, other=0.0).to(tl.float32)
        bv = 1.0 / (1.0 + tl.exp(-braw))                                   # sigmoid
    else:
        bv = tl.load(beta_ptr + src, mask=tvalid, other=0.0).to(tl.float32)
    # per-token write strength, padded to Tp (0 on padded tokens): Phase 1's solve,
    # Phase 2 and the decode loop read this copy
    tl.store(bout_ptr + pid, tl.where(tvalid, bv, 0.0))

    w = tl.arange(0, WP)
    wm = w < W
    kid = tl.load(kidx_ptr + src * W + w, mask=wm & tvalid, other=-1).to(tl.int64)
    kv = tl.load(kval_ptr + src * W + w, mask=wm & tvalid, other=0.0).to(tl.float32)
    ok = wm & tvalid & (kid >= 0) & (kid < S)
    # first occurrence of each entry's slot in this token (dense-key meaning of repeats)
    wc = tl.arange(0, WP)
    same = (kid[:, None] == kid[None, :]) & ok[:, None] & ok[None, :]
    first = tl.min(tl.where(same, wc[None, :], WP), axis=1)
    first = tl.where(ok, first, w)
    active = ok & (first == w)
    # a token without repeated slots (the common case) keeps its weights: the W x W sum
    # would give each entry its own weight alone
    if tl.sum((ok & (first != w)).to(tl.int32), axis=0) > 0:
        kd = _repeat_sums(kv, first, w, ok)
    else:
        kd = kv
    kd = tl.where(active, kd, 0.0)
    if GATED:
        # g = -exp(A_log[p]) * softplus(a + dt_bias[p]), one per token (G == 1)
        araw = tl.load(g_ptr + aoff + w * 0, mask=wm & tvalid, other=0.0).to(tl.float32)
        alog = tl.load(alog_ptr + p).to(tl.float32)
        dtb = tl.load(dtb_ptr + p).to(tl.float32)
        gv = -tl.exp(alog) * _softplus(araw + dtb)
    elif G == 1:
        gv = tl.load(g_ptr + src + w * 0, mask=wm & tvalid, other=0.0)
    else:
        gv = tl.load(g_ptr + src * W + w, mask=wm & tvalid, other=0.0)
    # floored (gates.LOG_DECAY_FLOOR): -inf, a full forget, never meets -inf in the
    # differences of cumulative decays; NaN stays NaN
    gv = tl.maximum(gv.to(tl.float32), _G_FLOOR, propagate_nan=tl.PropagateNan.ALL)
    gv = tl.where(active, gv, 0.0)
    wslot = tl.where(active, kid, -1)
    # entries that touch nothing get a private key past the bank: a group of their own
    wkey = 2 * tl.where(active, kid, S + i.to(tl.int64) * E + w) + koff
    tl.store(slot_ptr + out + w, wslot.to(tl.int32), mask=wm)
    tl.store(val_ptr + out + w, kd, mask=wm)
    tl.store(gate_ptr + out + w, gv, mask=wm)
    tl.store(key_ptr + out + w, wkey, mask=wm)
    tl.store(first_ptr + pid.to(tl.int64) * W + w, first.to(tl.int32), mask=wm)

    r = tl.arange(0, RP)
    rm = r < R
    qid = tl.load(qidx_ptr + src * R + r, mask=rm & tvalid, other=-1).to(tl.int64)
    qv = tl.load(qval_ptr + src * R + r, mask=rm & tvalid, other=0.0).to(tl.float32)
    rok = rm & tvalid & (qid >= 0) & (qid < S)
    qkey = 2 * tl.where(rok, qid, S + i.to(tl.int64) * E + W + r) + 1 + koff
    tl.store(slot_ptr + out + W + r, tl.where(rok, qid, -1).to(tl.int32), mask=rm)
    tl.store(val_ptr + out + W + r, tl.where(rok, qv, 0.0), mask=rm)
    tl.store(gate_ptr + out + W + r, tl.zeros([RP], tl.float32), mask=rm)
    tl.store(key_ptr + out + W + r, qkey, mask=rm)


# warps of ``_prep_kernel`` (one program per token). One: its W x W slot comparisons
# and sums stay in one warp's registers and shuffles, 2.4 k instructions per token
# against 4 x 1.5 k for four warps (an issue-bound kernel):
# no-grad 1-2.5 % faster at A and B (the plan alone: 0.92 at A C=128, 1.07 at C=64)
PREP_WARPS = 1


def _key_dtype(S, C: int, E: int) -> torch.dtype:
    """int32 sort keys when every key fits (``2 * (S + C*E) + 1 < 2**31``, by ``holds``: a
    compiled graph with a symbolic bank guards on it): the radix sort then makes half the
    passes."""
    return torch.int32 if holds(S + C * E < 2 ** 30) else torch.int64


# One device-wide sort of all segments' keys (each offset by its segment) instead of a
# segmented sort. torch's segmented sort runs one block per segment from 128 segments up
# (cub's segmented radix sort: a segment's latency) and two full sorts below; the flat
# sort is one radix sort over all entries. At 128 segments of 16,384 keys (config A,
# C=128; H100): int32 flat 179 us, segmented 237; int64 flat 344, segmented 482.
FLAT_SORT = True


def _flat_span(S, B, C: int, E: int):
    """The key offset between segments for the flat sort (``2 * (S + C*E)``), or None for
    the segmented sort: the flat sort wherever the offset keys (below ``B * span``) fit the
    keys' dtype, by ``holds``. A compiled graph with symbolic sizes guards on that, and
    sizes that fail it compile the segmented sort; an AOTInductor package keeps that sort
    unless its shapes prove the bound. Where int32 keys do not fit offset, they sort per
    segment: faster than offset int64 keys."""
    if not FLAT_SORT:
        return None
    span = 2 * (S + C * E)
    if _key_dtype(S, C, E) == torch.int32:
        return span if holds(B * span < 2 ** 31) else None
    return span if holds(B * (S + C * E) < 2 ** 62) else None


def gate_strides(x) -> tuple:
    """The strides of a raw gate input ``[Bg, T, GH]`` in the prep kernel's order
    (stream-batch, stream-head, token). A traced call's gates are dense copies
    (``runtime.launch.dense``), whose strides follow from their sizes: a traced
    ``stride()`` would be evaluated on a layout that Inductor's passes may change after
    tracing. An eager call's are read in place, whatever their strides."""
    if is_fake(x):
        return x.shape[1] * x.shape[2], 1, x.shape[2]
    return x.stride(0), x.stride(2), x.stride(1)


def prep(S: int, k_idx, k_val, beta, g, q_idx, q_val, C: int, gate_params=None, span: int = 0):
    """Dense keys, masks and sort keys of every entry, and the padded per-token write
    strength ``[P * NC, C]`` (per segment: viewing a ``[P, Tp]`` one as such would make a
    traced call guard on ``NC`` being 1); returns ``(slot, val, gate, key, first, NC,
    beta)``.

    ``gate_params=None``: ``beta [P, T]`` and ``g [P, T, 1 or W]`` are the gates.
    ``gate_params=(A_log, dt_bias)`` (``[P]`` each): ``beta`` and ``g`` are the *raw*
    gate inputs ``b``, ``a`` as ``[Bg, T, GH]`` with ``Bg * GH = P`` (any strides; a
    ``[P, T]`` input is ``[P, T, 1]``), and the kernel computes ``beta = sigmoid(b)``
    and ``g = -exp(A_log) * softplus(a + dt_bias)`` in fp32 itself.

    ``span`` (``_flat_span``, maybe symbolic): each segment's keys are offset by ``segment *
    span``, for one flat sort of all segments; 0 leaves them per segment.
    """
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    NC = -(-T // C)
    Tp = NC * C
    E: tl.constexpr = W + R
    dev = k_idx.device
    slot = torch.empty(P, Tp, E, dtype=torch.int32, device=dev)
    val = torch.empty(P, Tp, E, dtype=torch.float32, device=dev)
    gate = torch.empty(P, Tp, E, dtype=torch.float32, device=dev)
    key = torch.empty(P, Tp, E, dtype=_key_dtype(S, C, E), device=dev)
    first = torch.empty(P, Tp, W, dtype=torch.int32, device=dev)
    bout = torch.empty(P * NC, C, dtype=torch.float32, device=dev)
    if gate_params is None:
        G, GH, sb, sa = g.shape[2], 1, (0, 0, 0), (0, 0, 0)
        # placeholders for pointers compiled out (never a written buffer: Inductor treats
        # pointer arguments as possibly written and clones aliased ones separately)
        A_log = dt_bias = torch.empty(1, dtype=torch.float32, device=dev)
    else:
        A_log, dt_bias = gate_params
        G, GH = 1, beta.shape[2]
        sb, sa = gate_strides(beta), gate_strides(g)
    launch(_prep_kernel, (P * Tp,), k_idx, k_val, g, q_idx, q_val, beta, A_log, dt_bias,
           slot, val, gate, key, first, bout, T, Tp, S, C, GH, *sb, *sa, span,
           W=W, R=R, G=G, WP=pow2(W), RP=pow2(R), GATED=gate_params is not None,
           num_warps=PREP_WARPS)
    return slot, val, gate, key, first, NC, bout
