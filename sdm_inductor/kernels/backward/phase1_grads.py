"""Phase 1 backward: ``_pair_grads_kernel`` / ``_gate_grads_kernel`` take the walks'
cross-column sums of the Gram matrices and per-entry weights back to ``k``, ``q`` and the
gates by walking each entry's group, the transpose of ``phase1.pairs._pairs_kernel``;
every output element has one writer."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime.launch import launch, pow2


@triton.jit
def _pair_grads_kernel(val_ptr, gam_ptr, gend_ptr, perm_ptr, gs_ptr, nw_ptr, na_ptr, slot_ptr,
                       decay_ptr, beta_ptr, dev_ptr, dcoef_ptr, dm_ptr, dL_ptr, dQK_ptr,
                       dval_ptr, dgam_ptr, dgend_ptr, C,
                       W: tl.constexpr, R: tl.constexpr, EB: tl.constexpr):
    """Per entry: d val (k or q), d gam (gamq for reads), d gend, by walking its group.
    ``dA = beta dL`` (row-wise) and the chunk decay's part of d gend (``decay * dm`` for
    the first member of each written slot's group) are formed here from their factors
    (no torch ops of their own in front of the launch)."""
    pid = tl.program_id(0)            # b * C + i
    b = pid // C
    i = pid % C
    E: tl.constexpr = W + R
    seg = b.to(tl.int64) * C * E
    mat = b.to(tl.int64) * C * C
    beta_i = tl.load(beta_ptr + b.to(tl.int64) * C + i)
    for e0 in range(0, E, EB):
        e = e0 + tl.arange(0, EB)
        em = e < E
        off = seg + i * E + e
        is_w = e < W
        val = tl.load(val_ptr + off, mask=em, other=0.0)
        gam = tl.load(gam_ptr + off, mask=em, other=0.0)
        gend = tl.load(gend_ptr + off, mask=em, other=0.0)
        dev = tl.load(dev_ptr + off, mask=em, other=0.0)
        dco = tl.load(dcoef_ptr + pid.to(tl.int64) * W + e, mask=em & is_w, other=0.0)
        gs = tl.load(gs_ptr + off, mask=em, other=0)
        nw = tl.load(nw_ptr + off, mask=em, other=0)
        na = tl.load(na_ptr + off, mask=em, other=0)
        # the group's first member in sorted order is this entry: its slot's chunk decay
        lead = is_w & (tl.load(perm_ptr + seg + gs, mask=em, other=-1) == i * E + e)
        lead = lead & (tl.load(slot_ptr + off, mask=em, other=-1) >= 0)
        dm = tl.load(dm_ptr + pid.to(tl.int64) * W + e, mask=em & lead, other=0.0)
        dgd = tl.where(lead, tl.load(decay_ptr + off, mask=em & lead, other=0.0) * dm, 0.0)
        eg = tl.exp(gam)
        ec = tl.where(is_w, tl.exp(gend - gam), 0.0)
        dv = dev * eg + dco * ec
        dg = dev * val * eg - dco * val * ec
        dge = dgd + dco * val * ec
        # reads pair with write members only; writes with all members
        n = tl.where(is_w, na, nw)
        m = 0
        while m < tl.max(tl.where(em, n, 0), axis=0):  # data-dependent trip count
            mm = em & (m < n)
            f = tl.load(perm_ptr + seg + gs + m, mask=mm, other=0)
            tf = f // E
            vf = tl.load(val_ptr + seg + f, mask=mm, other=0.0)
            gf = tl.load(gam_ptr + seg + f, mask=mm, other=0.0)
            f_w = m < nw
            # write e, earlier write f: A[i, tf]; later write f: A[tf, i]
            # write e, read f at tf >= i: QK[tf, i]; read e, write f at tf <= i: QK[i, tf]
            use_a_lo = mm & is_w & f_w & (tf < i)
            use_a_hi = mm & is_w & f_w & (tf > i)
            use_q_w = mm & is_w & (~f_w) & (tf >= i)
            use_q_r = mm & (~is_w) & f_w & (tf <= i)
            a_lo = beta_i * tl.load(dL_ptr + mat + i * C + tf, mask=use_a_lo, other=0.0)
            a_hi = (tl.load(beta_ptr + b.to(tl.int64) * C + tf, mask=use_a_hi, other=0.0)
                    * tl.load(dL_ptr + mat + tf * C + i, mask=use_a_hi, other=0.0))
            q_w = tl.load(dQK_ptr + mat + tf * C + i, mask=use_q_w, other=0.0)
            q_r = tl.load(dQK_ptr + mat + i * C + tf, mask=use_q_r, other=0.0)
            x_lo = vf * tl.exp(gam - gf)      # e later than f
            x_hi = vf * tl.exp(gf - gam)      # f later than e
            t_lo = tl.where(use_a_lo, a_lo * x_lo, 0.0) + tl.where(use_q_r, q_r * x_lo, 0.0)
            t_hi = tl.where(use_a_hi, a_hi * x_hi, 0.0) + tl.where(use_q_w, q_w * x_hi, 0.0)
            dv += t_lo + t_hi
            dg += val * (t_lo - t_hi)
            m += 1
        tl.store(dval_ptr + off, dv, mask=em)
        tl.store(dgam_ptr + off, dg, mask=em)
        tl.store(dgend_ptr + off, tl.where(is_w, dge, 0.0), mask=em)


@triton.jit
def _gate_grads_kernel(perm_ptr, gs_ptr, nw_ptr, na_ptr, dgam_ptr, dgend_ptr, dgate_ptr, C,
                       W: tl.constexpr, R: tl.constexpr, WB: tl.constexpr):
    """d gate of a write entry: every cumulative decay of its group at or after its token."""
    pid = tl.program_id(0)
    b = pid // C
    i = pid % C
    E: tl.constexpr = W + R
    seg = b.to(tl.int64) * C * E
    for w0 in range(0, W, WB):
        w = w0 + tl.arange(0, WB)
        wm = w < W
        off = seg + i * E + w
        gs = tl.load(gs_ptr + off, mask=wm, other=0)
        nw = tl.load(nw_ptr + off, mask=wm, other=0)
        na = tl.load(na_ptr + off, mask=wm, other=0)
        acc = tl.zeros([WB], tl.float32)
        m = 0
        while m < tl.max(tl.where(wm, na, 0), axis=0):  # data-dependent trip count
            mm = wm & (m < na)
            f = tl.load(perm_ptr + seg + gs + m, mask=mm, other=0)
            later = (f // E) >= i
            dgm = tl.load(dgam_ptr + seg + f, mask=mm & later, other=0.0)
            dge = tl.load(dgend_ptr + seg + f, mask=mm & (m < nw), other=0.0)
            acc += dgm + dge
            m += 1
        tl.store(dgate_ptr + pid.to(tl.int64) * W + w, acc, mask=wm)


# warps of ``_pair_grads_kernel`` / ``_gate_grads_kernel`` (one program per token, blocks
# of 32 entries; no float sums across lanes, so any count gives bitwise the same results).
# One warp holds a block's 32 lanes; four only duplicated them: 121 -> 56 us and 43 -> 24
# us at A C=128, autograd 0.990 (A) / 0.996 (B) against four
PAIR_GRADS_WARPS = 1
GATE_GRADS_WARPS = 1


def phase1_grads(pl, sums: dict, g_width: int):
    """Phase 1 backwards for one window: from the walk's sums through the Gram matrices,
    the per-entry weights and the cumulative decays to ``(dk, dbeta, dg, dq)`` of the
    window's tokens (dk / dq in fp32). Reads no bank row."""
    P, T, C, NC, B, W, R = pl.P, pl.T, pl.C, pl.NC, pl.B, pl.W, pl.R
    E = W + R
    dev = pl.val.device
    f32 = dict(dtype=torch.float32, device=dev)
    dL = sums["L"]
    dbeta = (pl.A * dL).sum(-1) + sums["b"].view(B, C)

    dval = torch.empty(B, C, E, **f32)
    dgam = torch.empty(B, C, E, **f32)
    dgend = torch.empty(B, C, E, **f32)
    launch(_pair_grads_kernel, (B * C,), pl.val, pl.gam, pl.gend, pl.perm, pl.gs, pl.nw, pl.na,
           pl.slot, pl.decay, pl.beta, sums["ev"], sums["coef"], sums["m"], dL, sums["qk"], dval,
           dgam, dgend, C, W=W, R=R, EB=min(32, pow2(E)), num_warps=PAIR_GRADS_WARPS)
    dgate = torch.empty(B, C, W, **f32)
    launch(_gate_grads_kernel, (B * C,), pl.perm, pl.gs, pl.nw, pl.na, dgam, dgend, dgate, C,
           W=W, R=R, WB=min(32, pow2(W)), num_warps=GATE_GRADS_WARPS)

    # back from the dense-key entries to the user's entries; drop padding. The tokens are
    # gathered by their flat rows, not sliced or viewed: a [:, :T] view of a padded
    # [P, Tp, ...] tensor is contiguous exactly when T is a multiple of C, and a [B, C, ...]
    # -> [P, Tp, ...] view asks whether B == P (one chunk); either would be a guard that
    # recompiles a traced graph
    rows = (torch.arange(P, device=dev) * (NC * C))[:, None] + torch.arange(T, device=dev)
    per_token = lambda x, n: x.reshape(-1, n)[rows]      # [P, T, n], contiguous
    dval = dval.reshape(-1, E)   # the write and read columns gathered apart: each comes out
    # contiguous, as the op's fake implementation promises, with no copy of its own
    dk = torch.gather(per_token(dval[:, :W], W), 2, per_token(pl.first, W).long())
    dq = per_token(dval[:, W:], R)
    active = per_token(pl.slot.reshape(-1, E)[:, :W], W) >= 0
    dgw = per_token(dgate, W) * active
    dg = dgw if g_width == W else dgw.sum(-1, keepdim=True)
    return dk, dbeta.reshape(-1)[rows], dg, dq
