"""Phase 2 as one persistent launch over the whole GPU, synchronised by grid barriers.

The column walk of ``phase2.py`` gives each (stream, 16-column block) one program, so a
chunk step is two chains of dependent 32-byte gathers inside ~100 programs: latency
bound (``benchmarks/NOTES.md``). Here every SM takes part in every step, and each
gathered row segment is ``BD`` columns wide (256 bytes at BD=128 in bf16). Per chunk:

- stage 1, items (stream, token, column block): gather the token's ``W + R`` chunk-start
  row segments, ``r0`` and ``inter``; ``u = beta (v - r0)`` and ``inter`` go to a small
  fp32 buffer (L2 resident).
- grid barrier;
- stage 2, items (stream, column block, tile of ``NG`` positions of the slot-sorted write
  order of ``phase1.Runs``): ``delta = X u`` (recomputed per item: a C x C by C x BD
  product is cheaper than a third barrier), the run sums as one product ``G delta`` with
  ``G[run, token] = sum of the run's coefficients for that token`` (built in registers,
  a fixed order: deterministic), then each distinct written row once:
  ``exp(gend) M0[s] + (G delta)[s]``. One more item per (stream, column block) writes
  the readings ``inter + QKX u``;
- grid barrier.

Each row segment has one writer per step and every sum has a fixed order: no float
atomics, bitwise reproducible. The barriers are an integer counter (acquire/release
atomics); the bank and the u buffer are read with ``.cg`` loads (L2, never a stale L1
line written by another SM). The grid is at most one program per SM, all resident, so
the barrier cannot deadlock; under ``TRITON_INTERPRET`` the grid is one program (the
interpreter runs programs one after another) and the same stride loops do all items.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .phase2 import _run_tile
from .step import _store_u_inter


@triton.jit
def _grid_barrier(cnt_ptr, target):
    """Wait until every program has arrived ``target // num_programs`` times in all."""
    tl.debug_barrier()   # this program's stores are issued before it announces itself
    tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")
    while tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu") < target:
        pass
    tl.debug_barrier()


@triton.jit
def _gather_item(bank_ptr, slot_ptr, ev_ptr, v_ptr, beta_ptr, u_ptr, i_ptr,
                 it, c, P, T, hd, NC, NCB, C: tl.constexpr, W: tl.constexpr,
                 R: tl.constexpr, BD: tl.constexpr, EW: tl.constexpr, CP: tl.constexpr):
    E: tl.constexpr = W + R
    cb = it % NCB
    rest = it // NCB
    i = rest % C
    p = rest // C
    b = p * NC + c
    cols = cb * BD + tl.arange(0, BD)
    cm = cols < hd
    base = (b.to(tl.int64) * C + i) * E
    r0 = tl.zeros([BD], tl.float32)
    inter = tl.zeros([BD], tl.float32)
    for e0 in range(0, E, EW):
        ents = e0 + tl.arange(0, EW)
        em = ents < E
        sl = tl.load(slot_ptr + base + ents, mask=em, other=-1)
        wt = tl.load(ev_ptr + base + ents, mask=em, other=0.0)
        rows = tl.load(bank_ptr + sl.to(tl.int64)[:, None] * hd + cols[None, :],
                       mask=(sl >= 0)[:, None] & cm[None, :], other=0.0, cache_modifier=".cg")
        x = wt[:, None] * rows.to(tl.float32)
        is_w = (ents < W)[:, None]
        r0 += tl.sum(tl.where(is_w, x, 0.0), axis=0)
        inter += tl.sum(tl.where(is_w, 0.0, x), axis=0)
    _store_u_inter(v_ptr, beta_ptr, u_ptr, i_ptr, u_ptr, r0, inter, p, b, c, i, P, T, hd, cols,
                   cm, C, CP, False)


@triton.jit
def _write_item(bank_ptr, X_ptr, QKX_ptr, out_ptr, u_ptr, i_ptr,
                run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr, run_coef_ptr,
                log_ptr, it, c, P, T, hd, NC, NCB, NRT, C: tl.constexpr,
                W: tl.constexpr, BD: tl.constexpr, NG: tl.constexpr, CP: tl.constexpr,
                PREC: tl.constexpr, PREC_G: tl.constexpr, SAVE: tl.constexpr):
    rt = it % (NRT + 1)          # NRT write tiles, then the readings
    rest = it // (NRT + 1)
    cb = rest % NCB
    p = rest // NCB
    b = p * NC + c
    cols = cb * BD + tl.arange(0, BD)
    cm = cols < hd
    ks = tl.arange(0, CP)
    km = ks < C
    u = tl.load(u_ptr + (p.to(tl.int64) * CP + ks)[:, None] * hd + cols[None, :],
                mask=km[:, None] & cm[None, :], other=0.0, cache_modifier=".cg")
    mo = b.to(tl.int64) * C * C + ks[:, None] * C + ks[None, :]
    mm = km[:, None] & km[None, :]
    if rt == NRT:
        y = tl.load(i_ptr + (p.to(tl.int64) * CP + ks)[:, None] * hd + cols[None, :],
                    mask=km[:, None] & cm[None, :], other=0.0, cache_modifier=".cg")
        y += tl.dot(tl.load(QKX_ptr + mo, mask=mm, other=0.0), u, input_precision=PREC)
        tg = c * C + ks
        tl.store(out_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
                 y.to(out_ptr.dtype.element_ty), mask=(km & (tg < T))[:, None] & cm[None, :])
    else:
        delta = tl.dot(tl.load(X_ptr + mo, mask=mm, other=0.0), u, input_precision=PREC)
        rb = b.to(tl.int64) * C * W
        pos = rt * NG + tl.arange(0, NG)
        fm = pos < C * W
        sl, ln, dec, ro, wm = _run_tile(run_slot_ptr, run_len_ptr, run_decay_ptr, rb, pos, fm,
                                        cols, cm, hd)
        old = tl.load(bank_ptr + ro, mask=wm, other=0.0, cache_modifier=".cg")
        if SAVE:   # the undo log (chunk-major): the old row at its run's start
            lb = (c * P + p).to(tl.int64) * C * W
            tl.store(log_ptr + (lb + pos).to(tl.int64)[:, None] * hd + cols[None, :],
                     old.to(log_ptr.dtype.element_ty), mask=wm)
        G = tl.zeros([NG, CP], tl.float32)
        m = 0
        n_max = tl.max(ln, axis=0)
        while m < n_max:  # data-dependent trip count: the longest run of the tile
            on = m < ln
            tk = tl.load(run_tok_ptr + rb + pos + m, mask=on, other=-1)
            cf = tl.load(run_coef_ptr + rb + pos + m, mask=on, other=0.0)
            G += tl.where(tk[:, None] == ks[None, :], cf[:, None], 0.0)
            m += 1
        new = dec[:, None] * old.to(tl.float32) + tl.dot(G, delta, input_precision=PREC_G)
        tl.store(bank_ptr + ro, new.to(bank_ptr.dtype.element_ty), mask=wm)


@triton.jit(do_not_specialize=["P", "T", "NC", "NCB", "NRT"])
def _walk_kernel(bank_ptr, slot_ptr, ev_ptr, X_ptr, QKX_ptr, v_ptr, beta_ptr, out_ptr,
                 run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr, run_coef_ptr,
                 u_ptr, i_ptr, cnt_ptr, log_ptr, P, T, hd, NC, NCB, NRT,
                 C: tl.constexpr, W: tl.constexpr, R: tl.constexpr, BD: tl.constexpr,
                 EW: tl.constexpr, NG: tl.constexpr, CP: tl.constexpr, SAVE: tl.constexpr,
                 PREC: tl.constexpr, PREC_G: tl.constexpr, ONE_PROGRAM: tl.constexpr,
                 STAGES: tl.constexpr = 1):
    # STAGES: software-pipelining depth of the item loops. 1 (no pipelining) is what Triton
    # does by default here and what was measured; 2 compiles to cp.async prefetch of the
    # next item (sm_90: 131 KB shared memory) and is not yet measured
    # (benchmarks/NOTES.md, next steps)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n1 = P * C * NCB
    n2 = P * NCB * (NRT + 1)
    arrivals = 0
    c = 0
    while c < NC:  # runtime trip count: one compile for every T
        if ONE_PROGRAM:  # the interpreter's range() refuses runtime bounds
            it = 0
            while it < n1:
                _gather_item(bank_ptr, slot_ptr, ev_ptr, v_ptr, beta_ptr, u_ptr, i_ptr,
                             it, c, P, T, hd, NC, NCB, C, W, R, BD, EW, CP)
                it += 1
        else:
            for it in tl.range(pid, n1, nprog, num_stages=STAGES):
                _gather_item(bank_ptr, slot_ptr, ev_ptr, v_ptr, beta_ptr, u_ptr, i_ptr,
                             it, c, P, T, hd, NC, NCB, C, W, R, BD, EW, CP)
        arrivals += nprog
        _grid_barrier(cnt_ptr, arrivals)
        if ONE_PROGRAM:
            it = 0
            while it < n2:
                _write_item(bank_ptr, X_ptr, QKX_ptr, out_ptr, u_ptr, i_ptr, run_slot_ptr,
                            run_len_ptr, run_decay_ptr, run_tok_ptr, run_coef_ptr, log_ptr,
                            it, c, P, T, hd, NC, NCB, NRT, C, W, BD, NG, CP, PREC,
                            PREC_G, SAVE)
                it += 1
        else:
            for it in tl.range(pid, n2, nprog, num_stages=STAGES):
                _write_item(bank_ptr, X_ptr, QKX_ptr, out_ptr, u_ptr, i_ptr, run_slot_ptr,
                            run_len_ptr, run_decay_ptr, run_tok_ptr, run_coef_ptr, log_ptr,
                            it, c, P, T, hd, NC, NCB, NRT, C, W, BD, NG, CP, PREC,
                            PREC_G, SAVE)
        arrivals += nprog
        _grid_barrier(cnt_ptr, arrivals)
        c += 1
