"""Every Triton kernel of ``sdm_inductor.kernels`` on CPU under ``TRITON_INTERPRET=1``.

The interpreter must be switched on before the kernels are decorated, and must not leak
into other test files that use Triton in the same pytest process, so each check runs
in a subprocess: ``python tests/kernels/test_kernels_interpret.py <case>``. The selected
cases' subprocesses start with the session, the longest first, and run beside the rest of
the suite (``tests/conftest.py``); each test waits for its own. Sizes are tiny (the interpreter runs
every program in numpy) but cover several chunks, T not a multiple of C, several token
tiles per chunk, partial column blocks, P > 1, shared and private banks, per-write gates,
repeated slots, out-of-range indices and every snapshot mode.
"""
from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("triton")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))   # the checkout under test, not an installed copy


# rough seconds of each case on one core (the order of the background queue)
COST = dict(queue_walk=86, step_walk_windows=61, step_walk_kept=59, step_walk=59,
            column_walk=54, phase1_scans=37, chunk_start_sources=29, extreme_gates=27,
            snapshots=26, random_calls=16, train_fp32=13, index_ranges=11, train_bf16=10,
            decode_and_masking=3.5, entry_groups=3.1, strided_banks=2.8, windows_and_tiles=1.1,
            solve_blocks=0.8, window_sums=0.8, nothing_to_do=0.3)


def _job(item) -> dict:
    """This case's subprocess (``tests/conftest.py`` starts it with the session)."""
    case = item.callspec.params["case"]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return dict(argv=[sys.executable, os.path.abspath(__file__), case], env=env, timeout=900,
                cost=COST[case], warm=True)


@pytest.mark.background(job=_job)
@pytest.mark.parametrize("case", list(COST))
def test_kernels_under_interpreter(case, background):
    res = background()
    assert res.returncode == 0, f"case {case} failed:\n{res.stdout}\n{res.stderr[-4000:]}"


# ---------------------------------------------------------------- cases (subprocess side)

NAMES = ("bank", "k_val", "v", "beta", "g", "q_val")


def _check(name, got, want, tol):
    from sdm_inductor.testing import rel_err
    err = rel_err(got, want)
    print(f"{name}: rel err {err:.2e} (tol {tol:.0e})")
    assert err <= tol, f"{name}: relative error {err:.3e} > {tol:.0e}"


def _train(ins, C, mode="none", tol=1e-5, grad_bank_fp32=False, kept=False):
    """Forward (saving) + backward of the kernels against the float64 oracle. ``kept``:
    the backward takes what the forward kept (Phase 1's plan and ``v - r0``), as an eager
    autograd call's does, instead of recomputing it (half of the interpreter's Phase 1)."""
    import torch
    from sdm_inductor import kept as keeping
    from sdm_inductor import ops
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import reference_outputs
    P, T, _ = ins.k_idx.shape
    gen = torch.Generator().manual_seed(7)
    dy = torch.randn(P, T, ins.bank.shape[1], generator=gen).to(ins.bank.dtype)
    dM = torch.randn(ins.bank.shape, generator=gen).to(ins.bank.dtype)
    y_ref, M_ref, g_ref = reference_outputs(ins, (dy, dM))
    bank = ins.bank.clone()
    dt = bank.dtype
    args = (ins.k_idx, ins.k_val.to(dt), ins.v.to(dt), ins.beta, ins.g, ins.q_idx,
            ins.q_val.to(dt))
    keeping.drop_offer()
    y, rows, scales = host.forward(bank, *args, C, mode, True)
    _check("readings", y, y_ref, tol)
    assert y.is_contiguous(), f"readings: strides {y.stride()} for shape {tuple(y.shape)}"
    _check("final bank", bank, M_ref, tol)
    offer = keeping.take(y) if kept else None
    assert offer is not None or not kept, "the forward kept nothing"
    with keeping.backward_with(offer):
        grads = host.backward(dy, dM, bank, rows, scales, *args, C, mode, grad_bank_fp32)
    how = ops.last_dispatch().get("phase1_backward")
    assert how == ("kept" if kept else "recomputed"), how
    for n, g, r in zip(NAMES, grads, g_ref):
        _check("grad " + n, g, r, tol)
        # the layout the op's fake implementation promises: a compiled graph asserts it
        assert g.is_contiguous(), f"grad {n}: strides {g.stride()} for shape {tuple(g.shape)}"
    return rows, scales, grads, args, dy, dM


def case_train_fp32():
    from sdm_inductor.testing import make_inputs
    # 3 chunks, T % C != 0, 2 column blocks (one partial), repeats, per-write gates
    ins = make_inputs(P=2, T=37, W=4, R=3, hd=18, slots_per_stream=24, per_write_gate=True,
                      repeats=True, seed=11)
    _train(ins, 16)
    # one chunk, P > 1: the windowed backward's sums narrow to a strided view
    _train(make_inputs(P=3, T=9, W=4, R=3, hd=18, slots_per_stream=24, seed=21), 16)


def case_train_bf16():
    import torch
    from sdm_inductor.testing import make_inputs
    # (the kernels index absolute rows: a shared bank is the op's concern, see random_calls)
    ins = make_inputs(P=2, T=18, W=3, R=3, hd=16, slots_per_stream=32,
                      dtype=torch.bfloat16, seed=12)
    _train(ins, 16, tol=2e-2)
    _train(ins, 16, tol=2e-2, grad_bank_fp32=True)


def case_snapshots():
    """fp8 / int4 / bf16 undo logs: the kernel's in-kernel dequantization against the CPU
    backward fed the same log and final bank (quantization error is then common to both);
    the log packing kernel byte for byte against ``quant.quantize``."""
    import torch
    from sdm_inductor import cpu, quant
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import make_inputs, undo_log_rows_used
    ins = make_inputs(P=1, T=20, W=3, R=2, hd=17, slots_per_stream=16, per_write_gate=True,
                      seed=13)
    P, T, _ = ins.k_idx.shape
    dy, dM = torch.randn(P, T, 17), torch.randn_like(ins.bank)
    args = tuple(ins)[1:]
    for mode in ("bf16", "fp8", "int4"):
        # fp8: two token windows of one chunk each (the log's and scales' window slices)
        host.CONFIG["TRAIN_WINDOW_TOKENS"] = 16 if mode == "fp8" else 0
        bank = ins.bank.clone()
        y, rows, scales = host.forward(bank, *args, 16, mode, True)
        want_rows, want_scales = cpu.forward(ins.bank.clone(), *args, 16, mode, True)[1:]
        assert rows.dtype == want_rows.dtype and rows.shape == want_rows.shape, mode
        assert scales.shape == want_scales.shape, mode
        # the undo log's used rows (each segment's distinct written rows; the rest is
        # unspecified), up to rounding of the bank and one step of the storage format
        # (the interpreter truncates to bf16)
        live = undo_log_rows_used(ins.k_idx, 16)
        got_rows = quant.dequantize(rows[live], scales[live] if scales.numel() else None, mode, 17)
        ref_rows = quant.dequantize(want_rows[live], want_scales[live] if scales.numel() else None,
                                    mode, 17)
        _check(f"{mode} saved rows", got_rows, ref_rows, {"bf16": 1e-2, "fp8": 5e-2, "int4": 0.2}[mode])
        got = host.backward(dy, dM, bank, rows, scales, *args, 16, mode, False)
        want = cpu.backward(dy, dM, bank, rows, scales, *args, 16, mode, False)
        for n, g, r in zip(NAMES, got, want):
            _check(f"{mode} grad {n}", g, r, 1e-5)
    # repeated slots (in a token and across tokens): both devices put each written row at
    # the same log row, so each backward reads the other's log
    ins = make_inputs(P=2, T=37, W=4, R=3, hd=18, slots_per_stream=12, repeats=True,
                      per_write_gate=True, seed=3)
    args = tuple(ins)[1:]
    dy, dM = torch.randn(2, 37, 18), torch.randn_like(ins.bank)
    bank = ins.bank.clone()
    rows = host.forward(bank, *args, 16, "none", True)[1]
    want_rows = cpu.forward(ins.bank.clone(), *args, 16, "none", True)[1]
    live = undo_log_rows_used(ins.k_idx, 16)
    _check("log rows with repeats", rows[live], want_rows[live], 1e-6)
    got = host.backward(dy, dM, bank, want_rows, torch.empty(0), *args, 16, "none", False)
    want = cpu.backward(dy, dM, bank, rows, torch.empty(0), *args, 16, "none", False)
    for n, g, r in zip(NAMES, got, want):
        _check(f"crossed logs grad {n}", g, r, 1e-5)
    _pack_log_bytes()


def _pack_log_bytes():
    """``quantize.pack_log`` gives ``quant.quantize``'s bytes and scales exactly (odd and
    even widths, zero rows, ties of int4's rounding), and its fp8 encoder torch's
    float8_e4m3fn bytes for every e4m3 value, the midpoints between them (ties to even),
    their neighbours, subnormals and random values of both signs."""
    import torch
    from sdm_inductor import quant
    from sdm_inductor.kernels.forward.quantize import pack_log
    gen = torch.Generator().manual_seed(0)
    for mode in ("fp8", "int4"):
        for hd in (17, 18):
            for dt in (torch.float32, torch.bfloat16):
                raw = torch.randn(5, 3, hd, generator=gen) * torch.logspace(-8, 3, 5)[:, None, None]
                raw[1, 2] = 0
                raw[3, 1] = torch.linspace(-7, 7, hd)
                raw[3, 1, 0] = 7.5   # scale 7.5 / 7: ties of the 4-bit rounding
                raw = raw.to(dt)
                got, want = pack_log(raw, mode, dt), quant.quantize(raw, mode, dt)
                assert torch.equal(got[0], want[0]), (mode, hd, dt, "bytes")
                assert torch.equal(got[1], want[1]), (mode, hd, dt, "scales")

    # rows led by 448 have scale 1: the encoder sees the values themselves
    vals = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (vals[1:] + vals[:-1]) / 2
    x = torch.cat([vals, mids, torch.nextafter(mids, torch.full_like(mids, 1e9)),
                   torch.nextafter(mids, torch.zeros_like(mids)),
                   torch.rand(4000, generator=gen) * 448,
                   torch.rand(4000, generator=gen) * 2 ** -6, torch.tensor([2.0 ** -12])])
    x = torch.cat([x, -x])
    x = torch.cat([x, torch.zeros(-x.numel() % 63)]).view(-1, 1, 63)
    raw = torch.cat([torch.full((x.shape[0], 1, 1), 448.0), x], -1)
    got = pack_log(raw, "fp8", torch.float32)[0]
    assert torch.equal(got, raw.to(torch.float8_e4m3fn).view(torch.uint8)), \
        (got != raw.to(torch.float8_e4m3fn).view(torch.uint8)).nonzero()[:5]
    print("pack_log: bytes and scales as quant.quantize")


def case_decode_and_masking():
    """Decode path (T <= 16, no grad) and out-of-range indices on both paths: an invalid
    entry touches nothing, like a zero-weight entry on a row no one else uses."""
    import torch
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import SDMInputs, make_inputs, reference_outputs
    for T in (5, 23):   # decode, chunked
        ins = make_inputs(P=2, T=T, W=4, R=3, hd=20, slots_per_stream=16, per_write_gate=True,
                          repeats=True, seed=14 + T)
        y_ref, M_ref, _ = reference_outputs(ins)
        bank = ins.bank.clone()
        y = host.forward(bank, *tuple(ins)[1:], 16, "none", False)[0]
        _check(f"T={T} readings", y, y_ref, 1e-5)
        _check(f"T={T} final bank", bank, M_ref, 1e-5)

        S = ins.bank.shape[0]
        bad_w = torch.rand(ins.k_idx.shape) < 0.2
        bad_r = torch.rand(ins.q_idx.shape) < 0.2
        k_idx = torch.where(bad_w, S + 5, ins.k_idx)
        k_idx[0, 0, 0] = -3
        q_idx = torch.where(bad_r, -1, ins.q_idx)
        q_idx[0, 0, 0] = 10 ** 6
        bank = ins.bank.clone()
        y = host.forward(bank, k_idx, ins.k_val, ins.v, ins.beta, ins.g, q_idx, ins.q_val, 16,
                         "none", False)[0]
        # the oracle sees the same calls with invalid entries sent to a spare row, weightless
        spare = torch.cat([ins.bank, torch.zeros(1, ins.bank.shape[1])])
        kw = (k_idx < 0) | (k_idx >= S)
        kr = (q_idx < 0) | (q_idx >= S)
        ref_in = SDMInputs(spare, torch.where(kw, S, k_idx), ins.k_val.masked_fill(kw, 0),
                           ins.v, ins.beta, ins.g.masked_fill(kw, 0) if ins.g.shape[2] > 1 else ins.g,
                           torch.where(kr, S, q_idx), ins.q_val.masked_fill(kr, 0))
        y_ref, M_ref, _ = reference_outputs(ref_in)
        _check(f"T={T} masked readings", y, y_ref, 1e-5)
        _check(f"T={T} masked bank", bank, M_ref[:S], 1e-5)


def case_index_ranges():
    """``index_ranges.range_flags`` (the CUDA index check's one launch) against the range
    rule, per stream and whole-bank, int32 and int64, one bad entry at a time in either
    tensor (block edges and the last entry included); then through the op with the
    kernels' host code: refused by name, the bank untouched."""
    import pytest
    import torch
    from sdm_inductor import ops
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.index_ranges import BLOCK, range_flags
    from sdm_inductor.testing import make_inputs
    from sdm_inductor.validation import SDMArgumentError
    gen = torch.Generator().manual_seed(3)
    P, T, W, R, sph = 3, 600, 8, 5, 40   # W * T = 4800: two blocks of a stream's k_idx
    for dtype in (torch.int32, torch.int64):
        for own in (True, False):
            S = P * sph
            base = (torch.arange(P) * sph).view(P, 1, 1) if own else 0
            span = sph if own else S
            k = (torch.randint(0, span, (P, T, W), generator=gen) + base).to(dtype)
            q = (torch.randint(0, span, (P, T, R), generator=gen) + base).to(dtype)
            assert not range_flags(k, q, S, sph, own).any()
            spots = [(0, 0), (1, BLOCK - 1), (1, BLOCK), (2, T * W - 1)]
            for which, (p, e) in [("k", s) for s in spots] + [("q", (2, T * R - 1)),
                                                             ("q", (0, 7))]:
                lo = p * sph if own else 0
                for value in (lo - 1, lo + span, -(2 ** 40) if dtype == torch.int64 else -1):
                    kk, qq = k.clone(), q.clone()
                    t = kk if which == "k" else qq
                    t.view(P, -1)[p, e] = value
                    got = bool(range_flags(kk, qq, S, sph, own).any())
                    assert got, (dtype, own, which, p, e, value)
            # a stream's neighbour's rows are out of its range only when ranges are own
            kk = k.clone()
            kk[1, 3, 2] = 0
            assert bool(range_flags(kk, q, S, sph, own).any()) == own
    print("range_flags: every placed bad entry flagged, no clean call flagged")

    ops.IMPLS["cpu"] = host
    ins = make_inputs(P=2, T=40, W=4, R=3, hd=16, slots_per_stream=12, seed=8)
    for name in ("k_idx", "q_idx"):
        bank = ins.bank.clone()
        args = dict(k_idx=ins.k_idx.clone(), q_idx=ins.q_idx.clone())
        args[name][1, 33, 1] = 5   # stream 0's row in stream 1
        with pytest.raises(SDMArgumentError, match=f"'{name}'.*5 at \\[1, 33, 1\\]"):
            torch.ops.sdm.write_read_(bank, args["k_idx"], ins.k_val, ins.v, ins.beta, ins.g,
                                      args["q_idx"], ins.q_val, 16, 12)
        assert torch.equal(bank, ins.bank), name
    print("op: refused by name, bank untouched")


def case_nothing_to_do():
    """No tokens, no streams, zero-width rows: empty readings, the bank unchanged, the
    bank gradient passed through and every other gradient zero (no kernel runs)."""
    import torch
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import make_inputs
    for P, T, hd in ((2, 0, 8), (0, 20, 8), (2, 20, 0)):
        ins = make_inputs(P=max(P, 1), T=T, W=3, R=2, hd=hd, slots_per_stream=16, seed=16)
        args = tuple(t[:P] for t in tuple(ins)[1:])
        for save in (False, True):
            bank = ins.bank.clone()
            y, rows, scales = host.forward(bank, *args, 16, "none", save)
            assert y.shape == (P, T, hd) and torch.equal(bank, ins.bank), (P, T, hd, save)
        dM = torch.randn(ins.bank.shape)
        grads = host.backward(torch.zeros(P, T, hd), dM, bank, rows, scales, *args, 16, "none",
                              False)
        assert torch.equal(grads[0], dM)
        assert all(g.shape == a.shape and not g.any()
                   for g, a in zip(grads[1:], (args[1], args[2], args[3], args[4], args[6])))


def case_strided_banks():
    """Banks whose rows are not contiguous through the public ops with the CUDA
    implementation (``host``, put in CPU's place): the kernels address row ``r`` at
    ``r * hd``, so such a bank must run on a contiguous copy (``host.rows_in_place``)."""
    from sdm_inductor import ops
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import check_strided_banks, make_inputs
    ops.IMPLS["cpu"] = host
    check_strided_banks(make_inputs(P=2, T=10, W=3, R=2, hd=16, slots_per_stream=24, seed=15),
                        16, 1e-5)
    assert ops.last_dispatch()["impl"] == host.NAME, ops.last_dispatch()


def case_windows_and_tiles():
    """The eager no-grad forward in windows, and chunks of several token tiles."""
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import make_inputs, reference_outputs
    ins = make_inputs(P=1, T=52, W=3, R=2, hd=16, slots_per_stream=40, seed=15)
    y_ref, M_ref, _ = reference_outputs(ins)
    host.CONFIG["WINDOW_TOKENS"] = 16
    bank = ins.bank.clone()
    y = host.forward(bank, *tuple(ins)[1:], 16, "none", False)[0]
    from sdm_inductor import ops
    assert ops.last_dispatch().get("windows") == 4, ops.last_dispatch()
    _check("windowed readings", y, y_ref, 1e-5)
    _check("windowed bank", bank, M_ref, 1e-5)


def _handed_over(ins, C: int, walk: str):
    """``host.forward_kept``'s hand-over (what a traced forward gives its traced backward):
    the backward given it recomputes no Phase 1 and, after a queue walk, gathers no
    ``v - r0``, and gives the gradients of a backward that recomputes them: bitwise with
    the plan alone; to fp32 rounding with the forward's ``v - r0`` (the forward's gather
    sums a token's rows in another order than the backward's)."""
    import torch
    from sdm_inductor import ops
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.phase1 import Plan
    gen = torch.Generator().manual_seed(9)
    dy = torch.randn(ins.v.shape, generator=gen)
    dM = torch.randn(ins.bank.shape, generator=gen)
    args = tuple(ins)[1:]
    bank = ins.bank.clone()
    y, rows, scales, kept = host.forward_kept(bank, *args, C, "none", True)
    handed = kept.tensors()
    P = ins.k_idx.shape[0]
    assert len(handed) == Plan.n_backward_tensors() + (walk == "queue"), len(handed)
    got = host.backward(dy, dM, bank, rows, scales, *args, C, "none", False, handed)
    assert ops.last_dispatch().get("phase1_backward") == "handed", ops.last_dispatch()
    assert ops.last_dispatch().get("reverse_walk") == walk, ops.last_dispatch()
    want = host.backward(dy, dM, bank, rows, scales, *args, C, "none", False)
    assert ops.last_dispatch().get("phase1_backward") == "recomputed", ops.last_dispatch()
    for n, a, b in zip(NAMES, got, want):
        if walk == "queue":
            _check(f"handed-over grad {n}", a, b, 1e-6)
        else:
            assert torch.equal(a, b), n
    # nothing saved for a backward: nothing handed over
    assert host.forward_kept(ins.bank.clone(), *args, C, "none", False)[3] is None
    # another call's (a longer sequence: more chunks; after a queue walk, also one of
    # narrower rows) is refused before any launch
    short = [x[:, :C] for x in args]
    others = [(dy[:, :C], dM, bank, rows[:P * C], *short)]
    if walk == "queue":
        narrow = tuple(x[..., :8] if x is ins.v else x for x in args)
        others.append((dy[..., :8], dM[:, :8], bank[:, :8].contiguous(), rows[..., :8],
                       *narrow))
    for dy_, dM_, bank_, rows_, *args_ in others:
        try:
            host.backward(dy_, dM_, bank_, rows_, scales, *args_, C, "none", False, handed)
        except RuntimeError as e:
            assert "does not fit this backward" in str(e), e
        else:
            raise AssertionError("a hand-over of another call was used")


def case_column_walk():
    """The column walk (``forward/column_walk.py``, one program per stream and 16-column block)."""
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import make_inputs
    host.CONFIG["WALK"] = "column"
    ins = make_inputs(P=2, T=37, W=4, R=3, hd=18, slots_per_stream=24, per_write_gate=True,
                      repeats=True, seed=11)
    _train(ins, 16)
    _handed_over(make_inputs(P=1, T=37, W=4, R=3, hd=16, slots_per_stream=10, per_write_gate=True,
                             repeats=True, seed=12), 16, "column")
    host.CONFIG["TB"] = 16   # C=48: three token tiles per chunk, padded last chunk
    _train(make_inputs(P=1, T=52, W=2, R=2, hd=16, slots_per_stream=40, seed=16), 48)
    # rows of two entry tiles in flight, runs longer than the inline members (the loop),
    # several write tiles with the next one's headers prefetched; the backward's saved rows
    # one tile ahead over several tiles
    host.CONFIG.update(KW=2, EW=2, NG=16, TB=64, KW_BWD=2, NG_BWD=16, EW_BWD=2,
                       BWD_WINDOWS=2)   # 3 chunks: windows of 2 and 1
    _train(make_inputs(P=2, T=37, W=4, R=3, hd=18, slots_per_stream=10, per_write_gate=True,
                       repeats=True, seed=19), 16)
    # one inline run member, one write tile, the backward in one window
    host.CONFIG.update(KW=1, KW_BWD=1, NG_BWD=512, BWD_WINDOWS=1)
    _train(make_inputs(P=1, T=40, W=3, R=2, hd=16, slots_per_stream=12, repeats=True, seed=20), 16)


def case_queue_walk():
    """The queue walks (``forward/queue_walk.py``, ``backward/queue_walk.py``: the step
    walks' items in one launch): several chunks and groups (streams x column blocks, the
    last partial), several token blocks and column slices of the product items, several
    write and dB tiles per chunk, runs and groups longer than the inline members, the undo
    log, a bf16 bank, odd numbers of slots, dB items of one and of two column blocks; the
    readings, final bank and gradients equal the step walks' up to fp32 rounding (the
    forward's gathers sum a token's rows ``QUEUE_GATHER_ENTRIES`` at a time, one by default
    and four in one part here, the step walk's in one tile; the reverse walk's ``d ev``
    items sum a group's columns in one block, the step walk's in the dB blocks)."""
    import torch
    from sdm_inductor import ops
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import make_inputs
    _step_config()
    host.CONFIG.update(WALK="queue", TB_MIX=16)
    ins = make_inputs(P=2, T=37, W=4, R=3, hd=40, slots_per_stream=10, per_write_gate=True,
                      repeats=True, seed=31)
    _train(ins, 16)
    assert ops.last_dispatch().get("walk") == "queue", ops.last_dispatch()
    assert ops.last_dispatch().get("reverse_walk") == "queue", ops.last_dispatch()
    _handed_over(make_inputs(P=1, T=37, W=4, R=3, hd=16, slots_per_stream=10,
                             per_write_gate=True, repeats=True, seed=35), 16, "queue")
    _train(make_inputs(P=1, T=70, W=2, R=3, hd=16, slots_per_stream=200, seed=32), 32,
           kept=True)   # the reverse queue walk given v - r0: no gather items
    _train(make_inputs(P=2, T=20, W=4, R=3, hd=16, slots_per_stream=10, per_write_gate=True,
                       repeats=True, dtype=torch.bfloat16, seed=33), 16, tol=2e-2)
    # chunks of 6 (gather items of 2 tokens), 4 entries a step over 3 and 5 slots (masked)
    entries, host.CONFIG["QUEUE_GATHER_ENTRIES"] = host.CONFIG["QUEUE_GATHER_ENTRIES"], 4
    _train(make_inputs(P=1, T=17, W=3, R=5, hd=16, slots_per_stream=12, seed=34), 6)
    host.CONFIG["QUEUE_GATHER_ENTRIES"] = entries
    # the step walk's readings and bank; its undo log too, through the gradients of one
    # backward (rows no run starts at are unset in both logs and never read)
    outs = {}
    gen = torch.Generator().manual_seed(3)
    dy = torch.randn(ins.v.shape, generator=gen)
    dM = torch.randn(ins.bank.shape, generator=gen)
    # groups of 32 columns: dB items over two column blocks; two inline dB members
    # dB items of 3 tiles (the last one partial)
    host.CONFIG.update(BD_STEP_B=32, MB_MIX_B_WIDE=16, TB_MIX_B_WIDE=16, MB_QUEUE_B=16,
                       TB_QUEUE_B=16, KW_GROUP=2, QUEUE_DB_TILES=3)
    for walk in ("queue", "step"):
        host.CONFIG["WALK"] = walk
        bank = ins.bank.clone()
        y, r, sc = host.forward(bank, *tuple(ins)[1:], 16, "none", True)
        outs[walk] = (y, bank, *host.backward(dy, dM, bank, r, sc, *tuple(ins)[1:], 16, "none",
                                              False))
    names = ("readings", "final bank") + tuple("grad " + n for n in NAMES)
    for a, b, name in zip(outs["queue"], outs["step"], names):
        _check(f"queue walks against the step walks: {name}", a, b, 1e-6)


def case_step_walk():
    """The step walks of ``forward/step_walk.py`` and ``backward/step_walk.py`` (launches per chunk):
    several column blocks of every launch (the last partial), several write and group
    tiles per chunk, runs and groups longer than the inline members, token blocks of the
    products, the backward's windows of partial sums, the undo log; write and dB programs of one and of
    several column blocks; dB tiles of single members (the launch's one-member paths); a
    bf16 bank (the forward's bf16 delta scratch); the product
    launches in both forms (whole rows before the wait, blocks after it). Three cases
    (``step_walk``, ``step_walk_windows``, ``step_walk_kept``), each its own subprocess, so
    that the parts run side by side on two cores."""
    from sdm_inductor import ops
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import make_inputs
    _step_config()
    _train(make_inputs(P=2, T=37, W=4, R=3, hd=18, slots_per_stream=10, per_write_gate=True,
                       repeats=True, seed=22), 16)
    assert ops.last_dispatch().get("walk") == "step", ops.last_dispatch()
    _train(make_inputs(P=1, T=150, W=2, R=3, hd=16, slots_per_stream=200, seed=23), 128,
           kept=True)
    # 3 chunks: backward windows of 1 and 2; from here the write and dB programs take two
    # column blocks each (CL_*; at hd = 40 in blocks of 16: the second program's first block
    # partial, its second past the bank's columns)
    _step_config(two_blocks=True)
    _train(make_inputs(P=2, T=37, W=4, R=3, hd=40, slots_per_stream=10, per_write_gate=True,
                       repeats=True, seed=28), 16)
    # sparse slots (640 entries a chunk over 2000): most dB tiles hold single members
    # only and take the launch's one-member path (``_one_tile``), beside tiles of longer groups
    _train(make_inputs(P=1, T=150, W=2, R=3, hd=16, slots_per_stream=2000, seed=26), 128,
           kept=True)


def _step_config(two_blocks: bool = False):
    """``case_step_walk``'s small launch shapes; ``two_blocks``: as from its second part on
    (two backward windows, two column blocks per write and dB program)."""
    from sdm_inductor.kernels import host
    host.CONFIG.update(WALK="step", BD_STEP=16, BD_STEP_W=16, NG_STEP=8, KW_STEP=1,
                       MB_MIX=16, BD_STEP_B=16, MB_MIX_B=16, BD_GROUP=16,
                       NG_GROUP=8, KW_GROUP=1, CL_GROUP=1, CL_WRITE=1)
    if two_blocks:   # (and two inline dB members: the one-member path differs from them)
        host.CONFIG.update(BWD_WINDOWS=2, CL_WRITE=2, CL_GROUP=2, KW_GROUP=2)


def case_step_walk_windows():
    """The rest of ``case_step_walk``: token windows, a no-grad call, a bf16 bank, the
    product launches in blocks (``case_step_walk_kept``: the forward's kept data used by
    the backward)."""
    import torch
    from sdm_inductor import ops
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import make_inputs, reference_outputs
    _step_config(two_blocks=True)
    # token windows (Phase 1 per window, the backward's windows last first): 32 + 5 tokens
    host.CONFIG.update(TRAIN_WINDOW_TOKENS=32)
    _train(make_inputs(P=2, T=37, W=4, R=3, hd=18, slots_per_stream=10, per_write_gate=True,
                       repeats=True, seed=27), 16)
    assert ops.last_dispatch().get("windows") == 2, ops.last_dispatch()
    host.CONFIG.update(TRAIN_WINDOW_TOKENS=0)
    host.CONFIG.update(KW_STEP=2, NG_STEP=32, BD_STEP=32, MB_MIX=32)
    ins = make_inputs(P=2, T=40, W=3, R=2, hd=40, slots_per_stream=16, repeats=True, seed=24)
    y_ref, M_ref, _ = reference_outputs(ins)
    bank = ins.bank.clone()
    y = host.forward(bank, *tuple(ins)[1:], 16, "none", False)[0]
    assert ops.last_dispatch().get("windows") == 1, ops.last_dispatch()
    _check("no-grad readings", y, y_ref, 1e-5)
    _check("no-grad bank", bank, M_ref, 1e-5)
    # a bf16 bank: the forward's delta scratch in bf16, against the oracle
    _train(make_inputs(P=2, T=20, W=4, R=3, hd=16, slots_per_stream=10, per_write_gate=True,
                       repeats=True, dtype=torch.bfloat16, seed=29), 16, tol=2e-2)
    # the product launches in blocks of TB columns, all after the wait (what C = 256 runs;
    # MIX_ROWS / MIX_ROWS_B, the defaults, load whole rows first): several blocks per chunk
    host.CONFIG.update(MIX_ROWS=0, MIX_ROWS_B=0, TB_MIX=16, TB_MIX_B=16)
    _train(make_inputs(P=2, T=70, W=4, R=3, hd=16, slots_per_stream=12, per_write_gate=True,
                       repeats=True, seed=30), 32, kept=True)


def case_step_walk_kept():
    """``_kept_for_backward`` with ``case_step_walk_windows``'s final launch shapes."""
    from sdm_inductor.kernels import host
    _step_config(two_blocks=True)
    host.CONFIG.update(KW_STEP=2, NG_STEP=32, BD_STEP=32, MB_MIX=32)
    _kept_for_backward()


def _kept_for_backward():
    """Through the ops and autograd (the kernels' host code as the CPU implementation):
    the training forward hands its Phase 1 and ``v - r0`` to its backward (``KEEP``),
    which then gives bitwise the gradients of a backward that recomputes them; the gated
    op's backward uses them too (its forward's gates came from the prep kernel: its
    gradients against the CPU implementation's), and so does a compiled graph's."""
    import torch
    from sdm_inductor import cpu, ops
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import make_inputs, reference_outputs
    ops.IMPLS["cpu"] = host
    ins = make_inputs(P=2, T=37, W=4, R=3, hd=18, slots_per_stream=10, per_write_gate=True,
                      repeats=True, seed=29)
    gen = torch.Generator().manual_seed(5)
    dy, dM = torch.randn(2, 37, 18, generator=gen), torch.randn(ins.bank.shape, generator=gen)
    _, _, g_ref = reference_outputs(ins, (dy, dM))

    def grads(keep: int, gated: bool = False):
        host.CONFIG["KEEP"] = keep
        x = [t.clone().requires_grad_() for t in (ins.bank, ins.k_val, ins.v, ins.q_val)]
        if gated:
            raw = [torch.linspace(-2, 2, 2 * 37).view(2, 37).requires_grad_() for _ in "ba"]
            A_log, dt = (torch.tensor([0.1, -0.3], requires_grad=True) for _ in "Ad")
            y, M, _, _ = torch.ops.sdm.write_read_gated(x[0], ins.k_idx, x[1], x[2], *raw,
                                                         A_log, dt, ins.q_idx, x[3], 16, 10)
            x += raw + [A_log, dt]
        else:
            x[3:3] = [t.clone().requires_grad_() for t in (ins.beta, ins.g)]
            y, M, _, _ = torch.ops.sdm.write_read(x[0], ins.k_idx, x[1], x[2], x[3], x[4],
                                                  ins.q_idx, x[5], 16, 10)
        torch.autograd.backward((y, M), (dy, dM))
        d = ops.last_dispatch()
        return d.get("phase1_backward"), [t.grad for t in x]

    (how_k, kept), (how_r, recomputed) = grads(1), grads(0)
    recomputed_plain = recomputed
    assert (how_k, how_r) == ("kept", "recomputed"), (how_k, how_r)
    for n, a, b, r in zip(NAMES, kept, recomputed, g_ref):
        assert torch.equal(a, b), n
        _check("kept grad " + n, a, r, 1e-5)
    how_k, kept = grads(1, True)
    assert how_k == "kept", how_k
    ops.IMPLS["cpu"] = cpu
    _, want = grads(1, True)
    ops.IMPLS["cpu"] = host
    for i, (a, b) in enumerate(zip(kept, want)):
        _check(f"gated kept grad {i}", a, b, 1e-5)
    host.CONFIG["KEEP"] = 1
    # a compiled graph calls the forward and backward ops itself (AOTAutograd's eager
    # backend: the same extern calls as Inductor's default): the backward finds what the
    # forward kept by its undo log, and gives the same gradients
    def op(bank, k_val, v, beta, g, q_val):
        return torch.ops.sdm.write_read(bank, ins.k_idx, k_val, v, beta, g, ins.q_idx, q_val,
                                        16, 10)[:2]
    x = [t.clone().requires_grad_() for t in (ins.bank, ins.k_val, ins.v, ins.beta, ins.g,
                                               ins.q_val)]
    torch.autograd.backward(torch.compile(op, backend="aot_eager", fullgraph=True)(*x),
                            (dy, dM))
    assert ops.last_dispatch().get("phase1_backward") == "kept", ops.last_dispatch()
    for n, a, b in zip(NAMES, [t.grad for t in x], recomputed_plain):
        assert torch.equal(a, b), "compiled kept grad " + n


def case_chunk_start_sources():
    """``sources.chunk_start_sources``: every touched entry's source (an undo-log row of
    the saving forward, or the final bank's row) holds its slot's row as the oracle has it
    at the start of the entry's chunk (the oracle run on the tokens before that chunk);
    entries that touch nothing have none. Then the backward step walk by the sources (a
    raw log) and by a restored working bank (an fp8 log) give the CPU backward's gradients
    and leave the final bank as it was."""
    import torch
    from sdm_inductor import ops
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.phase1 import plan
    from sdm_inductor.kernels.backward.sources import chunk_start_sources
    sys.path.insert(0, HERE)
    from references import reference_sources
    from sdm_inductor.testing import make_inputs, reference_outputs
    _step_config()
    C = 8
    ins = make_inputs(P=2, T=29, W=4, R=3, hd=16, slots_per_stream=12, per_write_gate=True,
                      repeats=True, seed=31)
    P, T, W = ins.k_idx.shape
    S = ins.bank.shape[0]
    bank = ins.bank.clone()
    _, log, _ = host.forward(bank, *tuple(ins)[1:], C, "none", True)
    rows = log.view(-1, log.shape[-1])   # [segments * C, W, hd]: one row per write position
    pl = plan(S, *(x.contiguous() for x in (ins.k_idx, ins.k_val, ins.beta, ins.g,
                                             ins.q_idx, ins.q_val)), C)
    from sdm_inductor.kernels.backward import sources
    ref = reference_sources(pl, S)
    # the launches = torch's searchsorted: the sorted form, and the dense table in one
    # scan tile and in tiles of 2 chunks (4 here: the carry between tiles), of 16 columns
    assert sources._dense_fits(pl, S)
    assert torch.equal(chunk_start_sources(pl, S, dense=False), ref)
    for cb, sb in ((sources.SCAN_CHUNKS, sources.SCAN_SLOTS), (2, 16)):
        old = sources.SCAN_CHUNKS, sources.SCAN_SLOTS
        sources.SCAN_CHUNKS, sources.SCAN_SLOTS = cb, sb
        try:
            assert torch.equal(chunk_start_sources(pl, S, dense=True), ref), (cb, sb)
        finally:
            sources.SCAN_CHUNKS, sources.SCAN_SLOTS = old
    src = chunk_start_sources(pl, S)
    assert torch.equal(src, ref)
    src = src.long()
    assert src.shape == (pl.B, C, pl.E)
    for c in range(pl.NC):
        head = ins._replace(**{f: getattr(ins, f)[:, :c * C] for f in
                               ("k_idx", "k_val", "v", "beta", "g", "q_idx", "q_val")})
        start = reference_outputs(head)[1] if c else ins.bank.double()
        for p in range(P):
            sl, sr = pl.slot.view(pl.B, C, pl.E)[p * pl.NC + c].long(), src[p * pl.NC + c]
            assert bool((sr[sl < 0] == -1).all()), (c, p)
            live = sl >= 0
            got = torch.where((sr >= 0)[..., None], rows[sr.clamp(min=0)],
                              bank[sl.clamp(min=0)])[live]
            _check(f"chunk {c} stream {p} start rows", got, start[sl[live]], 1e-5)

    # the backward step walk reads a raw log's chunk-start rows by their sources; an fp8
    # log's it restores chunk by chunk into a working bank: each against the CPU backward
    # fed the same log, and neither changes the final bank
    from sdm_inductor import cpu
    for mode in ("none", "fp8"):
        x = make_inputs(P=2, T=29, W=4, R=3, hd=16, slots_per_stream=12, per_write_gate=True,
                        repeats=True, seed=32)
        gen = torch.Generator().manual_seed(3)
        dy, dM = torch.randn(2, 29, 16, generator=gen), torch.randn(x.bank.shape, generator=gen)
        fin = x.bank.clone()
        _, log, scales = host.forward(fin, *tuple(x)[1:], C, mode, True)
        kept = fin.clone()
        got = host.backward(dy, dM, fin, log, scales, *tuple(x)[1:], C, mode, False)
        assert torch.equal(fin, kept), "the backward changed the final bank"
        how = ops.last_dispatch()["chunk_start_rows"]
        assert how == ("sources" if mode == "none" else "restored"), (mode, how)
        want = cpu.backward(dy, dM, fin, log, scales, *tuple(x)[1:], C, mode, False)
        for n, a, b in zip(NAMES, got, want):
            _check(f"{how} grad {n}", a, b, 1e-5)


def case_entry_groups():
    """``phase1.entry_groups`` (a program per block of a segment's positions: the blocks'
    counts, then their headers) gives exactly ``references.reference_groups``' split
    layout: random groups, then
    a real plan with repeated and out-of-range slots; blocks smaller than a segment, so the
    counts of earlier blocks place each block's headers and the empty headers between the
    front and back groups span several blocks."""
    import dataclasses
    import torch
    from sdm_inductor.kernels import phase1
    from sdm_inductor.testing import make_inputs
    sys.path.insert(0, HERE)
    from references import reference_groups
    from test_groups import random_plan
    phase1.headers.GROUPS_BLOCK = 16
    ins = make_inputs(P=2, T=37, W=4, R=3, hd=8, slots_per_stream=10, repeats=True, seed=31)
    real = phase1.plan(ins.bank.shape[0], *(x.contiguous() for x in (
        ins.k_idx, ins.k_val, ins.beta, ins.g, ins.q_idx, ins.q_val)), 16)
    for pl in (random_plan(B=3, C=8, E=5, seed=1), real):
        got, want = phase1.entry_groups(pl), reference_groups(pl, pack=2)
        for f in dataclasses.fields(phase1.Groups):
            a, b = getattr(got, f.name), getattr(want, f.name)
            assert a.dtype == b.dtype and torch.equal(a, b), f.name


def case_window_sums():
    """``backward.step_walk.window_sums`` (the backward step walk's cross-column sums of a
    window) gives the column-block sums of the window's rows, in their slice of the
    whole-sequence sums and nowhere else: full and partial windows, P > 1, a number of
    column blocks that is not a multiple of the load tile, a chunk that is no power of 2,
    and the dQK / dL partials (stored on and below the diagonal only: NaN above it here)
    read only on and below it, their sums zero above it."""
    import torch
    from sdm_inductor.kernels.backward import step_walk as sb
    sb.SUM_BLOCK, sb.SUM_ROWS = 64, 4
    gen = torch.Generator().manual_seed(5)
    P, NC, NCW, C, W, E = 2, 7, 3, 6, 2, 5
    widths = dict(ev=(5, E), coef=(3, W), m=(3, W), b=(9, 1), qk=(9, C), L=(9, C))
    tri = torch.ones(C, C).tril()
    for c_lo, n in ((6, 1), (3, 3), (0, 3)):
        parts = {k: torch.randn(nb, P * NCW, C, w, generator=gen) for k, (nb, w) in widths.items()}
        for k in ("qk", "L"):   # the product launch stores on and below the diagonal only
            parts[k] = torch.where(tri.bool(), parts[k], float("nan"))
        sums = {k: torch.full((P * NC, C, w), float("nan")) for k, (_, w) in widths.items()}
        before = {k: x.clone().view(P, NC, C, -1) for k, x in sums.items()}
        sb.window_sums(parts, sums, P, NC, c_lo, n, NCW, C)
        for k, x in parts.items():
            want = x.nan_to_num(0.0).view(x.shape[0], P, NCW, C, -1)[:, :, :n].sum(0)
            got = sums[k].view(P, NC, C, -1)
            torch.testing.assert_close(got[:, c_lo:c_lo + n], want, rtol=1e-6, atol=1e-6,
                                       msg=k)
            rest = torch.ones(NC, dtype=torch.bool)
            rest[c_lo:c_lo + n] = False
            assert torch.equal(got[:, rest].isnan(), before[k][:, rest].isnan()), k


def _gram_terms(pl):
    """Per (segment, token, A / QK): the Gram terms its pairs program adds, i.e. the
    (entry, earlier write of the same slot) pairs: writes with writes of earlier tokens,
    reads with writes of tokens up to their own (the plan's slots: -1 touches nothing)."""
    import torch
    B, C, W = pl.B, pl.C, pl.W
    slot = pl.slot.view(B, C, -1)
    ws = slot[:, :, :W]
    tok = torch.arange(C)
    out = []
    for ents, strict in ((ws, True), (slot[:, :, W:], False)):
        same = ((ents[:, :, :, None, None] == ws[:, None, None, :, :])
                & (ents >= 0)[..., None, None])
        before = tok[None, :] < tok[:, None] if strict else tok[None, :] <= tok[:, None]
        out.append((same & before[None, :, None, :, None]).sum((2, 3, 4)))
    return torch.stack(out, -1)


def case_phase1_scans():
    """Phase 1 with the segmented sort (``entries._flat_span``: keys that do not fit offset,
    or an AOTInductor package with unbounded sizes), the groups in one block of
    positions per segment and one pairs program per token (the form of calls without
    writes or reads) gives the groups and write runs of binary searches and a second sort
    (``references``); with the flat sort of all segments, blocks of positions that split
    groups and two pairs programs per token (term lists, members at their sorted
    positions) bitwise the same per-entry plan and its Gram rows up to rounding: int32
    and int64 keys, repeated and out-of-range slots, term lists that overflow (and fold
    in early)."""
    import torch
    from sdm_inductor.kernels import phase1
    from sdm_inductor.testing import make_inputs
    sys.path.insert(0, HERE)
    from references import search_groups, search_runs
    cases = [dict(P=2, T=37, W=4, R=3, slots_per_stream=11, C=8, repeats=True),
             dict(P=1, T=300, W=16, R=4, slots_per_stream=600, C=64, repeats=True),
             # 64 < C <= 128: the split pairs kernel's own entry blocks and warps
             dict(P=1, T=150, W=6, R=4, slots_per_stream=80, C=96, repeats=True)]
    overflowed = False
    for kw, key_dtype in zip(cases, (torch.int64, torch.int32, torch.int32)):
        C = kw.pop("C")
        ins = make_inputs(hd=4, per_write_gate=True, seed=3, **kw)
        ins.k_idx[0, 1, 1] = -1                     # a write that touches nothing
        ins.q_idx[0, 2, 0] = ins.bank.shape[0] + 3   # an out-of-range read
        S = ins.bank.shape[0]
        args = (S, ins.k_idx, ins.k_val, ins.beta, ins.g, ins.q_idx, ins.q_val, C)
        phase1.entries._key_dtype = lambda S, C, E, dt=key_dtype: dt
        phase1.groups.GROUPS_BLK = 2048   # every segment in one block
        phase1.entries.FLAT_SORT, phase1.pairs.PAIR_SPLIT = False, False
        want = phase1.plan(*args)
        P, T, W = ins.k_idx.shape
        R = ins.q_idx.shape[2]
        slot, _, _, key, _, NC, _ = phase1.prep(*args)
        B, E = P * NC, W + R
        key = key.view(B, C * E)
        skey, sperm = torch.sort(key, dim=-1, stable=True)
        assert torch.equal(want.perm, sperm.to(torch.int32))
        for f, x in zip(("gs", "nw", "na"), search_groups(key, skey)):
            assert torch.equal(getattr(want, f), x), f
        rslot, rlen, rtok, rent = search_runs(key, slot.view(B, C * E), C, W, R)
        take = lambda x: x.view(B, C * E).gather(1, rent.long())
        for f, x in zip(("slot", "length", "tok", "decay", "coef"),
                        (rslot, rlen, rtok, take(want.decay), take(want.coef))):
            y = getattr(want.runs, f)
            assert x.dtype == y.dtype and torch.equal(x, y), f"runs.{f}"
        # blocks of 16 / 64 positions: groups that cross one or several block edges
        phase1.groups.GROUPS_BLK = 16 if C == 8 else 64
        phase1.entries.FLAT_SORT, phase1.pairs.PAIR_SPLIT = True, True
        assert phase1.entries._flat_span(S, B, C, E) is not None
        flat = phase1.plan(*args)
        for f in ("perm", "gs", "nw", "na", "gam", "gend", "ev", "coef", "decay"):
            assert torch.equal(getattr(flat, f), getattr(want, f)), f
        for f in ("slot", "length", "decay", "tok", "coef"):
            x, y = getattr(flat.runs, f), getattr(want.runs, f)
            assert x.dtype == y.dtype and torch.equal(x, y), f"runs.{f}"
        for f in ("A", "QK"):
            x, y = getattr(flat, f), getattr(want, f)
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7, msg=f)
            assert x.abs().sum() > 0, f
        lmax = phase1.pairs._pair_launch_blocks(C, W, R, True)[1]
        terms = _gram_terms(flat)
        print(f"C={C}: up to {terms.max()} Gram terms in a program, lists of {lmax}")
        overflowed = overflowed or bool(terms.max() > lmax)
        print(f"{key_dtype}: one block == searches, blocks and split pairs == one block")
    assert overflowed


def case_solve_blocks():
    """``solve.inverse`` by 2 x 2 blocks of 64 (64 < C <= 128, C = 128 and C = 96 with
    masked rows: the diagonal blocks, then the off-diagonal ones) gives torch's triangular
    solve's X and QK X."""
    import torch
    from sdm_inductor.kernels.phase1 import solve
    gen = torch.Generator().manual_seed(5)
    for C in (128, 96):
        B = 3
        A = torch.randn(B, C, C, generator=gen) * 0.3
        QK = torch.tril(torch.randn(B, C, C, generator=gen))
        beta = torch.rand(B, C, generator=gen)
        beta[1, -5:] = 0.0   # padded tokens
        old = solve.BLOCKED_MAX_C
        solve.BLOCKED_MAX_C = 0
        try:
            X_ref, QKX_ref = solve.inverse(A, QK, beta)
        finally:
            solve.BLOCKED_MAX_C = old
        X, QKX = solve.inverse(A, QK, beta)
        _check(f"C={C} X", X, X_ref, 1e-5)
        _check(f"C={C} QKX", QKX, QKX_ref, 1e-5)
        assert torch.equal(torch.triu(X, 1), torch.zeros_like(X))
        assert torch.equal(torch.triu(QKX, 1), torch.zeros_like(QKX))


def case_extreme_gates():
    """Gates of -inf (a full forget) and -1e4 through the prep kernel's floor: the training
    kernels and the decode path give the loop's readings, bank and gradients; the gated
    op's prep kernel floors the gates it computes (``a_raw`` of 1e4 and +inf)."""
    import torch
    from sdm_inductor import ops
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import gated_reference, make_inputs, reference_outputs, with_gates
    for value, per_write in ((float("-inf"), False), (-1e4, True)):
        ins = with_gates(make_inputs(P=2, T=21, W=3, R=3, hd=6, slots_per_stream=8,
                                     per_write_gate=per_write, seed=31), value)
        _train(ins, 16, tol=2e-5)
    ins = with_gates(make_inputs(P=2, T=5, W=3, R=3, hd=6, slots_per_stream=8, seed=32),
                     float("-inf"), every=2)
    y_ref, M_ref, _ = reference_outputs(ins)
    bank = ins.bank.clone()
    y = host.forward(bank, *tuple(ins)[1:], 16, "none", False)[0]
    assert ops.last_dispatch().get("kernel_path") == "decode", ops.last_dispatch()
    _check("decode readings", y, y_ref, 1e-5)
    _check("decode bank", bank, M_ref, 1e-5)

    ops.IMPLS["cpu"] = host   # the gated op on the kernels' host code
    ins = make_inputs(P=2, T=21, W=3, R=3, hd=6, slots_per_stream=8, seed=33)
    gen = torch.Generator().manual_seed(3)
    b_raw, a_raw = torch.randn(2, 21, generator=gen), torch.randn(2, 21, generator=gen)
    a_raw[:, ::4] = 1e4
    A_log, dt_bias = torch.tensor([0.2, -0.1]), torch.tensor([0.5, 0.0])
    dy, dM = torch.randn(2, 21, 6, generator=gen), torch.randn(ins.bank.shape, generator=gen)
    raw = (b_raw, a_raw, A_log, dt_bias)
    y_ref, M_ref, g_ref = gated_reference(ins, raw, (dy, dM))
    x = [t.clone().requires_grad_() for t in (ins.bank, ins.k_val, ins.v, ins.q_val, *raw)]
    y, M, _, _ = torch.ops.sdm.write_read_gated(x[0], ins.k_idx, x[1], x[2], *x[4:6],
                                                 *x[6:], ins.q_idx, x[3], 16, 8)
    assert ops.last_dispatch().get("gates") == "prep-kernel", ops.last_dispatch()
    _check("gated readings", y, y_ref, 1e-5)
    _check("gated bank", M, M_ref, 1e-5)
    torch.autograd.backward((y, M), (dy, dM))
    for n, t, r in zip(("bank", "k_val", "v", "q_val", "b_raw", "a_raw", "A_log", "dt_bias"),
                       x, g_ref):
        _check("gated grad " + n, t.grad, r, 2e-5)
    a_raw[:, 1] = float("inf")   # g = -inf: readings as the loop's
    y_ref, M_ref, _ = gated_reference(ins, raw)
    y, M, _, _ = torch.ops.sdm.write_read_gated(ins.bank, ins.k_idx, ins.k_val, ins.v, *raw,
                                                 ins.q_idx, ins.q_val, 16, 8)
    _check("gated -inf readings", y, y_ref, 1e-5)
    _check("gated -inf bank", M, M_ref, 1e-5)


def _random_call(seed: int):
    """A random call of the public ops (plain or gated; in place, functional or training)
    with random sizes, options and layouts: (description, inputs, a function that runs the
    call with the implementation in CPU's place and returns what it computed)."""
    import random

    import torch
    from sdm_inductor import ops
    from sdm_inductor.testing import make_inputs
    r = random.Random(seed)
    B, H = r.choice([1, 2]), r.choice([1, 2])
    P, T, W, R = B * H, r.choice([1, 5, 17, 40]), r.choice([1, 3]), r.choice([1, 2])
    hd, sph, C = r.choice([8, 20]), r.choice([8, 24]), r.choice([16, 32])
    dtype = r.choice([torch.float32, torch.bfloat16])
    shared, gated = r.random() < 0.25, r.random() < 0.5
    # (the gated op has no in-place form)
    how = r.choice(["functional"] * gated + ["in place"] * (not gated) + ["training"] * 2)
    mode = r.choice(["none", "none", "fp8", "int4"]) if how == "training" else "none"
    fp32 = how == "training" and dtype == torch.bfloat16 and r.random() < 0.5
    bank_layout, layout = r.choice(["rows", "rows", "transposed", "slice"]), r.choice(
        ["rows", "transposed", "slice"])
    ins = make_inputs(P=P, T=T, W=W, R=R, hd=hd, slots_per_stream=sph,
                      repeats=r.random() < 0.3, per_write_gate=not gated and r.random() < 0.4,
                      dtype=dtype, index_dtype=r.choice([torch.int32, torch.int64]), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    if gated:   # a projection's [B, T, 2H + 1] output, sliced: strided raw gates
        proj = torch.randn(B, T, 2 * H + 1, generator=gen)
        gate_args = [proj[..., :H], proj[..., H:2 * H], torch.randn(P, generator=gen),
                     torch.randn(P, generator=gen)]
        if r.random() < 0.3:
            gate_args[2][0] = float("inf")   # g = -inf for stream 0
    else:
        g = ins.g.clone()
        if r.random() < 0.3:
            g[:, ::4] = float("-inf")
        gate_args = [ins.beta, g]

    def laid_out(t, how):
        if how == "rows" or t.dim() < 2 or t.numel() == 0:
            return t
        if how == "transposed":
            return t.transpose(-1, -2).contiguous().transpose(-1, -2)
        return torch.cat([t, torch.zeros(*t.shape[:-1], 3, dtype=t.dtype)], -1)[..., :t.shape[-1]]

    floats = [laid_out(ins.bank, bank_layout), *(laid_out(t, layout) for t in
                                                  (ins.k_val, ins.v, *gate_args, ins.q_val))]
    k_idx, q_idx = laid_out(ins.k_idx, layout), laid_out(ins.q_idx, layout)
    desc = dict(seed=seed, P=P, T=T, W=W, R=R, hd=hd, C=C, dtype=dtype, shared=shared,
                gated=gated, how=how, mode=mode, fp32=fp32, bank=bank_layout, layout=layout)
    slots = 0 if shared else sph

    def run(impl):
        ops.IMPLS["cpu"] = impl
        x = [t.detach().clone().requires_grad_(how == "training") for t in floats]
        bank, k_val, v, *gate_x, q_val = x
        if how == "in place":
            y = torch.ops.sdm.write_read_(bank, k_idx, k_val, v, *gate_x, q_idx, q_val, C,
                                          slots, shared)
            return [y, bank]
        op = torch.ops.sdm.write_read_gated if gated else torch.ops.sdm.write_read
        y, M, _, _ = op(bank, k_idx, k_val, v, *gate_x, q_idx, q_val, C, slots, shared, mode,
                        fp32, how == "training")
        if how != "training":
            return [y, M]
        dgen = torch.Generator().manual_seed(seed + 1)
        dy = torch.randn(y.shape, generator=dgen).to(y.dtype)
        dM = torch.randn(M.shape, generator=dgen).to(M.dtype)
        loss = (y.float() * dy.float()).sum() + (M.float() * dM.float()).sum()
        return [y, M, *torch.autograd.grad(loss, x)]

    return desc, run


def case_random_calls():
    """Random calls (``_random_call``: sizes, options, dtypes, full forgets, and layouts of
    the bank and of every input) through the public ops: the CUDA implementation against
    the CPU one (itself checked against the oracle by the rest of the suite)."""
    import torch
    from sdm_inductor import cpu
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import rel_err
    for seed in range(8):
        desc, run = _random_call(seed)
        want, got = run(cpu), run(host)
        # a quantized undo log moves the gradients only: readings and final bank keep the
        # dtype's tolerance
        tol = 1e-4 if desc["dtype"] == torch.float32 else 3e-2
        grad_tol = {"fp8": 0.3, "int4": 0.3}.get(desc["mode"], tol)
        errs = [rel_err(a, b) for a, b in zip(got, want)]
        print(desc, " ".join(f"{e:.1e}" for e in errs))
        assert all(torch.isfinite(t).all() for t in got[2:]), ("non-finite gradient", desc)
        assert all(e <= tol for e in errs[:2]), (desc, errs)
        assert all(e <= grad_tol for e in errs[2:]), (desc, errs)


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from sdm_inductor.testing import quick_interpreter
    # the cases that feed out-of-range indices keep the interpreter's int32 overflow checks
    quick_interpreter(overflow_checks=sys.argv[1] in ("decode_and_masking", "index_ranges"))
    globals()["case_" + sys.argv[1]]()
