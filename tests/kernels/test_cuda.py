"""The CUDA implementation (Triton kernels) against the float64 oracle. Skipped without a GPU.

fp32 banks: relative error <= 1e-4; bf16 banks: <= 2e-2. Gradients against autograd
through the oracle. Plus: every snapshot mode, grad_bank_fp32, P > 1, shared bank,
per-write gates, T not a multiple of C, repeated slots, the decode path, bitwise
determinism, CUDA-graph capture and no kernel recompilation for a new T. The Phase 2
walks: eager calls take the step walk (``kernels/forward/step_walk.py``) except for small shapes
(``launch.column_suits``), traced ones the column walk (``kernels/forward/column_walk.py``); the tests
run the step walks unless they ask for another, and the oracle and determinism tests run
both in eager.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import sdm_inductor  # noqa: F401  (registers the ops and the CUDA implementation)
from sdm_inductor import ops
from sdm_inductor.testing import (FLOAT_INPUTS, make_inputs, reference_outputs, rel_err,
                                  undo_log_rows_used)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

NAMES = ("bank", "k_val", "v", "beta", "g", "q_val")
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
# quantized snapshots only perturb the gradients that read the saved rows
SNAP_TOL = {"none": None, "bf16": 2e-2, "fp8": 6e-2, "int4": 0.25}


def _inputs(dtype=torch.float32, **kw):
    kw.setdefault("seed", 1234)
    return make_inputs(dtype=dtype, device="cuda", **kw)


def _op(ins, C, *, shared=False, sph=None, mode="none", fp32=False, save=True):
    P = ins.k_idx.shape[0]
    slots = 0 if shared else (sph if sph is not None else ins.bank.shape[0] // P)
    return torch.ops.sdm.write_read(*ins, C, slots, shared, mode, fp32, save)


def _grads(ins, C, dy, dM, **kw):
    leaves = ins.leaves()
    y, M, _, _ = _op(leaves, C, **kw)
    loss = (y.float() * dy.float()).sum() + (M.float() * dM.float()).sum()
    return y, M, torch.autograd.grad(loss, [leaves[i] for i in FLOAT_INPUTS])


@pytest.fixture(autouse=True)
def step_walks_by_default():
    """The step walks for every test here unless it asks otherwise: ``WALK="auto"`` gives
    shapes as small as these the column walks (``launch.column_suits``), and the step
    walks are what every larger eager call runs."""
    from sdm_inductor.kernels import host
    old = dict(host.CONFIG)
    host.CONFIG["WALK"] = "step"
    yield
    host.CONFIG.clear()
    host.CONFIG.update(old)


@pytest.fixture(params=["step", "column", "queue", "windows"])
def walk(request):
    """The Phase 2 walks of eager calls: the step walks, the column walks, the queue walks
    (what traced calls run), and the step walks over token windows of 64 (each window's Phase 1
    on a side stream, ahead of the walk: ``pipeline.ahead``)."""
    from sdm_inductor.kernels import host
    if request.param == "windows":
        host.CONFIG.update(WALK="step", WINDOW_TOKENS=64, TRAIN_WINDOW_TOKENS=64)
    else:
        host.CONFIG["WALK"] = request.param
    return request.param


def _training_case(dtype):
    """Inputs and output gradients of the tests that compare two ways of running a training
    step: enough chunks, slots shared by tokens, repeated slots."""
    ins = _inputs(dtype, P=2, T=300, W=16, R=8, hd=96, slots_per_stream=256,
                  per_write_gate=True, repeats=True)
    return ins, torch.randn(2, 300, 96, device="cuda").to(dtype), torch.randn_like(ins.bank)


def _check(name, got, want, tol):
    err = rel_err(got, want)
    assert err <= tol, f"{name}: relative error {err:.3e} > {tol:.0e}"


CASES = [  # (dtype, P, T, W, R, hd, sph, C, kwargs)
    (torch.float32, 2, 150, 8, 6, 40, 64, 64, dict(per_write_gate=True)),
    (torch.float32, 3, 77, 5, 4, 48, 32, 16, dict(repeats=True)),
    (torch.float32, 1, 100, 6, 5, 24, 128, 48, dict(per_write_gate=True, repeats=True)),
    (torch.bfloat16, 2, 130, 8, 8, 64, 96, 64, dict(per_write_gate=True)),
    (torch.bfloat16, 2, 70, 4, 4, 32, 64, 32, dict(shared_bank=True)),
    (torch.float32, 3, 9, 8, 6, 40, 64, 64, dict()),   # one chunk (T < C), P > 1
    # 64 < C <= 128: the solve by 2 x 2 blocks (solve._inverse_diag_kernel, _inverse_low_kernel), rows masked
    (torch.float32, 2, 250, 8, 6, 40, 96, 96, dict(per_write_gate=True, repeats=True)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_forward_backward_vs_oracle(case, walk):
    from sdm_inductor.kernels import host
    dtype, P, T, W, R, hd, sph, C, kw = CASES[case]
    kw = dict(kw)
    shared = kw.pop("shared_bank", False)   # the op's option; the inputs are the same
    ins = _inputs(dtype, P=P, T=T, W=W, R=R, hd=hd, slots_per_stream=sph, **kw)
    gen = torch.Generator(device="cuda").manual_seed(5)
    dy = torch.randn(P, T, hd, device="cuda", generator=gen).to(dtype)
    dM = torch.randn(ins.bank.shape, device="cuda", generator=gen).to(dtype)
    y_ref, M_ref, g_ref = reference_outputs(ins, (dy, dM))
    y, M, grads = _grads(ins, C, dy, dM, shared=shared)
    assert ops.last_dispatch()["impl"] == "cuda-triton-chunked"
    if T > 16:   # not the decode path
        assert ops.last_dispatch()["walk"] == ("step" if walk == "windows" else walk)
        if host.CONFIG["WINDOW_TOKENS"] == 64:
            assert ops.last_dispatch()["windows"] == len(range(0, T, max(64 // C, 1) * C))
        # the backward reuses the forward's Phase 1 (and after a step or queue walk its
        # v - r0) unless the forward ran in token windows
        assert ops.last_dispatch()["phase1_backward"] == ("recomputed" if walk == "windows"
                                                          and T > 64 else "kept")
    tol = TOL[dtype]
    _check("readings", y, y_ref, tol)
    _check("final bank", M, M_ref, tol)
    for n, g, r in zip(NAMES, grads, g_ref):
        _check("grad " + n, g, r, tol)


@pytest.mark.parametrize("mode", ["bf16", "fp8", "int4"])
def test_snapshot_modes(mode):
    ins = _inputs(torch.float32, P=2, T=90, W=6, R=4, hd=64, slots_per_stream=64,
                  per_write_gate=True)
    dy = torch.randn(2, 90, 64, device="cuda")
    dM = torch.randn_like(ins.bank)
    y_ref, M_ref, g_ref = reference_outputs(ins, (dy, dM))
    y, M, grads = _grads(ins, 32, dy, dM, mode=mode)
    _check("readings", y, y_ref, 1e-4)          # the forward does not see the snapshot
    _check("final bank", M, M_ref, 1e-4)
    for n, g, r in zip(NAMES, grads, g_ref):
        _check(f"{mode} grad {n}", g, r, SNAP_TOL[mode])


def test_grad_bank_fp32_bf16():
    ins = _inputs(torch.bfloat16, P=2, T=100, W=8, R=8, hd=64, slots_per_stream=64)
    dy = torch.randn(2, 100, 64, device="cuda").bfloat16()
    dM = torch.randn_like(ins.bank)
    _, _, g_ref = reference_outputs(ins, (dy, dM))
    _, _, grads = _grads(ins, 32, dy, dM, fp32=True)
    assert grads[0].dtype == torch.bfloat16
    for n, g, r in zip(NAMES, grads, g_ref):
        _check("grad " + n, g, r, 2e-2)


@pytest.mark.parametrize("T", [1, 7, 16])
def test_decode_path(T):
    ins = _inputs(torch.float32, P=4, T=T, W=16, R=16, hd=96, slots_per_stream=64,
                  per_write_gate=True, repeats=True)
    y_ref, M_ref, _ = reference_outputs(ins)
    bank = ins.bank.clone()
    y = torch.ops.sdm.write_read_(bank, *ins[1:], 64, 64, False)
    assert ops.last_dispatch()["kernel_path"] == "decode"
    _check("readings", y, y_ref, 1e-4)
    _check("final bank", bank, M_ref, 1e-4)


def test_long_sequence_windows_and_chunk_sizes():
    """The eager no-grad forward in windows (T > WINDOW_TOKENS) and C in {16, 64, 128, 256}
    (at C = 128 the solve runs by 2 x 2 blocks, ``solve._inverse_diag_kernel``)."""
    from sdm_inductor.kernels import host
    ins = _inputs(torch.float32, P=2, T=600, W=8, R=8, hd=64, slots_per_stream=256)
    y_ref, M_ref, _ = reference_outputs(ins)
    old = host.CONFIG["WINDOW_TOKENS"]
    host.CONFIG["WINDOW_TOKENS"] = 256
    try:
        for C in (16, 64, 128, 256):
            bank = ins.bank.clone()
            y = torch.ops.sdm.write_read_(bank, *ins[1:], C, 256, False)
            assert ops.last_dispatch()["windows"] == -(-600 // (256 // C * C))
            _check(f"C={C} readings", y, y_ref, 1e-4)
            _check(f"C={C} final bank", bank, M_ref, 1e-4)
    finally:
        host.CONFIG["WINDOW_TOKENS"] = old


def test_out_of_range_indices_are_masked():
    """Inside compiled graphs no host check runs: bad rows must touch nothing."""
    ins = _inputs(torch.float32, P=2, T=80, W=6, R=6, hd=32, slots_per_stream=64)
    S = ins.bank.shape[0]
    k_idx = ins.k_idx.clone()
    q_idx = ins.q_idx.clone()
    k_idx[:, ::3, 1] = S + 1000
    k_idx[:, 1::5, 2] = -7
    q_idx[:, ::2, 3] = 10 ** 9
    guard = torch.randn(S + 4096, 32, device="cuda")
    bank = guard[:S]
    before = guard[S:].clone()
    for T in (10, 80):     # decode and chunked paths
        torch.ops.sdm.triton_write_read_(bank, k_idx[:, :T], ins.k_val[:, :T], ins.v[:, :T],
                                         ins.beta[:, :T], ins.g[:, :T], q_idx[:, :T],
                                         ins.q_val[:, :T], 32)
        torch.cuda.synchronize()
    assert torch.equal(guard[S:], before)
    assert torch.isfinite(bank).all()


@pytest.mark.parametrize("path", ["step", "column", "windows", "decode", "train", "gated"])
@pytest.mark.parametrize("bad", ["k_range", "q_range", "shared"])
def test_bad_indices_refused_before_the_bank_changes(path, bad):
    """The index check runs beside Phase 1 and the host waits for it only before the first
    write (``ops.await_index_check``): on every path a bad index is still refused by name
    with the caller's bank untouched, and the next good call runs normally."""
    from sdm_inductor.kernels import host
    if path in ("step", "column"):
        host.CONFIG["WALK"] = path
    elif path == "windows":
        host.CONFIG.update(WALK="step", WINDOW_TOKENS=64)
    shared = bad == "shared"
    ins = _inputs(torch.float32, P=2, T=8 if path == "decode" else 200, W=6, R=4, hd=32,
                  slots_per_stream=64)
    S = ins.bank.shape[0]
    k_idx, q_idx = ins.k_idx.clone(), ins.q_idx.clone()
    if bad == "k_range":
        k_idx[1, 5, 2], want = 3, r"'k_idx'.*rows of stream 1.*3 at \[1, 5, 2\]"
    elif bad == "q_range":
        q_idx[0, 7, 1], want = S + 9, rf"'q_idx'.*{S + 9} at \[0, 7, 1\]"
    else:
        q_idx[0, 6, 0], want = k_idx[1, 2, 0], r"disjoint.*at \[0, 6, 0\] also written by stream 1"
    sph = 0 if shared else 64
    bank = ins.bank.clone()
    leaves = ins.leaves()

    def call(k, q):
        if path == "train":
            return torch.ops.sdm.write_read(leaves[0], k, *leaves[2:6], q, leaves[7], 32, sph,
                                            shared, "none")[0]
        if path == "gated":
            P, T = k.shape[:2]
            b_raw, a_raw = torch.randn(P, T, device="cuda"), torch.randn(P, T, device="cuda")
            A_log, dt_bias = torch.zeros(P, device="cuda"), torch.zeros(P, device="cuda")
            return torch.ops.sdm.write_read_gated(bank, k, ins.k_val, ins.v, b_raw, a_raw, A_log,
                                                  dt_bias, q, ins.q_val, 32, sph, shared)[0]
        return torch.ops.sdm.write_read_(bank, k, *ins[2:6], q, ins.q_val, 32, sph, shared)

    with pytest.raises(ValueError, match=want):
        call(k_idx, q_idx)
    torch.cuda.synchronize()
    assert torch.equal(bank, ins.bank) and torch.equal(leaves[0], ins.bank)
    assert ops._PENDING.check is None
    y = call(ins.k_idx, ins.q_idx)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_banks_whose_rows_are_not_contiguous(dtype):
    """A column slice of a wider bank and a transposed bank, in place and functional with
    gradients, against the oracle (the kernels address row ``r`` at ``r * hd``: such
    banks run on a contiguous copy)."""
    from sdm_inductor.testing import check_strided_banks
    check_strided_banks(_inputs(dtype, P=2, T=100, W=8, R=4, hd=64, slots_per_stream=128),
                        32, TOL[dtype])


@pytest.mark.parametrize("shape", [dict(P=2, T=200, W=16, R=16, hd=128),
                                   dict(P=2, T=200, W=32, R=8, hd=64)])
def test_auto_walk_follows_the_shape_rule(shape):
    """``WALK="auto"``: the column walks where ``launch.column_suits`` (W, R <= 16, P * hd
    <= 4096, C <= 64), the step walks elsewhere; the backward follows the same rule and
    takes what the forward kept after either walk."""
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.runtime.launch import column_suits
    host.CONFIG["WALK"] = "auto"
    ins = _inputs(torch.float32, slots_per_stream=64, **shape)
    dy = torch.randn(2, 200, shape["hd"], device="cuda")
    _grads(ins, 64, dy, torch.randn_like(ins.bank))
    column = column_suits(2, shape["W"], shape["R"], 64, shape["hd"])
    assert column == (shape["W"] <= 16)
    assert ops.last_dispatch()["walk"] == ("column" if column else "step")
    assert ops.last_dispatch()["phase1_backward"] == "kept"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_queue_walk_matches_the_step_walk_and_repeats(dtype, monkeypatch):
    """The queue walks (``forward/queue_walk.py``, ``backward/queue_walk.py``) at a size
    where their ~1000 programs take items of many groups and chunks at once (4 streams x 3
    column blocks, 16 chunks): the step walks' readings, bank and gradients within the
    oracle tolerance, and bitwise the same results on every run (a missed dependency
    between items would read rows, deltas or dB rows too early, differently from run to
    run); the same for the backward given the forward's Phase 1 and ``v - r0``
    (``host.forward_kept``: what a traced graph hands over; no gather items)."""
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.runtime.launch import direct_launches
    ins = _inputs(dtype, P=4, T=1000, W=32, R=32, hd=320, slots_per_stream=2048,
                  per_write_gate=True, repeats=True)
    gen = torch.Generator(device="cuda").manual_seed(5)
    dy = torch.randn(ins.v.shape, generator=gen, device="cuda").to(dtype)
    dM = torch.randn(ins.bank.shape, generator=gen, device="cuda").to(dtype)

    walks = []   # the forward walks that ran (forward_kept records no dispatch of its own)

    def counted(name, walk):
        def run_walk(*args):
            walks.append(name)
            return walk(*args)
        return run_walk

    for name in ("step_walk", "queue_walk"):
        monkeypatch.setattr(host, name, counted(name, getattr(host, name)))

    def run(walk, handed=False):
        host.CONFIG["WALK"] = walk
        walks.clear()
        bank = ins.bank.clone()
        y, rows, scales, kept = direct_launches(host.forward_kept)(
            bank, *tuple(ins)[1:], 64, "none", True)
        grads = host.backward(dy, dM, bank, rows, scales, *tuple(ins)[1:], 64, "none", False,
                              kept.tensors() if handed else [])
        assert ops.last_dispatch()["phase1_backward"] == ("handed" if handed else "recomputed")
        return (y, bank, *grads)

    names = ("readings", "bank") + tuple("grad " + n for n in
                                         ("bank", "k_val", "v", "beta", "g", "q_val"))
    ref = run("step")
    first = run("queue")
    assert walks == ["queue_walk"]
    assert ops.last_dispatch()["reverse_walk"] == "queue"
    for n, a, b in zip(names, first, ref):
        _check(n, a, b, TOL[dtype])
    for _ in range(3):
        for a, b in zip(run("queue"), first):
            assert torch.equal(a, b)
    first = run("queue", handed=True)
    for n, a, b in zip(names, first, ref):
        _check("handed over: " + n, a, b, TOL[dtype])
    for _ in range(3):
        for a, b in zip(run("queue", handed=True), first):
            assert torch.equal(a, b)


def test_deterministic_bitwise(walk):
    ins = _inputs(torch.bfloat16, P=2, T=200, W=16, R=16, hd=128, slots_per_stream=64,
                  per_write_gate=True, repeats=True)  # small bank: many slots shared by tokens
    dy = torch.randn(2, 200, 128, device="cuda").bfloat16()
    dM = torch.randn_like(ins.bank)
    a = _grads(ins, 64, dy, dM)
    b = _grads(ins, 64, dy, dM)
    for x, y in zip((a[0], a[1], *a[2]), (b[0], b[1], *b[2])):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kept_for_backward_is_bitwise_the_recomputation(dtype):
    """The training forward's Phase 1 and ``v - r0`` handed to the backward (``KEEP``)
    give bitwise the gradients of a backward that recomputes them."""
    from sdm_inductor.kernels import host
    ins, dy, dM = _training_case(dtype)
    got = {}
    try:
        for keep in (1, 0):
            host.CONFIG.update(KEEP=keep)
            got[keep] = _grads(ins, 64, dy, dM)[2]
            d = ops.last_dispatch()
            assert d["phase1_backward"] == ("kept" if keep else "recomputed")
    finally:
        host.CONFIG.update(KEEP=1)
    for n, a, b in zip(NAMES, got[1], got[0]):
        assert torch.equal(a, b), n


def test_compiled_layer_training_takes_the_kept_phase1():
    """A compiled training step of the layer (``sdm::write_read_gated`` forward and its
    traced backward formula: no autograd context between them) finds the forward's kept
    Phase 1 by its undo log, as eager does, and gives eager's gradients."""
    from sdm_inductor.nn import SparseDeltaMemory
    torch.manual_seed(0)
    layer = SparseDeltaMemory(64, num_heads=2, slots_per_head=256, top_k=8,
                              chunk_size=64).cuda()
    x = torch.randn(2, 300, 64, device="cuda")
    dy = torch.randn_like(x)

    def step(fn):
        xi = x.clone().requires_grad_()
        fn(xi).backward(dy)
        grads = [xi.grad] + [p.grad.clone() for p in layer.parameters()]
        layer.zero_grad(set_to_none=True)
        return grads, ops.last_dispatch()["phase1_backward"]

    want, eager_phase1 = step(layer)
    got, compiled_phase1 = step(torch.compile(layer, fullgraph=True))
    assert (eager_phase1, compiled_phase1) == ("kept", "kept")
    for a, b in zip(got, want):
        _check("grad", a, b, 1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("C", [64, 128])
def test_dev_and_group_launch_dense_and_sparse(dtype, C):
    """The backward's ``d ev`` and dB grid (``_step_bwd_dev_group_kernel``, with PDL's waits
    as the GPU runs them), in a kept and a recomputing backward, over dense slots with
    repeats (groups of many members) and sparse slots (most tiles hold groups of one
    member: ``_one_tile``): bitwise reproducible, and the oracle's gradients."""
    from sdm_inductor.kernels import host
    for slots, keep in ((256, 1), (8192, 0)):
        ins = _inputs(dtype, P=2, T=300, W=16, R=8, hd=96, slots_per_stream=slots,
                      per_write_gate=True, repeats=slots == 256)
        dy = torch.randn(2, 300, 96, device="cuda").to(dtype)
        dM = torch.randn_like(ins.bank)
        host.CONFIG["KEEP"] = keep
        a, b = (_grads(ins, C, dy, dM)[2] for _ in range(2))
        want = reference_outputs(ins, (dy, dM))[2]
        for n, x, y, r in zip(NAMES, a, b, want):
            assert torch.equal(x, y), ("not reproducible", slots, n)
            _check(f"grad {n} (slots {slots})", x, r, TOL[dtype])


@pytest.mark.parametrize("C", [64, 128, 256])
def test_pairs_term_lists(C):
    """The split pairs kernel (two programs per token, the Gram terms through per-program
    term lists: the eager form) against the single one (one-hot sums over every lane: the
    traced form): the same per-entry weights bitwise, A and QK to rounding, bitwise
    reproducible; dense slots (lists that overflow and fold early) and sparse ones."""
    from sdm_inductor.kernels import phase1
    try:
        for slots in (64, 8192):
            ins = _inputs(torch.float32, P=2, T=300, W=16, R=8, hd=32, slots_per_stream=slots,
                          per_write_gate=True, repeats=True)
            args = (ins.bank.shape[0], ins.k_idx, ins.k_val, ins.beta, ins.g, ins.q_idx,
                    ins.q_val, C)
            got = {}
            for split, run in ((True, 0), (True, 1), (False, 0)):
                phase1.pairs.PAIR_SPLIT = split
                got[split, run] = phase1.plan(*args)
            for f in ("gam", "gend", "ev", "coef", "decay", "A", "QK"):
                a, b, c = (getattr(got[k], f) for k in ((True, 0), (True, 1), (False, 0)))
                assert torch.equal(a, b), ("not reproducible", slots, f)
                if f in ("A", "QK"):
                    torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6, msg=f)
                    assert a.abs().sum() > 0, f
                else:
                    assert torch.equal(a, c), (slots, f)
    finally:
        phase1.pairs.PAIR_SPLIT = True


def test_blocked_solve_in_two_launches():
    """``solve.inverse`` at 64 < C <= 128 in two launches (the diagonal blocks, then the
    off-diagonal ones) gives torch's triangular solve's X and QK X to fp32 accuracy, with
    padded tokens (beta = 0)."""
    from sdm_inductor.kernels.phase1 import solve
    gen = torch.Generator(device="cuda").manual_seed(3)
    for C in (128, 96):
        A = torch.randn(64, C, C, device="cuda", generator=gen) * 0.3
        QK = torch.tril(torch.randn(64, C, C, device="cuda", generator=gen))
        beta = torch.rand(64, C, device="cuda", generator=gen)
        beta[5, -7:] = 0.0
        got = solve.inverse(A, QK, beta)
        L = torch.tril(beta[:, :, None].double() * A.double(), -1) + torch.eye(
            C, device="cuda", dtype=torch.float64)
        X = torch.linalg.solve_triangular(L, torch.eye(C, device="cuda", dtype=torch.float64)
                                          .expand(64, C, C), upper=False, unitriangular=True)
        for a, ref in zip(got, (X, QK.double() @ X)):
            assert rel_err(a, ref) < 1e-5, C


def test_entry_groups_kernel_is_the_torch_form():
    """``phase1.entry_groups`` (a program per block of a segment's positions, two launches)
    gives exactly ``reference_groups``' split layout, on a plan with repeated slots and
    several blocks per segment."""
    from references import reference_groups
    from sdm_inductor.kernels import phase1
    ins, _, _ = _training_case(torch.bfloat16)
    pl = phase1.plan(ins.bank.shape[0], *(x.contiguous() for x in (
        ins.k_idx, ins.k_val, ins.beta, ins.g, ins.q_idx, ins.q_val)), 64)
    got, want = phase1.entry_groups(pl), reference_groups(pl, pack=2)
    for f in dataclasses.fields(phase1.Groups):
        assert torch.equal(getattr(got, f.name), getattr(want, f.name)), f.name


@pytest.mark.parametrize("C", [16, 64])
def test_dense_sources_are_the_sorted_ones(C):
    """``sources.chunk_start_sources``' dense table form gives exactly the sorted form and
    torch's ``searchsorted`` (``reference_sources``), with the default scan tiles and with
    tiles of a few chunks and columns (19 chunks at C=16: tiles that carry, a ragged last)."""
    from references import reference_sources
    from sdm_inductor.kernels import phase1
    from sdm_inductor.kernels.backward import sources
    ins, _, _ = _training_case(torch.bfloat16)
    S = ins.bank.shape[0]
    pl = phase1.plan(S, *(x.contiguous() for x in (
        ins.k_idx, ins.k_val, ins.beta, ins.g, ins.q_idx, ins.q_val)), C)
    ref = reference_sources(pl, S)
    assert (ref >= 0).any() and (ref < 0).any()
    assert torch.equal(sources.chunk_start_sources(pl, S, dense=False), ref)
    keep = sources.SCAN_SLOTS, sources.SCAN_CHUNKS
    try:
        for sb, cb in (keep, (32, 4)):
            sources.SCAN_SLOTS, sources.SCAN_CHUNKS = sb, cb
            assert torch.equal(sources.chunk_start_sources(pl, S, dense=True), ref), (sb, cb)
    finally:
        sources.SCAN_SLOTS, sources.SCAN_CHUNKS = keep


@pytest.mark.parametrize("dtype,mode,keep", [(torch.bfloat16, "none", 1),
                                              (torch.bfloat16, "none", 0),
                                              (torch.float32, "bf16", 1),
                                              (torch.bfloat16, "fp8", 1)])
def test_chunk_start_sources_match_the_column_walk(dtype, mode, keep):
    """The backward step walk reading its chunk-start rows from the final bank and a raw
    undo log (``kernels/backward/sources.py``), or restoring a working copy from an fp8 log, with
    the forward's ``v - r0`` kept or gathered again: the column walk's gradients to the
    oracle's tolerance, and the final bank as the forward returned it."""
    from sdm_inductor.kernels import host
    ins, dy, dM = _training_case(dtype)
    got = {}
    host.CONFIG["KEEP"] = keep   # (the autouse fixture restores CONFIG)
    for walk in ("step", "column"):
        host.CONFIG["WALK"] = walk
        leaves = ins.leaves()
        y, M, _, _ = _op(leaves, 64, mode=mode)
        final = M.detach().clone()
        grads = torch.autograd.grad((y, M), [leaves[i] for i in FLOAT_INPUTS], (dy, dM))
        assert torch.equal(M, final), "the backward changed the final bank"
        if walk == "step":
            assert ops.last_dispatch()["chunk_start_rows"] == ("restored" if mode == "fp8"
                                                               else "sources")
        got[walk] = grads
    # the two walks read a quantized log's rows at different points of their sums
    tol = max(TOL[dtype], SNAP_TOL[mode] or 0.0)
    for n, a, b in zip(NAMES, got["step"], got["column"]):
        _check(n, a, b, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_walk_graph_replays_are_bitwise_the_launches(dtype):
    """Eager step walks replayed from CUDA graphs (``kernels/runtime/graphs.py``, from the second
    time the same launches come) give bitwise the outputs and gradients of making every
    launch, in a training loop as benchmarks and training run it (the same leaves, each
    result dropped: the allocator hands out the same blocks); a call on other data gives
    its own results (a replay reads whatever its pointers hold now)."""
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.runtime import graphs
    ins, dy, dM = _training_case(dtype)
    leaves = ins.leaves()

    def step():
        y, M, _, _ = _op(leaves, 64)
        grads = torch.autograd.grad((y, M), [leaves[i] for i in FLOAT_INPUTS], (dy, dM))
        return [y.detach(), M.detach(), *grads]

    host.CONFIG["WALK_GRAPHS"] = 0
    want = step()
    host.CONFIG["WALK_GRAPHS"] = 1
    graphs.clear()
    before = dict(graphs.stats)
    # the allocator's cache as earlier tests left it may take a few calls to settle into
    # handing out the same blocks every call: start from an empty one, and let no tensor
    # of a call live into the next (a loop variable of the comparison would hold a call's
    # last gradient while the next call allocates), then run until both walks replayed a
    # graph recorded in an earlier call, at most 16 calls, every call checked
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    def replays(walk):   # replays of earlier calls' graphs (a recording call replays too)
        return (graphs.stats["replayed", walk] - before.get(("replayed", walk), 0)
                - graphs.stats["captured", walk] + before.get(("captured", walk), 0))

    def check(got):
        for n, a, b in zip(("readings", "final bank") + NAMES, got, want):
            assert torch.equal(a, b), n

    for _ in range(16):
        check(step())
        if replays("forward") >= 2 and replays("reverse") >= 2:
            break
    for walk in ("forward", "reverse"):
        changed = {k[:3]: graphs.differences(*keys) for k, keys in graphs.recent.items()
                   if k[0] == walk and len(keys) == 2}
        assert replays(walk) >= 2, (walk, changed)
    other = _inputs(dtype, P=2, T=300, W=16, R=8, hd=96, slots_per_stream=256,
                    per_write_gate=True, repeats=True, seed=99)
    got = _grads(other, 64, dy, dM)
    host.CONFIG["WALK_GRAPHS"] = 0
    ref = _grads(other, 64, dy, dM)
    for a, b in zip((got[0], got[1], *got[2]), (ref[0], ref[1], *ref[2])):
        assert torch.equal(a, b)


@pytest.mark.parametrize("walk", ["step", "column"])
def test_plan_graph_replays_are_bitwise_the_launches(walk):
    """A no-grad call's Phase 1 replayed from a CUDA graph (``graphs.made``, from the
    second call with the same inputs) gives bitwise the readings and bank of making its
    launches; a replay reads what its inputs hold now (indices and gates changed in place),
    with room for one graph two inputs taking turns each get their own results, and none
    kept once the room is 0."""
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.runtime import graphs
    host.CONFIG["WALK"] = walk
    one = _inputs(torch.bfloat16, P=2, T=300, W=16, R=8, hd=96, slots_per_stream=256,
                  per_write_gate=True, repeats=True)
    two = _inputs(torch.bfloat16, P=2, T=300, W=16, R=8, hd=96, slots_per_stream=256, seed=7)

    def call(ins):   # a fresh bank each call; the plan reads none of it
        y, M, _, _ = _op(ins, 64, save=False)
        return y, M

    def expected(ins):
        kept = host.CONFIG["PLAN_GRAPHS"]
        host.CONFIG["PLAN_GRAPHS"] = 0
        try:
            return call(ins)
        finally:
            host.CONFIG["PLAN_GRAPHS"] = kept

    def same(got, want):
        for name, a, b in zip(("readings", "final bank"), got, want):
            assert torch.equal(a, b), name

    host.CONFIG["PLAN_GRAPHS"] = 1
    graphs.clear()
    before = graphs.stats["replayed", "plan"]
    want = expected(one)
    for _ in range(4):
        same(call(one), want)
    assert graphs.stats["replayed", "plan"] - before >= 3   # recorded on the 2nd, then replayed
    with torch.no_grad():   # new data behind the same pointers
        one.k_idx.copy_(one.k_idx.flip(1))   # each stream's rows, in reverse token order
        one.g.mul_(0.5)
        one.beta.copy_(one.beta.flip(1))
    replayed = graphs.stats["replayed", "plan"]
    same(call(one), expected(one))
    assert graphs.stats["replayed", "plan"] == replayed + 1
    graphs.clear()   # room for one graph: the two inputs take turns
    want_one, want_two = expected(one), expected(two)
    for _ in range(3):
        same(call(one), want_one)
        same(call(two), want_two)
    assert graphs._made.graphs
    host.CONFIG["PLAN_GRAPHS"] = 0   # none: the kept graph goes, with its memory
    same(call(one), want_one)
    assert not graphs._made.graphs


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0),
                    reason="programmatic dependent launch needs sm_90")
@pytest.mark.parametrize("keep", [1, 0])
def test_launch_overlap_modes_are_bitwise_equal(keep):
    """``PDL`` 2 and 3 (launches that load or work before waiting for the one before,
    ``tiles._grid_dependency``) give bitwise the outputs and gradients of ``PDL=1`` (every
    launch waits before anything), with the forward's ``v - r0`` kept or gathered again."""
    from sdm_inductor.kernels import host
    ins = _inputs(torch.bfloat16, P=3, T=700, W=32, R=16, hd=192, slots_per_stream=512,
                  per_write_gate=True, repeats=True)
    dy = torch.randn(3, 700, 192, device="cuda").bfloat16()
    dM = torch.randn_like(ins.bank)
    host.CONFIG["KEEP"] = keep
    got = {}
    for pdl in (1, 2, 3):
        host.CONFIG["PDL"] = pdl
        y, M, grads = _grads(ins, 64, dy, dM)
        got[pdl] = (y, M, *grads)
    for pdl in (2, 3):
        for n, a, b in zip(("readings", "final bank") + NAMES, got[pdl], got[1]):
            assert torch.equal(a, b), f"PDL={pdl}: {n}"


def test_cuda_graph_capture_and_no_recompile():
    from sdm_inductor.kernels.backward import reverse_walk
    from sdm_inductor.kernels.forward import column_walk, step_walk
    from sdm_inductor.kernels.phase1 import entries, pairs
    kernels = (entries._prep_kernel, pairs._pairs_kernel, column_walk._forward_kernel,
               step_walk._step_gather_kernel, step_walk._step_mix_kernel,
               step_walk._step_write_kernel, reverse_walk._reverse_kernel)

    def n_compiled():
        return sum(len(c[0]) for k in kernels for c in k.device_caches.values())

    def call(ins, C=64):
        y, M, rows, scales, handed = torch.ops.sdm.triton_write_read(*ins, C, "none", True)
        grads = torch.ops.sdm.triton_write_read_backward(
            torch.ones_like(y), torch.ones_like(M), M, rows, scales, *ins[1:], C, "none", False,
            handed)
        return y, M, grads

    ins = _inputs(torch.bfloat16, P=2, T=100, W=8, R=8, hd=64, slots_per_stream=64)
    call(ins)
    count = n_compiled()
    for T in (37, 129, 256):
        call(_inputs(torch.bfloat16, P=2, T=T, W=8, R=8, hd=64, slots_per_stream=64))
    assert n_compiled() == count, "a new T compiled new kernels"

    static = _inputs(torch.bfloat16, P=2, T=100, W=8, R=8, hd=64, slots_per_stream=64, seed=9)
    want = call(static)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call(static)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(static)
    graph.replay()
    torch.cuda.synchronize()
    for x, y in zip((want[0], want[1], *want[2]), (out[0], out[1], *out[2])):
        assert torch.equal(x, y)


def test_token_windows_queued_ahead_of_the_gpu(monkeypatch):
    """A call over many token windows whose walks the GPU runs late (each held back by a
    sleep on the current stream) gives bitwise the readings and bank of a call on one
    stream. ``pipeline.ahead``'s side stream makes each window's plan in memory freed by
    earlier windows with no ``record_stream`` mark; only its wait for the current stream
    before each plan keeps it from overwriting a plan whose walk has yet to run."""
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.runtime import pipeline
    ins = _inputs(torch.bfloat16, P=2, T=640, W=16, R=8, hd=96, slots_per_stream=256,
                  per_write_gate=True, repeats=True)
    host.CONFIG.update(WINDOW_TOKENS=64, WALK_GRAPHS=0)
    monkeypatch.setitem(ops.CHECK_INDICES, "cuda", False)   # no host sync in the call
    want = _op(ins, 64, save=False)[:2]   # compiles what the calls below need
    walk = host.step_walk

    def late_walk(*args, **kw):
        torch.cuda._sleep(20_000_000)
        return walk(*args, **kw)
    monkeypatch.setattr(host, "step_walk", late_walk)
    for _ in range(3):
        got = _op(ins, 64, save=False)[:2]
        assert ops.last_dispatch()["windows"] == 10 and ops.last_dispatch()["walk"] == "step"
        for name, a, b in zip(("readings", "final bank"), got, want):
            assert torch.equal(a, b), name
    monkeypatch.setattr(pipeline, "overlaps", lambda device: False)   # one stream
    for name, a, b in zip(("readings", "final bank"), _op(ins, 64, save=False)[:2], want):
        assert torch.equal(a, b), name


def test_token_windows_under_cuda_graph_capture():
    """A captured eager call over several token windows keeps to one stream (the side
    stream of ``pipeline.ahead`` is for uncaptured calls) and replays to the uncaptured
    call's results, forward and backward."""
    from sdm_inductor.kernels import host
    ins = _inputs(torch.bfloat16, P=2, T=200, W=8, R=8, hd=64, slots_per_stream=64)
    args = tuple(ins)[1:]
    dy = torch.randn(2, 200, 64, device="cuda").bfloat16()
    dM = torch.randn_like(ins.bank)
    old = dict(host.CONFIG)
    host.CONFIG["TRAIN_WINDOW_TOKENS"] = 64

    def call():
        bank = ins.bank.clone()
        y, rows, scales = host.forward(bank, *args, 64, "none", True)
        return (y, bank) + tuple(host.backward(dy, dM, bank, rows, scales, *args, 64, "none",
                                               False))
    try:
        want = call()
        assert ops.last_dispatch()["windows"] == 4
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        graph.replay()
        torch.cuda.synchronize()
        for x, y in zip(want, out):
            assert torch.equal(x, y)
    finally:
        host.CONFIG.clear()
        host.CONFIG.update(old)


def test_triton_ops_match_eager_op():
    ins = _inputs(torch.float32, P=2, T=90, W=6, R=4, hd=32, slots_per_stream=64)
    y, M, rows, scales, _ = torch.ops.sdm.triton_write_read(*ins, 32, "fp8", True)
    y2, M2, rows2, scales2 = _op(ins, 32, mode="fp8")
    assert torch.equal(y, y2) and torch.equal(M, M2)
    assert rows.shape == rows2.shape and rows.dtype == rows2.dtype
    live = undo_log_rows_used(ins[1], 32)   # the log's other rows are unspecified
    assert torch.equal(scales[live], scales2[live]) and torch.equal(rows[live], rows2[live])


@pytest.mark.parametrize("walk", ["step", "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_gates_match_the_loop(walk, dtype):
    """Gates of -inf (a full forget) and -1e4, per token and per write: finite readings,
    bank and gradients, the loop's (Phase 1's prep kernel floors the gates it loads);
    the decode path and the gated op's computed gates (``a_raw`` of 1e4 and +inf) too."""
    from sdm_inductor import api
    from sdm_inductor.kernels import host
    from sdm_inductor.testing import gated_reference, with_gates
    host.CONFIG["WALK"] = walk
    for value, per_write in ((float("-inf"), False), (-1e4, True), (float("-inf"), True)):
        ins = with_gates(_inputs(dtype, P=2, T=150, W=8, R=4, hd=64, slots_per_stream=48,
                                 per_write_gate=per_write), value)
        dy = torch.randn(2, 150, 64, device="cuda")
        dM = torch.randn(ins.bank.shape, device="cuda")
        y_ref, M_ref, g_ref = reference_outputs(ins, (dy, dM))
        y, M, grads = _grads(ins, 64, dy, dM)
        assert rel_err(y, y_ref) <= TOL[dtype] and rel_err(M, M_ref) <= TOL[dtype]
        for n, a, b in zip(NAMES, grads, g_ref):
            assert rel_err(a, b) <= TOL[dtype] * 2, (value, per_write, n)
        short = with_gates(_inputs(dtype, P=2, T=6, W=8, R=4, hd=64, slots_per_stream=48,
                                   per_write_gate=per_write), value, every=2)
        y_ref, M_ref, _ = reference_outputs(short)
        y, M, _, _ = _op(short, 64, save=False)
        assert ops.last_dispatch()["kernel_path"] == "decode"
        assert rel_err(y, y_ref) <= TOL[dtype] and rel_err(M, M_ref) <= TOL[dtype]
    ins = _inputs(dtype, P=2, T=150, W=8, R=4, hd=64, slots_per_stream=48)
    gen = torch.Generator().manual_seed(3)
    b_raw, a_raw = torch.randn(2, 150, generator=gen), torch.randn(2, 150, generator=gen)
    a_raw[:, ::4] = 1e4
    a_raw[:, 1::9] = float("inf")
    raw = [t.cuda() for t in (b_raw, a_raw, torch.tensor([0.2, -0.1]), torch.tensor([0.5, 0.0]))]
    y_ref, M_ref, _ = gated_reference(ins, raw)
    y, M = api.write_read_gated(ins.bank, ins.k_idx, ins.k_val, ins.v, *raw, ins.q_idx,
                                ins.q_val, slots_per_stream=48)
    assert ops.last_dispatch()["gates"] == "prep-kernel"
    assert rel_err(y, y_ref) <= TOL[dtype] and rel_err(M, M_ref) <= TOL[dtype]


@pytest.mark.parametrize("walk", ["step", "auto"])
def test_nan_in_v_stays_in_its_stream_and_chunks(walk):
    """The documented reach of a non-finite input on CUDA: never other streams or
    earlier chunks (its own stream's later readings and written rows may all be NaN)."""
    from sdm_inductor.kernels import host
    host.CONFIG["WALK"] = walk
    ins = _inputs(torch.float32, P=2, T=150, W=8, R=4, hd=64, slots_per_stream=48)
    y0, M0, _, _ = _op(ins, 64, save=False)
    v = ins.v.clone()
    v[0, 70, 3] = float("nan")
    y, M, _, _ = _op(ins._replace(v=v), 64, save=False)
    assert torch.equal(y[1], y0[1]) and torch.equal(M[48:], M0[48:])
    assert torch.equal(y[0, :64], y0[0, :64])
    assert torch.isnan(y[0, 70]).any()
