"""Token-loop spellings for the pattern-rewrite tests: positives (the op's meaning) and
near-misses (a different meaning: must stay as written). Each entry is a function of the
inputs built by ``inputs()``; T is small so that Dynamo traces fast."""
from __future__ import annotations

import torch
import torch.nn.functional as F

S, HD, W, R, T = 64, 8, 4, 3, 6


def inputs(T=T, dtype=torch.float32, per_write=True, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    k_idx = torch.stack([torch.randperm(S, generator=gen)[:W] for _ in range(T)])
    q_idx = torch.randint(0, S, (T, R), generator=gen)
    d = dict(
        M=torch.randn(S, HD, generator=gen).to(dtype),
        k_idx=k_idx,
        k_val=torch.randn(T, W, generator=gen).to(dtype) * 0.5,
        v=torch.randn(T, HD, generator=gen).to(dtype),
        beta=(torch.rand(T, generator=gen) * 0.9).to(dtype),
        g=(-torch.rand(T, W if per_write else 1, generator=gen) * 0.5).to(dtype),
        q_idx=q_idx,
        q_val=torch.randn(T, R, generator=gen).to(dtype),
    )
    if requires_grad:
        for k in ("M", "k_val", "v", "beta", "g", "q_val"):
            d[k].requires_grad_(True)
    return d


# ============================================================================ positives

def p_setitem_mulsum(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """The spec's loop: setitem on a clone, mul + sum, per-write gate."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows = M[k_idx[t]]
        dec = rows * torch.exp(g[t])[:, None]
        ret = (k_val[t][:, None] * dec).sum(0)
        delta = beta[t] * (v[t] - ret)
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def p_index_put_einsum(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """Functional index_put, einsum contractions, per-token gate (g[t] of width 1)."""
    outs = []
    for t in range(k_idx.shape[0]):
        idx = k_idx[t]
        a = torch.exp(g[t])
        dec = M[idx] * a
        ret = torch.einsum("w,wd->d", k_val[t], dec)
        delta = beta[t] * (v[t] - ret)
        M = M.index_put((idx,), dec + torch.einsum("w,d->wd", k_val[t], delta))
        outs.append(torch.einsum("r,rd->d", q_val[t], M[q_idx[t]]))
    return torch.stack(outs, 0), M


def p_index_select_copy_matmul(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """index_select reads, index_copy_ writes, matmul contractions."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows = M.index_select(0, k_idx[t])
        dec = torch.exp(g[t]).unsqueeze(-1) * rows
        ret = k_val[t] @ dec
        delta = (v[t] - ret) * beta[t]
        M.index_copy_(0, k_idx[t], dec + k_val[t].unsqueeze(1) @ delta.unsqueeze(0))
        outs.append(q_val[t] @ M.index_select(0, q_idx[t]))
    return torch.stack(outs), M


def p_gather_scatter_outer(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """gather / functional scatter with [W, hd] index, outer for the delta."""
    outs = []
    for t in range(k_idx.shape[0]):
        gi = k_idx[t][:, None].expand(-1, M.shape[1])
        rows = torch.gather(M, 0, gi)
        dec = rows * g[t].exp().view(-1, 1)
        ret = (dec * k_val[t].view(-1, 1)).sum(dim=0)
        delta = beta[t] * (v[t] - ret)
        M = torch.scatter(M, 0, gi, dec + torch.outer(k_val[t], delta))
        qi = q_idx[t][:, None].expand(-1, M.shape[1])
        outs.append((torch.gather(M, 0, qi) * q_val[t][:, None]).sum(0))
    return torch.stack(outs), M


def p_index_add_increment(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """index_add_ of the increment (new rows - old rows)."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows = M[k_idx[t]]
        dec = rows * torch.exp(g[t])[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M.index_add_(0, k_idx[t], dec - rows + k_val[t][:, None] * delta)
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def p_zeros_increment_added(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """The increment (new rows - old rows) scattered into zeros and added to the bank."""
    outs = []
    for t in range(k_idx.shape[0]):
        rows = M[k_idx[t]]
        dec = rows * torch.exp(g[t])[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        upd = torch.zeros(M.shape)
        upd.index_add_(0, k_idx[t], dec - rows + k_val[t][:, None] * delta[None, :])
        M = M + upd
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def p_scatter_add_no_gate_no_beta(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """scatter_add_, no gate (g = 0) and no beta (beta = 1)."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        gi = k_idx[t].unsqueeze(1).expand(W, HD)
        rows = M[k_idx[t]]
        delta = v[t] - (k_val[t].unsqueeze(1) * rows).sum(0)
        M.scatter_add_(0, gi, k_val[t].unsqueeze(1) * delta.unsqueeze(0))
        outs.append((q_val[t].unsqueeze(1) * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def p_bmm(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """bmm contractions on [1, ...] views, distributed delta (beta*v - beta*ret)."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        dec = M[k_idx[t]] * torch.exp(g[t])[:, None]
        ret = torch.bmm(k_val[t].view(1, 1, W), dec.unsqueeze(0)).view(HD)
        delta = beta[t] * v[t] - beta[t] * ret
        M[k_idx[t]] = dec + k_val[t][:, None] * delta
        outs.append(torch.bmm(q_val[t].view(1, 1, R), M[q_idx[t]].unsqueeze(0)).view(HD))
    return torch.stack(outs), M


def p_out_buffer(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """Readings stored into a preallocated output with setitem; transposed matmul."""
    M = M.clone()
    out = torch.zeros(k_idx.shape[0], HD)
    for t in range(k_idx.shape[0]):
        dec = M[k_idx[t]] * torch.exp(g[t])[:, None]
        ret = dec.t() @ k_val[t]
        delta = beta[t] * (v[t] - ret)
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        out[t] = M[q_idx[t]].t() @ q_val[t]
    return out, M


class Projected(torch.nn.Module):
    """Per-token inputs computed inside the loop from x (hoisted), slots from topk."""

    def __init__(self, d=12):
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.wk = torch.nn.Parameter(torch.randn(d, S, generator=gen) * 0.3)
        self.wq = torch.nn.Parameter(torch.randn(d, S, generator=gen) * 0.3)
        self.wv = torch.nn.Parameter(torch.randn(d, HD, generator=gen) * 0.3)
        self.wb = torch.nn.Parameter(torch.randn(d, generator=gen) * 0.3)
        self.wg = torch.nn.Parameter(torch.randn(d, W, generator=gen) * 0.3)
        self.bank = torch.nn.Parameter(torch.randn(S, HD, generator=gen) * 0.3)

    def forward(self, x):
        M = self.bank * 1.0
        outs = []
        for t in range(x.shape[0]):
            ks, ki = torch.topk(x[t] @ self.wk, W)
            kv = torch.softmax(ks, -1)
            qs, qi = (x[t] @ self.wq).topk(R)
            qv = torch.softmax(qs, -1)
            vv = x[t] @ self.wv
            b = torch.sigmoid(x[t] @ self.wb)
            gg = -F.softplus(x[t] @ self.wg)
            dec = M[ki] * torch.exp(gg)[:, None]
            delta = b * (vv - (kv[:, None] * dec).sum(0))
            M = M.index_put((ki,), dec + kv[:, None] * delta[None])
            outs.append((qv[:, None] * M[qi]).sum(0))
        return torch.stack(outs)


def p_product_keys(M, k_idx, k_val, v, beta, g, q_idx, q_val, a_scores=None):
    """Write slots from product keys (distinct by construction): 2 x 2 sub-keys of 8."""
    M = M.clone()
    outs = []
    for t in range(k_val.shape[0]):
        _, i1 = torch.topk(k_val[t] * 3.0 + torch.arange(W), 2)
        _, i2 = torch.topk(v[t], 2)
        idx = (i1[:, None] * 8 + i2[None, :]).reshape(-1)
        dec = M[idx] * torch.exp(g[t])[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[idx] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


class DecodeStep(torch.nn.Module):
    """A decode step (chain of one) that advances a module's buffer in place."""

    def __init__(self):
        super().__init__()
        self.register_buffer("M", torch.randn(S, HD, generator=torch.Generator().manual_seed(2)))

    def forward(self, k_idx, k_val, v, beta, g, q_idx, q_val):
        rows = self.M[k_idx]
        dec = rows * torch.exp(g)[:, None]
        delta = beta * (v - (k_val[:, None] * dec).sum(0))
        self.M[k_idx] = dec + k_val[:, None] * delta[None, :]
        return (q_val[:, None] * self.M[q_idx]).sum(0)


def p_two_readings_scaled(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """A reading used twice (once scaled), per-token gate by mul of exp, alpha=-1 sub."""
    M = M.clone()
    outs, outs2 = [], []
    for t in range(k_idx.shape[0]):
        rows = M[k_idx[t]]
        dec = torch.mul(rows, torch.exp(g[t, :1]))
        ret = torch.sum(k_val[t][:, None] * dec, dim=0)
        delta = torch.sub(v[t], ret) * beta[t]
        M[k_idx[t]] = torch.add(dec, k_val[t][:, None] * delta[None, :])
        r = (q_val[t][:, None] * M[q_idx[t]]).sum(0)
        outs.append(r)
        outs2.append(r * 0.5)
    return torch.stack(outs) + torch.stack(outs2)


# ============================================================================ near misses

def _step_parts(M, t, k_idx, k_val, g):
    rows = M[k_idx[t]]
    dec = rows * torch.exp(g[t])[:, None]
    return rows, dec


def n_read_before_write(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
    return torch.stack(outs), M


def n_whole_bank_decay(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    outs = []
    for t in range(k_idx.shape[0]):
        M = M * torch.exp(g[t, 0])
        rows = M[k_idx[t]]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * rows).sum(0))
        M = M.index_put((k_idx[t],), rows + k_val[t][:, None] * delta[None, :])
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_other_retrieval_weights(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] - (torch.softmax(k_val[t], 0)[:, None] * dec).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_no_delta(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        M[k_idx[t]] = dec + beta[t] * k_val[t][:, None] * v[t][None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_zeros_clamped_rows(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """The new rows clamped, their increment scattered into zeros and added."""
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        new = (dec + k_val[t][:, None] * delta[None, :]).clamp(-0.5, 0.5)
        upd = torch.zeros(M.shape)
        upd.index_add_(0, k_idx[t], new - rows)
        M = M + upd
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_zeros_plain_write(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """An outer-product write (no delta) scattered into zeros and added."""
    outs = []
    for t in range(k_idx.shape[0]):
        upd = torch.zeros(M.shape)
        upd.index_add_(0, k_idx[t], beta[t] * k_val[t][:, None] * v[t][None, :])
        M = M + upd
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_readings_fed_back(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    r = torch.zeros(HD)
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] + 0.5 * r - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        r = (q_val[t][:, None] * M[q_idx[t]]).sum(0)
        outs.append(r)
    return torch.stack(outs), M


def n_tanh_bank(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = torch.tanh(dec + k_val[t][:, None] * delta[None, :])
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_clamped_bank(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = (dec + k_val[t][:, None] * delta[None, :]).clamp(-0.5, 0.5)
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_gate_on_delta(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows = M[k_idx[t]]
        a = torch.exp(g[t])[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * rows * a).sum(0))
        M[k_idx[t]] = a * (rows + k_val[t][:, None] * delta[None, :])
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_undecayed_retrieval(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] - (k_val[t][:, None] * rows).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def p_negated_delta(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * ((k_val[t][:, None] * dec).sum(0) - v[t])
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_beta_on_v_only(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * v[t] - (k_val[t][:, None] * dec).sum(0)
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_write_other_slots(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[(k_idx[t] + 1) % S] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def p_sigmoid_decay(M, k_idx, k_val, v, beta, g, q_idx, q_val):   # g = logsigmoid(x)
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        dec = M[k_idx[t]] * torch.sigmoid(g[t])[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def p_constant_decay(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """A decay by a number on top of the gate: ``rows * exp(g) * 0.9`` (g + log 0.9)."""
    outs = []
    for t in range(k_idx.shape[0]):
        dec = M[k_idx[t]] * torch.exp(g[t])[:, None] * 0.9
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M = M.index_put((k_idx[t],), dec + k_val[t][:, None] * delta[None, :])
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_tanh_decay(M, k_idx, k_val, v, beta, g, q_idx, q_val):    # a decay that can be < 0
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        dec = M[k_idx[t]] * torch.tanh(g[t])[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_states_kept(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    states = []
    for t in range(k_idx.shape[0]):
        dec = M[k_idx[t]] * torch.exp(g[t])[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M = M.index_put((k_idx[t],), dec + k_val[t][:, None] * delta[None, :])
        states.append(M)
    return torch.stack(states)


def n_mean_retrieval(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).mean(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_extra_term(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :] + 0.01 * rows
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_accumulate_put(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """index_put with accumulate=True of the *new* rows (adds the old row twice)."""
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M = M.index_put((k_idx[t],), dec + k_val[t][:, None] * delta[None, :], accumulate=True)
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_double_bank(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """The reading is squared (nonlinear in the bank)."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows, dec = _step_parts(M, t, k_idx, k_val, g)
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        r = M[q_idx[t]]
        outs.append((q_val[t][:, None] * r * r).sum(0))
    return torch.stack(outs), M




def p_scan(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """torch._higher_order_ops.scan over the tokens (rewritten from the body)."""
    from torch._higher_order_ops.scan import scan

    def body(M, x):
        ki, kv, vv, b, gg, qi, qv = x
        dec = M[ki] * torch.exp(gg)[:, None]
        delta = b * (vv - (kv[:, None] * dec).sum(0))
        M = M.index_put((ki,), dec + kv[:, None] * delta[None, :])
        return M, (qv[:, None] * M[qi]).sum(0)

    M, outs = scan(body, M, (k_idx, k_val, v, beta, g, q_idx, q_val))
    return outs, M



# ============================================================================ streams batched in each step

B = 2


def inputs_batched(T=T, dtype=torch.float32, seed=0, flat=False, requires_grad=False):
    """B streams of S // B rows each: a [B, S/B, hd] bank (or a flat [S, hd] one), local
    write/read slots [B, T, W] / [B, T, R]."""
    gen = torch.Generator().manual_seed(seed)
    n = S // B
    d = dict(
        M=torch.randn(B * n, HD, generator=gen).to(dtype) if flat else torch.randn(B, n, HD, generator=gen).to(dtype),
        k_idx=torch.stack([torch.stack([torch.randperm(n, generator=gen)[:W] for _ in range(T)]) for _ in range(B)]),
        k_val=torch.randn(B, T, W, generator=gen).to(dtype) * 0.5,
        v=torch.randn(B, T, HD, generator=gen).to(dtype),
        beta=(torch.rand(B, T, generator=gen) * 0.9).to(dtype),
        g=(-torch.rand(B, T, W, generator=gen) * 0.5).to(dtype),
        q_idx=torch.randint(0, n, (B, T, R), generator=gen),
        q_val=torch.randn(B, T, R, generator=gen).to(dtype),
    )
    if requires_grad:
        for k in ("M", "k_val", "v", "beta", "g", "q_val"):
            d[k].requires_grad_(True)
    return d


def p_batched_bank(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """A [B, S, hd] bank indexed per batch: M[arange(B)[:, None], idx[:, t]]."""
    M = M.clone()
    b = torch.arange(M.shape[0])[:, None]
    outs = []
    for t in range(k_idx.shape[1]):
        rows = M[b, k_idx[:, t]]                                   # [B, W, hd]
        dec = rows * torch.exp(g[:, t])[..., None]
        ret = torch.einsum("bw,bwd->bd", k_val[:, t], dec)
        delta = beta[:, t, None] * (v[:, t] - ret)
        M[b, k_idx[:, t]] = dec + k_val[:, t, :, None] * delta[:, None, :]
        outs.append((q_val[:, t, :, None] * M[b, q_idx[:, t]]).sum(1))
    return torch.stack(outs, 1), M


def p_expanded_arange(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """The batch index spelled ``arange(B)[:, None].expand(B, W)``, once for every token."""
    bw = torch.arange(M.shape[0])[:, None].expand(-1, k_idx.shape[-1])
    br = torch.arange(M.shape[0])[:, None].expand(-1, q_idx.shape[-1])
    outs = []
    for t in range(k_idx.shape[1]):
        dec = M[bw, k_idx[:, t]] * torch.exp(g[:, t])[..., None]
        delta = beta[:, t, None] * (v[:, t] - torch.einsum("bw,bwd->bd", k_val[:, t], dec))
        M = M.index_put((bw, k_idx[:, t]), dec + k_val[:, t, :, None] * delta[:, None, :])
        outs.append(torch.einsum("br,brd->bd", q_val[:, t], M[br, q_idx[:, t]]))
    return torch.stack(outs, 1), M


def p_flat_offsets(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """A flat bank with per-stream row offsets, gather/scatter along rows."""
    off = (torch.arange(k_idx.shape[0]) * (M.shape[0] // k_idx.shape[0]))[:, None]
    outs = []
    for t in range(k_idx.shape[1]):
        idx = k_idx[:, t] + off                                   # [B, W] global rows
        rows = M[idx]
        dec = rows * torch.exp(g[:, t]).unsqueeze(-1)
        ret = torch.bmm(k_val[:, t].unsqueeze(1), dec).squeeze(1)
        delta = beta[:, t].unsqueeze(-1) * (v[:, t] - ret)
        M = M.index_put((idx,), dec + k_val[:, t].unsqueeze(-1) * delta.unsqueeze(1))
        outs.append(torch.bmm(q_val[:, t].unsqueeze(1), M[q_idx[:, t] + off]).squeeze(1))
    return torch.stack(outs, 1), M


def n_streams_mixed(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """Each stream retrieves from the rows of the other stream (a roll over the batch)."""
    M = M.clone()
    b = torch.arange(M.shape[0])[:, None]
    outs = []
    for t in range(k_idx.shape[1]):
        rows = M[b, k_idx[:, t]]
        dec = rows * torch.exp(g[:, t])[..., None]
        ret = torch.einsum("bw,bwd->bd", k_val[:, t], dec).roll(1, 0)
        delta = beta[:, t, None] * (v[:, t] - ret)
        M[b, k_idx[:, t]] = dec + k_val[:, t, :, None] * delta[:, None, :]
        outs.append((q_val[:, t, :, None] * M[b, q_idx[:, t]]).sum(1))
    return torch.stack(outs, 1), M


def n_streams_summed_reading(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """The reading sums over the streams (a reading of the whole batch)."""
    M = M.clone()
    b = torch.arange(M.shape[0])[:, None]
    outs = []
    for t in range(k_idx.shape[1]):
        rows = M[b, k_idx[:, t]]
        dec = rows * torch.exp(g[:, t])[..., None]
        delta = beta[:, t, None] * (v[:, t] - torch.einsum("bw,bwd->bd", k_val[:, t], dec))
        M[b, k_idx[:, t]] = dec + k_val[:, t, :, None] * delta[:, None, :]
        outs.append(torch.einsum("br,brd->d", q_val[:, t], M[b, q_idx[:, t]]))
    return torch.stack(outs), M



def p_inplace_after_loop(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """The bank changed in place after the loop (a foreign op on the final state)."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        dec = M[k_idx[t]] * torch.exp(g[t])[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    M.mul_(0.5)
    return torch.stack(outs), M


def p_two_layers(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """Two banks, the second loop's values computed from the first loop's readings
    (through a projection): both loops rewritten (the second in a later round)."""
    wo = torch.linspace(-1, 1, HD * HD).view(HD, HD)
    M1, M2 = M.clone(), M.clone() * 0.5
    outs = []
    for t in range(k_idx.shape[0]):
        dec = M1[k_idx[t]] * torch.exp(g[t])[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M1[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        r1 = (q_val[t][:, None] * M1[q_idx[t]]).sum(0)
        v2 = r1 @ wo
        dec2 = M2[q_idx[t]] * torch.exp(g[t, :R])[:, None]
        delta2 = beta[t] * (v2 - (q_val[t][:, None] * dec2).sum(0))
        M2[q_idx[t]] = dec2 + q_val[t][:, None] * delta2[None, :]
        outs.append((k_val[t][:, None] * M2[k_idx[t]]).sum(0))
    return torch.stack(outs), M1, M2


def p_view_of_bigger_bank(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """The loop writes in place into a view of a larger tensor, which is returned: an op
    on the view (the larger tensor sees its writes)."""
    big = torch.cat([M, M[:4]]).clone()
    Mv = big[:S]
    outs = []
    for t in range(k_idx.shape[0]):
        dec = Mv[k_idx[t]] * torch.exp(g[t])[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        Mv[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * Mv[q_idx[t]]).sum(0))
    return torch.stack(outs), big

POSITIVES = [p_setitem_mulsum, p_index_put_einsum, p_index_select_copy_matmul, p_gather_scatter_outer,
             p_index_add_increment, p_zeros_increment_added, p_scatter_add_no_gate_no_beta, p_bmm,
             p_out_buffer, p_product_keys, p_two_readings_scaled, p_negated_delta, p_scan,
             p_inplace_after_loop, p_sigmoid_decay, p_view_of_bigger_bank, p_constant_decay]
# ============================================================================ streams along two dims

H = 3


def inputs_heads(T=T, seed=0, requires_grad=False):
    """B x H streams: a [B, H, S/B, hd] bank, slots [B, H, T, W] / [B, H, T, R]."""
    d = inputs_batched(T=T, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    n = d["M"].shape[1]

    def heads(x):       # stream b's inputs for head 0, then other draws for heads 1..H-1
        rest = [torch.randn(x.shape, generator=gen).to(x.dtype) if x.is_floating_point() else
                torch.stack([torch.stack([torch.randperm(n, generator=gen)[:x.shape[-1]] for _ in range(x.shape[1])])
                             for _ in range(x.shape[0])]) for _ in range(H - 1)]
        return torch.stack([x] + rest, 1)

    d = {k: heads(x) for k, x in d.items()}
    d["beta"] = d["beta"].abs().clamp(max=0.9)
    d["g"] = -d["g"].abs()
    if requires_grad:
        for k in ("M", "k_val", "v", "beta", "g", "q_val"):
            d[k].requires_grad_(True)
    return d


def _heads_loop(M, k_idx, k_val, v, beta, g, q_idx, q_val, mix=lambda r: r, summed=False):
    """The token loop on a [B, H, S, hd] bank indexed per batch and head; ``mix`` is applied
    to each retrieval, ``summed`` reads one sum over the heads per batch element."""
    M = M.clone()
    b = torch.arange(M.shape[0])[:, None, None]
    h = torch.arange(M.shape[1])[None, :, None]
    outs = []
    for t in range(k_idx.shape[2]):
        dec = M[b, h, k_idx[:, :, t]] * torch.exp(g[:, :, t])[..., None]
        ret = mix(torch.einsum("bhw,bhwd->bhd", k_val[:, :, t], dec))
        delta = beta[:, :, t, None] * (v[:, :, t] - ret)
        M[b, h, k_idx[:, :, t]] = dec + k_val[:, :, t, :, None] * delta[:, :, None, :]
        rows = M[b, h, q_idx[:, :, t]]
        outs.append(torch.einsum("bhr,bhrd->bd", q_val[:, :, t], rows) if summed else
                    (q_val[:, :, t, :, None] * rows).sum(2))
    return torch.stack(outs, 1 if summed else 2), M


def p_heads_bank(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """A [B, H, S, hd] bank indexed per batch and head: M[b, h, idx[:, :, t]]."""
    return _heads_loop(M, k_idx, k_val, v, beta, g, q_idx, q_val)


def n_heads_mixed(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """Each head retrieves what the next head's rows hold (a roll over the heads)."""
    return _heads_loop(M, k_idx, k_val, v, beta, g, q_idx, q_val, mix=lambda r: r.roll(1, 1))


def n_heads_summed_reading(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """The reading sums over the heads (one reading per batch element)."""
    return _heads_loop(M, k_idx, k_val, v, beta, g, q_idx, q_val, summed=True)


def _views_loop(M, k_idx, k_val, v, beta, g, q_idx, q_val, peek=False):
    outs = []
    for b in range(M.shape[0]):
        Mb, ob = M[b], []           # stream b's rows, written in place through the view
        for t in range(k_idx.shape[1]):
            dec = Mb[k_idx[b, t]] * torch.exp(g[b, t])[:, None]
            delta = beta[b, t] * (v[b, t] - (k_val[b, t][:, None] * dec).sum(0))
            Mb[k_idx[b, t]] = dec + k_val[b, t][:, None] * delta[None, :]
            r = (q_val[b, t][:, None] * Mb[q_idx[b, t]]).sum(0)
            ob.append(r + M[(b + 1) % M.shape[0], 0] if peek else r)
        outs.append(torch.stack(ob))
    return torch.stack(outs), M


def p_stream_views_in_place(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """One loop per stream over ``M[b]``, a view of the bank, written in place: B loops,
    each an op on the view (the base sees the writes)."""
    return _views_loop(M.clone(), k_idx, k_val, v, beta, g, q_idx, q_val)


def n_base_read_in_loop(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """The same loops, but each token also reads the bank through its base ``M``."""
    return _views_loop(M.clone(), k_idx, k_val, v, beta, g, q_idx, q_val, peek=True)


def _shared_loop(M, k_idx, k_val, v, beta, g, q_idx, q_val, mix=lambda r: r):
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        dec = M[:, k_idx[t]] * torch.exp(g[:, t])[..., None]          # [B, W, hd]
        delta = beta[:, t, None] * (v[:, t] - mix((k_val[:, t, :, None] * dec).sum(1)))
        M[:, k_idx[t]] = dec + k_val[:, t, :, None] * delta[:, None, :]
        outs.append(torch.einsum("br,brd->bd", q_val[:, t], M[:, q_idx[t]]))
    return torch.stack(outs, 1), M


def p_shared_rows(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """A [B, S, hd] bank whose streams write and read the same slots: ``M[:, idx[t]]``."""
    return _shared_loop(M, k_idx, k_val, v, beta, g, q_idx, q_val)


def n_shared_rows_mixed(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """The same slots, but each stream retrieves what the other stream's rows hold."""
    return _shared_loop(M, k_idx, k_val, v, beta, g, q_idx, q_val, mix=lambda r: r.flip(0))


BATCHED = [p_batched_bank, p_flat_offsets, p_heads_bank, p_shared_rows, p_expanded_arange]
BATCHED_NEAR_MISSES = [n_streams_mixed, n_streams_summed_reading, n_heads_mixed, n_heads_summed_reading,
                       n_base_read_in_loop, n_shared_rows_mixed]


def inputs_for(fn, seed, requires_grad=False):
    """The inputs of a BATCHED program."""
    if fn.__name__.endswith("heads_bank") or "_heads_" in fn.__name__:
        return inputs_heads(seed=seed, requires_grad=requires_grad)
    if "_shared_rows" in fn.__name__:       # stream 0's slots for every stream
        d = inputs_batched(seed=seed, requires_grad=requires_grad)
        return d | dict(k_idx=d["k_idx"][0], q_idx=d["q_idx"][0])
    return inputs_batched(seed=seed, flat=fn is p_flat_offsets, requires_grad=requires_grad)
NEAR_MISSES = [n_read_before_write, n_whole_bank_decay, n_other_retrieval_weights, n_no_delta,
               n_readings_fed_back, n_tanh_bank, n_clamped_bank, n_gate_on_delta, n_undecayed_retrieval,
               n_beta_on_v_only, n_write_other_slots, n_tanh_decay, n_states_kept,
               n_mean_retrieval, n_extra_term, n_accumulate_put, n_double_bank,
               n_zeros_clamped_rows, n_zeros_plain_write]


# ============================================================================ one write slot per token (W = 1)

def inputs_w1(T=T, seed=0, R=R, requires_grad=False):
    """W = 1: ``k_idx``, ``k_val``, ``g`` as ``[T, 1]`` (the spellings below squeeze them as
    a user would); ``R`` read slots (1 for R = 1)."""
    d = inputs(T=T, seed=seed, requires_grad=False)
    gen = torch.Generator().manual_seed(seed + 1)
    d.update(k_idx=d["k_idx"][:, :1].clone(), k_val=d["k_val"][:, :1].clone(), g=d["g"][:, :1].clone(),
             q_idx=torch.randint(0, S, (T, R), generator=gen), q_val=torch.randn(T, R, generator=gen))
    if requires_grad:
        for k in ("M", "k_val", "v", "beta", "g", "q_val"):
            d[k].requires_grad_(True)
    return d


def p_w1_row_squeezed(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """One slot: the row taken as ``[hd]`` (``M[k_idx[t]][0]``), scalar weight and gate,
    the row written back from an ``[hd]`` value (broadcast into the ``[1, hd]`` rows)."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        dec = M[k_idx[t]][0] * torch.exp(g[t, 0])
        delta = beta[t] * (v[t] - k_val[t, 0] * dec)
        M[k_idx[t]] = dec + k_val[t, 0] * delta
        outs.append(q_val[t] @ M[q_idx[t]])
    return torch.stack(outs), M


def p_w1_sliced_index(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """One slot from ``[T]`` tensors: index ``ki[t:t+1]``, index_select / index_copy_,
    ``squeeze``/``view`` between ``[1, hd]`` and ``[hd]``, R = 1 reading by squeeze."""
    ki, kv, gg, qi, qv = k_idx[:, 0], k_val[:, 0], g[:, 0], q_idx[:, 0], q_val[:, 0]
    M = M.clone()
    outs = []
    for t in range(ki.shape[0]):
        idx = ki[t:t + 1]
        dec = M.index_select(0, idx) * gg[t].exp()
        delta = (v[t] - kv[t] * dec.squeeze(0)) * beta[t]
        M.index_copy_(0, idx, (dec + kv[t] * delta).view(1, -1))
        outs.append(qv[t] * M[qi[t:t + 1]].squeeze(0))
    return torch.stack(outs), M


def p_w1_gate_on_update(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """``exp(g) * (rows + k * delta)`` with the retrieval from the decayed row: with one slot
    this is the spec's step with beta' = exp(g) * beta (a near-miss for W > 1)."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows = M[k_idx[t]]
        a = torch.exp(g[t])
        delta = beta[t] * (v[t] - k_val[t] * rows * a)
        M[k_idx[t]] = a * (rows + k_val[t] * delta)
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_w1_undecayed_retrieval(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """One slot, the retrieval from the row before its decay."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows = M[k_idx[t]]
        delta = beta[t] * (v[t] - k_val[t] * rows)
        M[k_idx[t]] = rows * torch.exp(g[t]) + k_val[t] * delta
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_w1_weight_only_in_retrieval(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """One slot, k in the retrieval but not on the delta written (beta / k would be needed)."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        dec = M[k_idx[t]] * torch.exp(g[t])
        M[k_idx[t]] = dec + beta[t] * (v[t] - k_val[t] * dec)
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


W1_POSITIVES = [p_setitem_mulsum, p_gather_scatter_outer, p_index_add_increment, p_out_buffer, p_scan,
                p_w1_row_squeezed, p_w1_sliced_index, p_w1_gate_on_update]
W1_NEAR_MISSES = [n_w1_undecayed_retrieval, n_w1_weight_only_in_retrieval]


def inputs_w1_batched(T=T, seed=0, flat=False):
    """B streams, one write slot and one read slot each: ``[B, T]`` indices and weights."""
    d = inputs_batched(T=T, seed=seed, flat=flat)
    for k in ("k_idx", "k_val", "g", "q_idx", "q_val"):
        d[k] = d[k][..., 0].clone()
    return d


def p_w1_batched_bank(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """A [B, S, hd] bank, one row per stream: ``M[arange(B), idx[:, t]]`` is ``[B, hd]``."""
    M = M.clone()
    b = torch.arange(M.shape[0])
    outs = []
    for t in range(k_idx.shape[1]):
        dec = M[b, k_idx[:, t]] * torch.exp(g[:, t])[:, None]
        delta = beta[:, t, None] * (v[:, t] - k_val[:, t, None] * dec)
        M[b, k_idx[:, t]] = dec + k_val[:, t, None] * delta
        outs.append(q_val[:, t, None] * M[b, q_idx[:, t]])
    return torch.stack(outs, 1), M


def n_w1_flat_streams(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """One row per stream of a flat bank (per-stream offsets): the same rows as a single
    stream whose slots retrieve each from their own row only; left alone."""
    off = torch.arange(k_idx.shape[0]) * (M.shape[0] // k_idx.shape[0])
    outs = []
    for t in range(k_idx.shape[1]):
        idx = k_idx[:, t] + off
        dec = M[idx] * torch.exp(g[:, t])[:, None]
        delta = beta[:, t, None] * (v[:, t] - k_val[:, t, None] * dec)
        M = M.index_put((idx,), dec + k_val[:, t, None] * delta)
        outs.append(q_val[:, t, None] * M[q_idx[:, t] + off])
    return torch.stack(outs, 1), M


# ============================================================================ in-place changes of per-token inputs

def n_inplace_beta(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """beta computed in the loop, then clamped in place (the step must use the clamped value)."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        b = beta[t] * 1.0
        b.clamp_(0.2, 0.5)
        dec = M[k_idx[t]] * torch.exp(g[t])[:, None]
        delta = b * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def n_inplace_through_view(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """v computed in the loop, half of it zeroed through a view."""
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        vv = v[t] * 1.0
        vv.view(2, -1)[0].zero_()
        dec = M[k_idx[t]] * torch.exp(g[t])[:, None]
        delta = beta[t] * (vv - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


NEAR_MISSES += [n_inplace_beta, n_inplace_through_view]


# ============================================================================ scan bodies computing their inputs

D_IN = 12


class ScanProjected(torch.nn.Module):
    """A scan whose body computes its per-token inputs from the token's slice of ``xs``
    and the layer's parameters (Gated-DeltaNet-style gate, sigmoid beta, softmax weights,
    projected value, optionally topk slots); hoisted out of the scan and applied to all
    tokens at once. ``variant``: "gdn", "topk", "w1" (one slot), "noise" (random numbers
    in the body: left alone), "inplace" (beta clamped in place in the body: left alone)."""

    def __init__(self, variant="gdn", w=W):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.variant, self.w = variant, w
        self.wv = torch.nn.Parameter(torch.randn(D_IN, HD, generator=gen) * 0.3)
        self.wk = torch.nn.Parameter(torch.randn(D_IN, S, generator=gen) * 0.3)
        self.A_log = torch.nn.Parameter(torch.randn(w, generator=gen) * 0.3)
        self.dt_bias = torch.nn.Parameter(torch.randn(w, generator=gen) * 0.3)
        self.bank = torch.nn.Parameter(torch.randn(S, HD, generator=gen) * 0.3)

    def forward(self, x, k_idx, logits, b, a, q_idx, q_logits):
        from torch._higher_order_ops.scan import scan
        variant = self.variant

        def body(M, xs):
            x_t, ki, l_t, b_t, a_t, qi, ql = xs
            beta = torch.sigmoid(b_t)
            if variant == "inplace":
                beta.clamp_(0.3, 0.6)
            g = -torch.exp(self.A_log) * F.softplus(a_t + self.dt_bias)
            kv = torch.softmax(l_t, -1)
            v = x_t @ self.wv
            if variant == "noise":
                v = v + 0.1 * torch.randn_like(v)
            if variant == "topk":
                ks, ki = torch.topk(x_t @ self.wk, self.w)
                kv = torch.softmax(ks, -1)
            dec = M[ki] * torch.exp(g)[:, None]
            delta = beta * (v - (kv[:, None] * dec).sum(0))
            M = M.index_put((ki,), dec + kv[:, None] * delta[None])
            return M, (torch.softmax(ql, -1)[:, None] * M[qi]).sum(0)

        M, outs = scan(body, self.bank * 1.0, (x, k_idx, logits, b, a, q_idx, q_logits))
        return outs, M


def scan_inputs(T=T, w=W, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(T, D_IN, generator=gen),
            torch.stack([torch.randperm(S, generator=gen)[:w] for _ in range(T)]),
            torch.randn(T, w, generator=gen), torch.randn(T, generator=gen), torch.randn(T, w, generator=gen),
            torch.randint(0, S, (T, R), generator=gen), torch.randn(T, R, generator=gen))


def n_scan_carried_beta(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """beta computed in the body from a second carry (loop state, not a per-token input)."""
    from torch._higher_order_ops.scan import scan

    def body(carry, xs):
        M, c = carry
        ki, kv, vv, bb = xs
        b = torch.sigmoid(bb + c)
        dec = M[ki]
        delta = b * (vv - (kv[:, None] * dec).sum(0))
        M = M.index_put((ki,), dec + kv[:, None] * delta[None])
        return (M, c + 0.5), (kv[:, None] * M[ki]).sum(0)

    (M, _), outs = scan(body, (M, torch.zeros(())), (k_idx, k_val, v, beta))
    return outs, M
