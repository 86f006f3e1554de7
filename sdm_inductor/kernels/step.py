"""Phase 2 as two or three launches per chunk step, each spread over the whole GPU (the step walk).

The column walk (``phase2.py``) runs ~100 programs that each walk every chunk: a step is
a chain of 32-byte gathers inside one program per SM at most, and measured ~50 us per
step at config A against ~8 us of memory time (``benchmarks/NOTES.md``). The grid walk
(``walk.py``) spreads a step over every SM but, with one resident program per SM,
serialises the items of each program. Here the hardware schedules the items: a step is

- ``_step_gather_kernel``, one program per (stream, token, column block): gather the
  token's ``W + R`` chunk-start row segments (``BD`` columns: 256 bytes at BD = 128),
  ``u = beta (v - r0)`` and ``inter`` to small fp32 buffers;
- ``_step_mix_kernel``, one program per (stream, token block, column slice): the
  block's ``delta = X u`` and readings ``inter + QKX u``;
- ``_step_write_kernel``, one program per (stream, tile of ``NG`` positions of the
  slot-sorted write order, column block): each distinct written row once,
  ``exp(gend) M0[s] + sum_j coef_j delta_j`` in the run's order (``phase2._write_tile``),
  the old row to the undo log with ``SAVE``.

Kernel boundaries order the steps (chunk c + 1 gathers what chunk c wrote). No float
atomics: bitwise reproducible. The host loops over the chunks (shapes only), so this
walk serves eager calls and CUDA graphs; a traced call keeps the single-launch column
walk, whose one compilation covers every ``T`` (SDM_SPEC section 6).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .phase2 import _write_head, _write_tile


@triton.jit
def _grid_dependency(PDL: tl.constexpr):
    """First statement of every step kernel. With ``PDL`` (programmatic dependent launch,
    sm_90+: ``launch.pdl``), the kernel's programs may be resident before the previous
    kernel in the stream has finished: wait for it (its writes then visible) before any
    load or store, then let the next kernel's programs launch, so a launch's latency hides
    behind the tail of the one before.

    Kernels that call it twice, as ``_grid_dependency(PDL == 1)`` first and
    ``_grid_dependency(PDL == 2)`` after their *early loads*, wait at the second call when
    ``PDL == 2``. Early loads read only what no launch of the walk writes (Phase 1's arrays,
    the call's inputs, the forward's undo log in the backward): all of it was complete
    before the walk's first launch, and a programmatic launch starts only once the kernel
    before it has passed its own wait, so the kernel two back has finished. Their latency
    then overlaps the previous kernel's tail instead of following it (kernels without a
    ``PDL == 3`` form of their own treat 3 as 2).

    ``PDL == 3`` goes further in the backward walk (``step_backward``): launches whose work
    needs nothing of the launch just before them do it before waiting, and loads of what
    the walk itself wrote two or more launches back go before the wait through L2 (``.cg``).
    Each such kernel says why its early work is safe where it does it."""
    _wait(PDL)
    _launch_dependents(PDL)


@triton.jit
def _wait(ON: tl.constexpr):
    """``griddepcontrol.wait`` alone (``PDL == 3``: where a kernel let the next one launch
    before its own wait, ``_launch_dependents``; also half of ``_grid_dependency``)."""
    if ON:
        tl.extra.cuda.gdc_wait()


@triton.jit
def _launch_dependents(ON: tl.constexpr):
    """``griddepcontrol.launch_dependents`` alone, before the kernel's wait: only where the
    next launch's work before its own wait needs nothing of the launch before this one."""
    if ON:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _gather_index(slot_ptr, ev_ptr, base, n: tl.constexpr, NP: tl.constexpr):
    """Slots and weights of ``n`` entries from ``base`` (Phase 1's arrays: early loads)."""
    e = tl.arange(0, NP)
    em = e < n
    sl = tl.load(slot_ptr + base + e, mask=em, other=-1)
    wt = tl.load(ev_ptr + base + e, mask=em, other=0.0)
    return sl, wt


@triton.jit
def _gather_rows(bank_ptr, sl, wt, cols, cm, hd, EV: tl.constexpr):
    """sum_e wt_e M0[sl_e, cols] (slot -1: nothing); ``EV``: the L2 eviction policy of the
    row loads (``launch.EVICT``)."""
    rows = tl.load(bank_ptr + sl.to(tl.int64)[:, None] * hd + cols[None, :],
                   mask=(sl >= 0)[:, None] & cm[None, :], other=0.0, eviction_policy=EV)
    return tl.sum(wt[:, None] * rows.to(tl.float32), axis=0)


@triton.jit
def _token_program(NC, c, hd, C: tl.constexpr, E: tl.constexpr, BD: tl.constexpr):
    """A program of a (stream, token, column block) grid: ``p``, ``i``, the segment ``b``,
    the first entry of token ``i`` in the segment arrays, the columns and their mask."""
    return _token_program_at(tl.program_id(0), tl.program_id(1), NC, c, hd, C, E, BD)


@triton.jit
def _token_program_at(pid, cb, NC, c, hd, C: tl.constexpr, E: tl.constexpr, BD: tl.constexpr):
    """``_token_program`` of grid position (``pid`` = p * C + i, column block ``cb``): also
    for a launch that runs two kinds of programs in one grid
    (``step_backward._step_bwd_dev_group_kernel``)."""
    p = pid // C
    i = pid % C
    cols = cb * BD + tl.arange(0, BD)
    b = p * NC + c
    return p, i, b, (b.to(tl.int64) * C + i) * E, cols, cols < hd


@triton.jit
def _block_program(NC, c, hd, MB: tl.constexpr, TB: tl.constexpr, CP: tl.constexpr):
    """A program of a (stream, token block, column slice) grid: ``p``, the segment ``b``,
    the block's first token ``t0``, the slice's columns and their mask."""
    NTB: tl.constexpr = CP // TB
    pid = tl.program_id(0)       # p * NTB + token block
    p = pid // NTB
    cols = tl.program_id(1) * MB + tl.arange(0, MB)
    return p, p * NC + c, (pid % NTB) * TB, cols, cols < hd


@triton.jit
def _store_u_inter(v_ptr, beta_ptr, u_ptr, i_ptr, keep_ptr, r0, inter, p, b, c, i, P, T, hd,
                   cols, cm, C: tl.constexpr, CP: tl.constexpr, KEEP: tl.constexpr):
    """``u = beta (v - r0)`` and ``inter`` of token ``i`` into the ``[P, CP, hd]`` buffers;
    with ``KEEP`` also ``v - r0`` into the backward's ``[NC, P, CP, hd]`` buffer."""
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


# the widest chunk (power of two) whose product launches load whole rows (``ROWS``): at
# C = 256 the rows forms need 255 registers on sm_90 and spill (aot_compile_check.py)
ROWS_MAX_CP = 128


@triton.jit
def _mix_block_rows(X_ptr, QKX_ptr, u_ptr, i_ptr, d_ptr, out_ptr, b, p, c, T, hd, t0, cols, cm,
                    C: tl.constexpr, TB: tl.constexpr, CP: tl.constexpr, PREC: tl.constexpr,
                    PDL: tl.constexpr):
    """``_mix_block`` with the token block's rows of X and QKX loaded whole (columns up to
    the block's last token: both are lower triangular) before the wait for the gather
    launch (Phase 1's arrays: early loads), then one product each over all of them: one
    round trip to L2 after the wait instead of one per block of ``TB`` columns."""
    toks = t0 + tl.arange(0, TB)
    tm = toks < C
    ks = tl.arange(0, CP)
    km = (ks < C) & (ks < t0 + TB)
    xo = b.to(tl.int64) * C * C + toks[:, None] * C + ks[None, :]
    xm = tm[:, None] & km[None, :]
    x = tl.load(X_ptr + xo, mask=xm, other=0.0)
    q = tl.load(QKX_ptr + xo, mask=xm, other=0.0)
    _grid_dependency(PDL >= 2)
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
    (``_mix_block_rows``)."""
    if ROWS:
        _grid_dependency(PDL == 1)
        p, b, t0, cols, cm = _block_program(NC, c, hd, MB, TB, CP)
        _mix_block_rows(X_ptr, QKX_ptr, u_ptr, i_ptr, d_ptr, out_ptr, b, p, c, T, hd, t0, cols,
                        cm, C, TB, CP, PREC, PDL)
    else:
        _grid_dependency(PDL)
        p, b, t0, cols, cm = _block_program(NC, c, hd, MB, TB, CP)
        _mix_block(X_ptr, QKX_ptr, u_ptr, i_ptr, d_ptr, out_ptr, b, p, c, T, hd, t0, cols, cm,
                   C, MB, TB, CP, PREC)


@triton.jit(do_not_specialize=["c", "P", "T", "NC"])
def _step_gather_kernel(bank_ptr, slot_ptr, ev_ptr, v_ptr, beta_ptr, u_ptr, i_ptr, keep_ptr,
                        c, P, T, hd, NC, C: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
                        BD: tl.constexpr, WP: tl.constexpr, RP: tl.constexpr, CP: tl.constexpr,
                        PDL: tl.constexpr, EV_W: tl.constexpr = "", EV_R: tl.constexpr = "",
                        KEEP: tl.constexpr = False):
    _grid_dependency(PDL == 1)
    p, i, b, base, cols, cm = _token_program(NC, c, hd, C, W + R, BD)
    slw, evw = _gather_index(slot_ptr, ev_ptr, base, W, WP)
    slr, evr = _gather_index(slot_ptr, ev_ptr, base + W, R, RP)
    _grid_dependency(PDL >= 2)
    # EV_W / EV_R: the write rows are read again by this step's write launch, the read
    # rows are not
    r0 = _gather_rows(bank_ptr, slw, evw, cols, cm, hd, EV_W)
    inter = _gather_rows(bank_ptr, slr, evr, cols, cm, hd, EV_R)
    _store_u_inter(v_ptr, beta_ptr, u_ptr, i_ptr, keep_ptr, r0, inter, p, b, c, i, P, T, hd,
                   cols, cm, C, CP, KEEP)


@triton.jit
def _column_block(scr_ptr, p, pb, j, sc, hd, BD: tl.constexpr, CP: tl.constexpr,
                  CL: tl.constexpr):
    """Column block ``j`` of the ``CL`` of program column ``pb`` (grid axis 1): its columns,
    their mask, and where they start in stream ``p``'s rows of a ``[P, CP, hd]`` scratch."""
    cb = pb * CL + j
    cols = cb * BD + sc
    return cols, cols < hd, scr_ptr + p.to(tl.int64) * CP * hd + cb * BD


@triton.jit(do_not_specialize=["c", "P", "NC"])
def _step_write_kernel(bank_ptr, d_ptr, run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr,
                       run_coef_ptr, log_ptr, c, P, hd, NC, C: tl.constexpr, W: tl.constexpr,
                       BD: tl.constexpr, NG: tl.constexpr, KW: tl.constexpr, CP: tl.constexpr,
                       SAVE: tl.constexpr, PDL: tl.constexpr, EV: tl.constexpr = "",
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
                    cols, cm, sc, hd, log_ptr, lb, NG, KW, BD, SAVE, hd, EV)
