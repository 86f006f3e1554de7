"""Phase 2 as three launches per chunk step, each spread over the whole GPU (the step walk).

The column walk (``column_walk.py``) runs ~100 programs that each walk every chunk: a step is
a chain of 32-byte gathers inside one program per SM at most, and measured ~50 us per
step at config A against ~8 us of memory time. Spreading a step over every SM with one
resident program per SM and grid barriers (a persistent grid walk) serialises the items of
each program and measured slower still. Here the hardware schedules the items: a step is

- ``_step_gather_kernel``, one program per (stream, token, column block): gather the
  token's ``W + R`` chunk-start row segments (``BD`` columns: 256 bytes at BD = 128),
  ``u = beta (v - r0)`` and ``inter`` to small fp32 buffers;
- ``_step_mix_kernel``, one program per (stream, token block, column slice): the
  block's ``delta = X u`` and readings ``inter + QKX u``;
- ``_step_write_kernel``, one program per (stream, tile of ``NG`` positions of the
  slot-sorted write order, column block): each distinct written row once,
  ``exp(gend) M0[s] + sum_j coef_j delta_j`` in the run's order (``tiles._write_tile``),
  the old row to the undo log with ``SAVE``.

Kernel boundaries order the steps (chunk c + 1 gathers what chunk c wrote). No float
atomics: bitwise reproducible. The host loops over the chunks (shapes only), so this
walk serves eager calls and CUDA graphs; a traced call runs the same items in one launch
(``queue_walk.py``), whose one compilation covers every ``T`` (docs/spec.md section 6).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..common.tiles import (ROWS_MAX_CP, _block_program, _column_block, _gather_index,
                            _gather_rows, _grid_dependency, _token_program, _write_head,
                            _write_tile)
from ..runtime import graphs
from ..runtime.launch import Relaunch, pdl, pow2


@triton.jit
def _store_u_inter(v_ptr, beta_ptr, u_ptr, i_ptr, keep_ptr, r0, inter, p, b, c, i, P, T, hd,
                   cols, cm, C: tl.constexpr, CP: tl.constexpr, KEEP: tl.constexpr):
    """``u = beta (v - r0)`` and ``inter`` of token ``i`` into the ``[P, CP, hd]`` buffers;
    with ``KEEP`` also ``v - r0`` into the backward's ``[NC * P, CP, hd]`` buffer."""
    tg = c * C + i
    vv = tl.load(v_ptr + (p.to(tl.int64) * T + tg) * hd + cols, mask=cm & (tg < T),
                 other=0.0).to(tl.float32)
    bt = tl.load(beta_ptr + b.to(tl.int64) * C + i)
    buf = (p.to(tl.int64) * CP + i) * hd + cols
    tl.store(u_ptr + buf, bt * (vv - r0), mask=cm)
    tl.store(i_ptr + buf, inter, mask=cm)
    if KEEP:
        tl.store(keep_ptr + c.to(tl.int64) * P * CP * hd + buf, vv - r0, mask=cm)


@triton.jit
def _mix_block(X_ptr, QKX_ptr, u_ptr, i_ptr, d_ptr, out_ptr, b, p, c, T, hd, t0, cols, cm,
               C: tl.constexpr, MB: tl.constexpr, TB: tl.constexpr, CP: tl.constexpr,
               PREC: tl.constexpr):
    """``delta = X u`` and ``y = inter + QKX u`` for tokens ``[t0, t0 + TB)`` and columns
    ``cols`` of one stream (both matrices are lower triangular: blocks up to the diagonal)."""
    toks = t0 + tl.arange(0, TB)
    tm = toks < C
    buf = (p.to(tl.int64) * CP + toks)[:, None] * hd + cols[None, :]
    y = tl.load(i_ptr + buf, mask=tm[:, None] & cm[None, :], other=0.0, cache_modifier=".cg")
    d = tl.zeros([TB, MB], tl.float32)
    k0 = 0
    while k0 < t0 + TB:   # t0 may be a runtime value (the interpreter's range() refuses it)
        ks = k0 + tl.arange(0, TB)
        km = ks < C
        uk = tl.load(u_ptr + (p.to(tl.int64) * CP + ks)[:, None] * hd + cols[None, :],
                     mask=km[:, None] & cm[None, :], other=0.0, cache_modifier=".cg")
        xo = b.to(tl.int64) * C * C + toks[:, None] * C + ks[None, :]
        xm = tm[:, None] & km[None, :]
        d += tl.dot(tl.load(X_ptr + xo, mask=xm, other=0.0), uk, input_precision=PREC)
        y += tl.dot(tl.load(QKX_ptr + xo, mask=xm, other=0.0), uk, input_precision=PREC)
        k0 += TB
    tl.store(d_ptr + buf, d, mask=tm[:, None] & cm[None, :])
    tg = c * C + toks
    tl.store(out_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
             y.to(out_ptr.dtype.element_ty), mask=(tm & (tg < T))[:, None] & cm[None, :])


@triton.jit
def _mix_rows_load(X_ptr, QKX_ptr, b, t0, C: tl.constexpr, TB: tl.constexpr,
                   CP: tl.constexpr):
    """The rows of X and QKX of tokens ``[t0, t0 + TB)``, whole (columns up to the block's
    last token: both are lower triangular): Phase 1's arrays, loaded before the wait for
    the gathers (early loads)."""
    toks = t0 + tl.arange(0, TB)
    ks = tl.arange(0, CP)
    xo = b.to(tl.int64) * C * C + toks[:, None] * C + ks[None, :]
    xm = (toks < C)[:, None] & ((ks < C) & (ks < t0 + TB))[None, :]
    return tl.load(X_ptr + xo, mask=xm, other=0.0), tl.load(QKX_ptr + xo, mask=xm, other=0.0)


@triton.jit
def _mix_rows_products(x, q, u_ptr, i_ptr, d_ptr, out_ptr, p, c, T, hd, t0, cols, cm,
                       C: tl.constexpr, TB: tl.constexpr, CP: tl.constexpr,
                       PREC: tl.constexpr):
    """``_mix_block`` from the rows ``_mix_rows_load`` gave, once the gathers are done:
    one round trip to L2 for ``u`` and ``inter``, one product each over all of them."""
    toks = t0 + tl.arange(0, TB)
    tm = toks < C
    ks = tl.arange(0, CP)
    km = (ks < C) & (ks < t0 + TB)
    buf = (p.to(tl.int64) * CP + toks)[:, None] * hd + cols[None, :]
    y = tl.load(i_ptr + buf, mask=tm[:, None] & cm[None, :], other=0.0, cache_modifier=".cg")
    u = tl.load(u_ptr + (p.to(tl.int64) * CP + ks)[:, None] * hd + cols[None, :],
                mask=km[:, None] & cm[None, :], other=0.0, cache_modifier=".cg")
    d = tl.dot(x, u, input_precision=PREC)
    y += tl.dot(q, u, input_precision=PREC)
    tl.store(d_ptr + buf, d, mask=tm[:, None] & cm[None, :])
    tg = c * C + toks
    tl.store(out_ptr + (p.to(tl.int64) * T + tg)[:, None] * hd + cols[None, :],
             y.to(out_ptr.dtype.element_ty), mask=(tm & (tg < T))[:, None] & cm[None, :])


@triton.jit(do_not_specialize=["c", "T", "NC"])
def _step_mix_kernel(X_ptr, QKX_ptr, u_ptr, i_ptr, d_ptr, out_ptr, c, T, hd, NC,
                     C: tl.constexpr, MB: tl.constexpr, TB: tl.constexpr, CP: tl.constexpr,
                     PREC: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr = False):
    """``_mix_block`` as a launch of its own: one program per (stream, token block,
    column slice), so the chunk's small products run on many SMs at once. ``ROWS``: the
    block's whole rows of the matrices at once, loaded before the wait
    (``_mix_rows_load``)."""
    if ROWS:
        _grid_dependency(PDL == 1)
        p, b, t0, cols, cm = _block_program(NC, c, hd, MB, TB, CP)
        x, q = _mix_rows_load(X_ptr, QKX_ptr, b, t0, C, TB, CP)
        _grid_dependency(PDL >= 2)
        _mix_rows_products(x, q, u_ptr, i_ptr, d_ptr, out_ptr, p, c, T, hd, t0, cols, cm, C,
                           TB, CP, PREC)
    else:
        _grid_dependency(PDL)
        p, b, t0, cols, cm = _block_program(NC, c, hd, MB, TB, CP)
        _mix_block(X_ptr, QKX_ptr, u_ptr, i_ptr, d_ptr, out_ptr, b, p, c, T, hd, t0, cols, cm,
                   C, MB, TB, CP, PREC)


@triton.jit(do_not_specialize=["c", "P", "T", "NC"])
def _step_gather_kernel(bank_ptr, slot_ptr, ev_ptr, v_ptr, beta_ptr, u_ptr, i_ptr, keep_ptr,
                        c, P, T, hd, NC, C: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
                        BD: tl.constexpr, WP: tl.constexpr, RP: tl.constexpr, CP: tl.constexpr,
                        PDL: tl.constexpr, KEEP: tl.constexpr = False):
    _grid_dependency(PDL == 1)
    p, i, b, base, cols, cm = _token_program(NC, c, hd, C, W + R, BD)
    slw, evw = _gather_index(slot_ptr, ev_ptr, base, W, WP)
    slr, evr = _gather_index(slot_ptr, ev_ptr, base + W, R, RP)
    _grid_dependency(PDL >= 2)
    r0 = _gather_rows(bank_ptr, slw, evw, cols, cm, hd)
    inter = _gather_rows(bank_ptr, slr, evr, cols, cm, hd)
    _store_u_inter(v_ptr, beta_ptr, u_ptr, i_ptr, keep_ptr, r0, inter, p, b, c, i, P, T, hd,
                   cols, cm, C, CP, KEEP)


@triton.jit(do_not_specialize=["c", "P", "NC"])
def _step_write_kernel(bank_ptr, d_ptr, run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr,
                       run_coef_ptr, log_ptr, c, P, hd, NC, C: tl.constexpr, W: tl.constexpr,
                       BD: tl.constexpr, NG: tl.constexpr, KW: tl.constexpr, CP: tl.constexpr,
                       SAVE: tl.constexpr, PDL: tl.constexpr,
                       CL: tl.constexpr = 1):
    """The runs of one tile of ``NG`` write positions, in ``CL`` column blocks of ``BD`` one
    after the other: the run headers load once for all of them (as the dB launch)."""
    _grid_dependency(PDL == 1)
    NRT: tl.constexpr = (C * W + NG - 1) // NG
    pid = tl.program_id(0)       # p * NRT + tile
    p = pid // NRT
    f0 = (pid % NRT) * NG
    b = p * NC + c
    sc = tl.arange(0, BD)
    rb = b.to(tl.int64) * C * W
    lb = (c * P + p).to(tl.int64) * C * W   # the undo log is chunk-major
    sl, ln, dec, tk, cf = _write_head(run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr,
                                      run_coef_ptr, rb, f0, C * W, NG, KW)
    _grid_dependency(PDL >= 2)   # the run headers are Phase 1's: early loads
    for j in tl.static_range(CL):
        cols, cm, scr_d = _column_block(d_ptr, p, tl.program_id(1), j, sc, hd, BD, CP, CL)
        _write_tile(bank_ptr, run_tok_ptr, run_coef_ptr, scr_d, rb, f0, sl, ln, dec, tk, cf,
                    cols, cm, sc, hd, log_ptr, lb, NG, KW, BD, SAVE, hd)


def step_buffers(bank: Tensor, P: int, CP: int) -> tuple[Tensor, Tensor, Tensor]:
    """A chunk step's ``[P, CP, hd]`` scratch, as the gather, product and write items read
    it: ``u`` and ``inter`` in fp32, ``delta`` in bf16 for a bf16 bank (the write reads
    delta for every run member: half the L2 traffic; the written rows are stored in bf16
    anyway, and the sums over a run stay fp32), else fp32."""
    hd = bank.shape[1]
    u, inter = (torch.empty(P, CP, hd, dtype=torch.float32, device=bank.device)
                for _ in range(2))
    low = bank.dtype == torch.bfloat16
    delta = torch.empty(P, CP, hd, dtype=torch.bfloat16 if low else torch.float32,
                        device=bank.device)
    return u, inter, delta


def step_walk(bank: Tensor, pl, v: Tensor, out: Tensor, saved: Tensor, save: bool,
              config: dict, prec: str, keep: Tensor | None = None):
    """The step walk of plan ``pl``: three launches per chunk, in chunk order; advances
    ``bank``, writes the readings to ``out`` and with ``save`` the undo log to ``saved``.
    ``keep`` (``[NC * P, CP, hd]`` fp32): receives ``v - r0`` for the backward."""
    P, C, W, R, NC = pl.P, pl.C, pl.W, pl.R, pl.NC
    hd = bank.shape[1]
    CP = pow2(C)
    BD, BDW, NG = config["BD_STEP"], config["BD_STEP_W"], config["NG_STEP"]
    NCB, NCBW = -(-hd // BD), -(-hd // BDW)
    nrt = -(-C * W // NG)
    u, inter, delta = step_buffers(bank, P, CP)
    ru = pl.runs
    MBM, TBM = config["MB_MIX"], min(config["TB_MIX"], CP)
    pd = pdl(config, bank)
    gather = Relaunch(_step_gather_kernel, (P * C, NCB), "c", bank, pl.slot, pl.ev, v, pl.beta,
                      u, inter, u if keep is None else keep, 0, P, pl.T, hd, NC, C=C, W=W,
                      R=R, BD=BD, WP=pow2(W), RP=pow2(R), CP=CP,
                      KEEP=keep is not None, num_warps=config["WARPS_STEP"], num_stages=1, **pd)
    mix = Relaunch(_step_mix_kernel, (P * (CP // TBM), -(-hd // MBM)), "c", pl.X, pl.QKX, u,
                   inter, delta, out, 0, pl.T, hd, NC, C=C, MB=MBM, TB=TBM, CP=CP, PREC=prec,
                   ROWS=bool(config["MIX_ROWS"]) and CP <= ROWS_MAX_CP,
                   num_warps=config["WARPS_MIX"], num_stages=1, **pd)
    CLW = min(config["CL_WRITE"], NCBW)   # column blocks per write program
    write = Relaunch(_step_write_kernel, (P * nrt, -(-NCBW // CLW)), "c", bank, delta, ru.slot,
                     ru.length, ru.decay, ru.tok, ru.coef, saved, 0, P, hd, NC, C=C, W=W, BD=BDW,
                     NG=NG, KW=config["KW_STEP"], CP=CP, SAVE=save,
                     CL=CLW,
                     num_warps=config["WARPS_STEP_W"],
                     num_stages=1, **pd)
    def body():
        for c in range(NC):   # kernel boundaries order the chunks
            gather(c)
            mix(c)
            write(c)

    # the same launches as an earlier call: replayed from its CUDA graph (graphs.py)
    graphs.run(("forward", NC, gather.key, mix.key, write.key), body,
               bank.device, config["WALK_GRAPHS"])

