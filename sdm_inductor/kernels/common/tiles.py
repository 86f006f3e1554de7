"""Triton helpers that more than one stage's kernels inline: the step walks' program
coordinates and launch dependencies, the chunk-start row gathers, the write pass's run
tiles, the undo log's loads, the dB groups' tiles and the associative-scan operators."""
from __future__ import annotations

import triton
import triton.language as tl

# the widest chunk (power of two) whose product launches load whole rows (``ROWS``): at
# C = 256 the rows forms need 255 registers on sm_90 and spill (aot_compile_check.py)
ROWS_MAX_CP = 128


@triton.jit
def row_length(n, MULTIPLE_OF_16: tl.constexpr):
    """The row length ``n``, known to the compiler as a multiple of 16 where
    ``MULTIPLE_OF_16`` says it is one (``runtime.launch.multiple_of_16``): row starts are
    then 32-byte aligned and row loads vectorize, also in non-inlined callees. A Triton
    launch marks an int argument divisible by 16 by itself; Inductor's output code marks a
    symbolic size only where it can prove it, and a row gather of unknown alignment loads
    one element at a time (the queue walk at B, ``hd`` dynamic: 40 ms against 2.6)."""
    if MULTIPLE_OF_16:
        n = n // 16 * 16
    return n


@triton.jit
def _max_fn(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min_fn(a, b):
    return tl.minimum(a, b)


@triton.jit
def _grid_dependency(PDL: tl.constexpr):
    """First statement of the step kernels (the restore kernel first lets the next launch
    start: ``_launch_dependents``). With ``PDL`` (programmatic dependent launch,
    sm_90+: ``launch.pdl``), the kernel's programs may be resident before the previous
    kernel in the stream has finished: wait for it (its writes then visible) before any
    load or store, then let the next kernel's programs launch, so a launch's latency hides
    behind the tail of the one before.

    Kernels that call it twice, as ``_grid_dependency(PDL == 1)`` first and
    ``_grid_dependency(PDL == 2)`` (``PDL >= 2`` in kernels with no ``PDL == 3`` form) after
    their *early loads*, wait at the second call when ``PDL == 2``. Early loads read only
    what no launch of the walk writes (Phase 1's arrays, the call's inputs, the forward's
    undo log in the backward): all of it was complete before the walk's first launch, and a programmatic launch starts only once the kernel
    before it has passed its own wait, so the kernel two back has finished. Their latency
    then overlaps the previous kernel's tail instead of following it (kernels without a
    ``PDL == 3`` form of their own treat 3 as 2).

    ``PDL == 3`` goes further in the backward step walk: launches whose work
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
def _token_program(NC, c, hd, C: tl.constexpr, E: tl.constexpr, BD: tl.constexpr):
    """A program of a (stream, token, column block) grid: ``p``, ``i``, the segment ``b``,
    the first entry of token ``i`` in the segment arrays, the columns and their mask."""
    return _token_program_at(tl.program_id(0), tl.program_id(1), NC, c, hd, C, E, BD)


@triton.jit
def _token_program_at(pid, cb, NC, c, hd, C: tl.constexpr, E: tl.constexpr, BD: tl.constexpr):
    """``_token_program`` of grid position (``pid`` = p * C + i, column block ``cb``): also
    for a launch that runs two kinds of programs in one grid
    (``backward.step_walk._step_bwd_dev_group_kernel``)."""
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
def _column_block(scr_ptr, p, pb, j, sc, hd, BD: tl.constexpr, CP: tl.constexpr,
                  CL: tl.constexpr):
    """Column block ``j`` of the ``CL`` of program column ``pb`` (grid axis 1): its columns,
    their mask, and where they start in stream ``p``'s rows of a ``[P, CP, hd]`` scratch."""
    cb = pb * CL + j
    cols = cb * BD + sc
    return cols, cols < hd, scr_ptr + p.to(tl.int64) * CP * hd + cb * BD


@triton.jit
def _gather_index(slot_ptr, ev_ptr, base, n: tl.constexpr, NP: tl.constexpr):
    """Slots and weights of ``n`` entries from ``base`` (Phase 1's arrays: early loads)."""
    e = tl.arange(0, NP)
    em = e < n
    sl = tl.load(slot_ptr + base + e, mask=em, other=-1)
    wt = tl.load(ev_ptr + base + e, mask=em, other=0.0)
    return sl, wt


@triton.jit
def _gather_rows(bank_ptr, sl, wt, cols, cm, hd):
    """sum_e wt_e M0[sl_e, cols] (slot -1: nothing)."""
    rows = tl.load(bank_ptr + sl.to(tl.int64)[:, None] * hd + cols[None, :],
                   mask=(sl >= 0)[:, None] & cm[None, :], other=0.0)
    return tl.sum(wt[:, None] * rows.to(tl.float32), axis=0)


@triton.jit
def _write_head(run_slot_ptr, run_len_ptr, run_decay_ptr, run_tok_ptr, run_coef_ptr, rb, f0,
                CW: tl.constexpr, NG: tl.constexpr, KW: tl.constexpr):
    """Everything a write tile needs before its gathers, in loads that depend on nothing:
    the run headers of positions [f0, f0 + NG) and the first ``KW`` members of each run
    (token and coefficient; members past a run's end are masked when used)."""
    pos = f0 + tl.arange(0, NG)
    fm = pos < CW
    sl = tl.load(run_slot_ptr + rb + pos, mask=fm, other=-1)
    ln = tl.load(run_len_ptr + rb + pos, mask=fm, other=0)
    dec = tl.load(run_decay_ptr + rb + pos, mask=fm, other=0.0)
    mpos = pos[:, None] + tl.arange(0, KW)[None, :]
    mm = fm[:, None] & (mpos < CW)
    tk = tl.load(run_tok_ptr + rb + mpos, mask=mm, other=0)
    cf = tl.load(run_coef_ptr + rb + mpos, mask=mm, other=0.0)
    return sl, ln, dec, tk, cf


@triton.jit
def _write_tile(bank_ptr, run_tok_ptr, run_coef_ptr, scr_d, rb, f0, sl, ln, dec, tk, cf, cols,
                cm, sc, hd, log_ptr, lb, NG: tl.constexpr, KW: tl.constexpr,
                BD: tl.constexpr, SAVE: tl.constexpr, DS):
    """Write each run of a tile once: ``exp(gend) M0[s] + sum_j coef_j delta_j`` in the
    run's order. The old rows and the first ``KW`` members' deltas are gathered in one
    round trip; only runs longer than ``KW`` (rare for sparse writes) take the loop. With
    ``SAVE`` the old rows go to the undo log at the run's start position (``lb``: the
    segment's first log row; the log is chunk-major, the run arrays stream-major).
    ``scr_d + tok * DS + sc`` holds token ``tok``'s delta for the tile's columns."""
    pos = f0 + tl.arange(0, NG)
    ro = sl.to(tl.int64)[:, None] * hd + cols[None, :]
    wm = (sl >= 0)[:, None] & cm[None, :]
    old = tl.load(bank_ptr + ro, mask=wm, other=0.0)
    if SAVE:
        tl.store(log_ptr + (lb + pos).to(tl.int64)[:, None] * hd + cols[None, :],
                 old.to(log_ptr.dtype.element_ty), mask=wm)
    ks = tl.arange(0, KW)
    km = (sl >= 0)[:, None] & (ks[None, :] < ln[:, None])
    dd = tl.load(scr_d + tk[:, :, None] * DS + sc[None, None, :], mask=km[:, :, None], other=0.0)
    acc = tl.sum(cf[:, :, None] * dd, axis=1)
    m = KW
    n_max = tl.max(ln, axis=0)  # longest run of the tile
    while m < n_max:  # data-dependent trip count
        mm = m < ln
        tkm = tl.load(run_tok_ptr + rb + pos + m, mask=mm, other=0)
        cfm = tl.load(run_coef_ptr + rb + pos + m, mask=mm, other=0.0)
        acc += cfm[:, None] * tl.load(scr_d + tkm[:, None] * DS + sc[None, :], mask=mm[:, None],
                                      other=0.0)
        m += 1
    new = dec[:, None] * old.to(tl.float32) + acc
    tl.store(bank_ptr + ro, new.to(bank_ptr.dtype.element_ty), mask=wm)


@triton.jit
def _fp8_e4m3_to_f32(byte):
    """float8 e4m3fn bits -> fp32 (decoded by hand: no fp8 type needed, e.g. in the interpreter)."""
    b = byte.to(tl.int32)
    sign = tl.where((b & 0x80) != 0, -1.0, 1.0)
    ex = (b >> 3) & 0xF
    man = (b & 0x7).to(tl.float32)
    mag = tl.where(ex == 0, man * 0.001953125, (8.0 + man) * tl.exp2((ex - 10).to(tl.float32)))
    return sign * mag


@triton.jit
def _load_log(log_ptr, scale_ptr, row, m, width, cols, cm, QMODE: tl.constexpr):
    """Undo-log rows ``row`` [NG] (mask ``m``), columns ``cols``, dequantized to fp32."""
    m2 = m[:, None] & cm[None, :]
    if QMODE == 0:
        x = tl.load(log_ptr + row[:, None] * width + cols[None, :], mask=m2,
                    other=0.0).to(tl.float32)
    else:
        scale = tl.load(scale_ptr + row, mask=m, other=0.0)
        if QMODE == 1:
            byte = tl.load(log_ptr + row[:, None] * width + cols[None, :], mask=m2, other=0)
            x = _fp8_e4m3_to_f32(byte)
        else:
            byte = tl.load(log_ptr + row[:, None] * width + (cols // 2)[None, :], mask=m2,
                           other=0).to(tl.int32)
            x = (((byte >> ((cols % 2) * 4)[None, :]) & 0xF) - 8).to(tl.float32)
        x = x * scale[:, None]
    return x


@triton.jit
def _qkt_dy(QK_ptr, dy_ptr, mat, p, c, T, hd, toks, tm, ks, km, cols, cm, C,
            PREC: tl.constexpr):
    """``QK[ks, toks]^T @ dy[ks]``: key block ``ks``'s share of ``d delta`` for tokens
    ``toks`` (columns ``cols``; ``mat``: the chunk's first Gram matrix element)."""
    kg = c * C + ks
    dyk = tl.load(dy_ptr + (p.to(tl.int64) * T + kg)[:, None] * hd + cols[None, :],
                  mask=(km & (kg < T))[:, None] & cm[None, :], other=0.0).to(tl.float32)
    qkt = tl.load(QK_ptr + mat + ks[None, :] * C + toks[:, None],
                  mask=tm[:, None] & km[None, :], other=0.0)
    return tl.dot(qkt, dyk, input_precision=PREC)


@triton.jit
def _group_headers(g_slot_ptr, g_len_ptr, g_nw_ptr, g_decay_ptr, g_pos_ptr, gb, f0,
                   CE: tl.constexpr, NG: tl.constexpr):
    """The headers of groups [f0, f0 + NG): first position, slot, members, write members,
    decay."""
    gi = f0 + tl.arange(0, NG)
    fm = gi < CE
    sl = tl.load(g_slot_ptr + gb + gi, mask=fm, other=-1)
    ln = tl.load(g_len_ptr + gb + gi, mask=fm, other=0)
    nw = tl.load(g_nw_ptr + gb + gi, mask=fm, other=0)
    dec = tl.load(g_decay_ptr + gb + gi, mask=fm, other=1.0)
    pos = tl.load(g_pos_ptr + gb + gi, mask=fm, other=-1)
    return pos, sl, ln, nw, dec


@triton.jit
def _group_members(g_tok_ptr, g_ev_ptr, gb, pos, sl, ln, nw, KW: tl.constexpr):
    """The first ``KW`` members of each group (token, weight, which are live and which are
    write members)."""
    ks = tl.arange(0, KW)
    mpos = pos[:, None] + ks[None, :]
    mk = (sl >= 0)[:, None] & (ks[None, :] < ln[:, None])
    tf = tl.load(g_tok_ptr + gb + mpos, mask=mk, other=0)
    wt = tl.load(g_ev_ptr + gb + mpos, mask=mk, other=0.0)
    isw = ks[None, :] < nw[:, None]
    return tf, wt, mk, isw


@triton.jit
def _group_cols(dB_ptr, g_tok_ptr, g_ev_ptr, scr_dr, dy_ptr, gb, pos, sl, ln, nw, dec, tf, wt,
                mk, isw, p, c, T, hd, cols, cm, sc, C, KW: tl.constexpr, DS, CG: tl.constexpr):
    """dB of one tile's groups (``_group_head``) in the columns ``cols``: decay of a written
    slot plus the members' terms (``d r0`` of write members, ``dy`` of read members) in the
    group's order. The first ``KW`` members are gathered in one round trip with the old
    rows; only groups longer than ``KW`` (rare for sparse slots) take the loop, one member
    per round trip. ``scr_dr + tok * DS + sc`` holds token ``tok``'s ``d r0`` for ``cols``.
    ``CG``: the cache modifier of the loads of what the walk writes (``dB``, ``d r0``)."""
    ro = sl.to(tl.int64)[:, None] * hd + cols[None, :]
    wm = (sl >= 0)[:, None] & cm[None, :]
    old = tl.load(dB_ptr + ro, mask=wm, other=0.0, cache_modifier=CG)
    dr = tl.load(scr_dr + tf[:, :, None] * DS + sc[None, None, :],
                 mask=(mk & isw)[:, :, None] & cm[None, None, :], other=0.0, cache_modifier=CG)
    fg = c * C + tf
    dyf = tl.load(dy_ptr + (p.to(tl.int64) * T + fg)[:, :, None] * hd + cols[None, None, :],
                  mask=(mk & (~isw) & (fg < T))[:, :, None] & cm[None, None, :],
                  other=0.0).to(tl.float32)
    acc = tl.sum(wt[:, :, None] * (dr + dyf), axis=1)
    m = KW
    n_max = tl.max(ln, axis=0)  # largest group
    while m < n_max:  # data-dependent trip count
        mm = m < ln
        tfm = tl.load(g_tok_ptr + gb + pos + m, mask=mm, other=0)
        wtm = tl.load(g_ev_ptr + gb + pos + m, mask=mm, other=0.0)
        is_w = m < nw
        drm = tl.load(scr_dr + tfm[:, None] * DS + sc[None, :],
                      mask=(mm & is_w)[:, None] & cm[None, :], other=0.0, cache_modifier=CG)
        fgm = c * C + tfm
        dym = tl.load(dy_ptr + (p.to(tl.int64) * T + fgm)[:, None] * hd + cols[None, :],
                      mask=(mm & (~is_w) & (fgm < T))[:, None] & cm[None, :],
                      other=0.0).to(tl.float32)
        acc += wtm[:, None] * (drm + dym)
        m += 1
    new = dec[:, None] * old.to(tl.float32) + acc
    tl.store(dB_ptr + ro, new.to(dB_ptr.dtype.element_ty), mask=wm)
