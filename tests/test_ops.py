"""The sdm op contract on CPU, against the token-loop oracle."""
from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

import sdm_inductor
from sdm_inductor.testing import FLOAT_INPUTS, make_inputs, reference_outputs, rel_err

GRAD_NAMES = ("memory", "k_val", "v", "beta", "g", "q_val")


def run_op(ins, dy, dM, **opts):
    """Functional op with gradients: (readings, final bank, six grads)."""
    leaves = ins.leaves()
    y, M = sdm_inductor.write_read(*leaves, **opts)
    ((y.float() * dy).sum() + (M.float() * dM).sum()).backward()
    return y.detach(), M.detach(), tuple(leaves[i].grad for i in FLOAT_INPUTS)


def check_against_oracle(ins, opts, fwd_tol, grad_tol):
    P, T = ins.k_idx.shape[:2]
    dy = torch.randn(P, T, ins.bank.shape[1])
    dM = torch.randn(ins.bank.shape)
    y0, M0, g0 = reference_outputs(ins, (dy, dM))
    y, M, grads = run_op(ins, dy, dM, **opts)
    assert rel_err(y, y0) <= fwd_tol, ("readings", rel_err(y, y0))
    assert rel_err(M, M0) <= fwd_tol, ("final bank", rel_err(M, M0))
    for name, i, a, b in zip(GRAD_NAMES, FLOAT_INPUTS, grads, g0):
        assert a.dtype == ins[i].dtype, name
        assert rel_err(a, b) <= grad_tol, (name, rel_err(a, b))


# (P, T, C, shared bank, per-write gate, index dtype): covers P in {1, 3}, own ranges and
# a shared bank, both gate widths, T in {1, C-1, C, 2C+5}, C in {16, 64, 256}, int32/int64
CASES = [
    (1, 1, 16, False, False, torch.int64),
    (1, 15, 16, False, True, torch.int32),
    (3, 16, 16, False, False, torch.int64),
    (3, 37, 16, True, True, torch.int64),
    (1, 63, 64, False, False, torch.int32),
    (3, 64, 64, True, False, torch.int32),
    (1, 133, 64, False, True, torch.int64),
    (1, 255, 256, False, False, torch.int64),
    (2, 256, 256, False, True, torch.int32),
    (1, 517, 256, True, False, torch.int64),
]


def _opts(P, C, shared, sph=24):
    return dict(chunk_size=C, slots_per_stream=0 if shared else sph, shared_bank=shared)


@pytest.mark.parametrize("P,T,C,shared,per_write,idx_dtype", CASES)
def test_fp32_matches_oracle(P, T, C, shared, per_write, idx_dtype):
    ins = make_inputs(P, T, W=4, R=3, hd=8, slots_per_stream=24, per_write_gate=per_write,
                      index_dtype=idx_dtype)
    check_against_oracle(ins, _opts(P, C, shared), 1e-5, 1e-4)


@pytest.mark.parametrize("P,T,C,shared,per_write", [(1, 40, 16, False, False),
                                                    (3, 70, 64, True, True)])
def test_bf16_bank_matches_oracle(P, T, C, shared, per_write):
    ins = make_inputs(P, T, W=4, R=3, hd=16, slots_per_stream=32, per_write_gate=per_write,
                      dtype=torch.bfloat16)
    check_against_oracle(ins, _opts(P, C, shared, 32), 2e-2, 2e-2)


def test_strong_gates_and_wide_slots():
    """Large decays (exp factors far from 1) and W, R up to 32 in one chunk."""
    ins = make_inputs(2, 50, W=32, R=32, hd=8, slots_per_stream=80, per_write_gate=True,
                      gate_scale=8.0)
    check_against_oracle(ins, _opts(2, 32, False, 80), 1e-5, 1e-4)


@pytest.mark.parametrize("per_write", [False, True])
def test_repeated_write_slots_dense_key_meaning(per_write):
    ins = make_inputs(2, 30, W=4, R=3, hd=8, slots_per_stream=24, per_write_gate=per_write,
                      repeats=True)
    n = sdm_inductor.repeated_write_slots(ins.k_idx)
    assert n == 2 * 15  # every other token repeats one slot
    check_against_oracle(ins, _opts(2, 16, False), 1e-5, 1e-4)
    assert sdm_inductor.repeated_write_slots() == n  # recorded by the last call
    clean = make_inputs(1, 10, seed=3)
    sdm_inductor.write_read(*clean, chunk_size=16)
    assert sdm_inductor.repeated_write_slots() == 0
    clean.k_idx[0, 0, 1] = clean.k_idx[0, 0, 0]   # counted on request: never a stale answer
    with pytest.raises(RuntimeError, match="modified in place"):
        sdm_inductor.repeated_write_slots()


# (P, T, shared bank, per-write gate, repeats, index dtype, bank dtype, gate set every few
# tokens): T up to DECODE_MAX_T, where no-grad calls run the token loop
SHORT = [
    (1, 1, False, False, False, torch.int64, torch.float32, None),
    (3, 1, True, True, True, torch.int32, torch.float32, None),
    (2, 5, False, True, True, torch.int64, torch.float32, float("-inf")),
    (3, 8, False, False, True, torch.int32, torch.float32, -1e4),
    (2, 8, True, True, False, torch.int64, torch.bfloat16, None),
]


@pytest.mark.parametrize("P,T,shared,per_write,repeats,idx_dtype,dtype,gate", SHORT)
def test_short_calls_without_gradients_run_the_token_loop(monkeypatch, P, T, shared,
                                                           per_write, repeats, idx_dtype,
                                                           dtype, gate):
    """A no-grad call of at most ``cpu.DECODE_MAX_T`` tokens (a decode step) runs the
    token loop (``cpu._decode``): the oracle's readings and bank (repeats with the
    dense-key meaning, full forgets), the chunked form's up to rounding; a call one token
    longer, or one that saves for a backward, takes the chunked form."""
    from sdm_inductor import cpu, ops
    from sdm_inductor.testing import with_gates
    assert T <= cpu.DECODE_MAX_T
    ins = make_inputs(P, T, W=4, R=3, hd=8, slots_per_stream=12, per_write_gate=per_write,
                      repeats=repeats, index_dtype=idx_dtype, dtype=dtype,
                      seed=T + 10 * P)
    if gate is not None:
        ins = with_gates(ins, gate, every=2)
    opts = _opts(P, 16, shared, sph=12)
    y0, M0, _ = reference_outputs(ins)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    outs = {}
    for path, limit in (("decode", cpu.DECODE_MAX_T), ("chunked", 0)):
        monkeypatch.setattr(cpu, "DECODE_MAX_T", limit)
        bank = ins.bank.clone()
        y = torch.ops.sdm.write_read_(bank, *ins[1:], **opts)
        assert ops.last_dispatch()["kernel_path"] == path
        assert rel_err(y, y0) <= tol and rel_err(bank, M0) <= tol, (path, rel_err(y, y0))
        outs[path] = (y, bank)
    for a, b in zip(outs["decode"], outs["chunked"]):
        assert rel_err(a, b) <= (1e-2 if dtype == torch.bfloat16 else 1e-6)
    monkeypatch.undo()
    longer = make_inputs(P, cpu.DECODE_MAX_T + 1, W=4, R=3, hd=8, slots_per_stream=12,
                         seed=1)
    torch.ops.sdm.write_read_(longer.bank.clone(), *longer[1:], **opts)
    assert ops.last_dispatch()["kernel_path"] == "chunked"
    sdm_inductor.write_read(*ins.leaves(), **opts)   # saves for a backward
    assert ops.last_dispatch()["kernel_path"] == "chunked"


def test_chunk_size_invariance():
    ins = make_inputs(2, 300, W=6, R=5, hd=8, slots_per_stream=40, per_write_gate=True)
    outs = [sdm_inductor.write_read(*ins, chunk_size=C, slots_per_stream=40)
            for C in (16, 48, 64, 256)]
    for y, M in outs[1:]:
        assert rel_err(y, outs[0][0]) < 1e-5 and rel_err(M, outs[0][1]) < 1e-5


def test_bitwise_deterministic():
    ins = make_inputs(3, 90, W=5, R=4, hd=8, slots_per_stream=20, per_write_gate=True,
                      repeats=True)
    dy, dM = torch.randn(3, 90, 8), torch.randn(60, 8)
    a = run_op(ins, dy, dM, chunk_size=32, slots_per_stream=20)
    b = run_op(ins, dy, dM, chunk_size=32, slots_per_stream=20)
    for x, y in zip((a[0], a[1], *a[2]), (b[0], b[1], *b[2])):
        assert torch.equal(x, y)


def test_inputs_untouched_by_functional_op():
    ins = make_inputs(1, 20)
    copies = [t.clone() for t in ins]
    sdm_inductor.write_read(*ins, chunk_size=16)
    assert all(torch.equal(a, b) for a, b in zip(ins, copies))


def test_in_place_op_marks_the_bank_modified():
    """``sdm::write_read_`` bumps the bank's version (its ADInplaceOrView kernel), also
    when the options come as keywords: autograd refuses a backward through a tensor the
    op advanced after it was saved, and the other inputs keep their versions."""
    ins = make_inputs(1, 20, slots_per_stream=64)
    x = ins.bank.clone().requires_grad_()
    bank = x * 1
    loss = (bank * bank).sum()   # saves bank for the backward
    versions = [t._version for t in ins[1:]]
    before = bank._version
    with torch.no_grad():
        torch.ops.sdm.write_read_(bank, *ins[1:], chunk_size=16, slots_per_stream=64,
                                  shared_bank=False)
    assert bank._version > before
    assert [t._version for t in ins[1:]] == versions
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("mode,tol", [("bf16", 1e-2), ("fp8", 6e-2), ("int4", 0.35)])
def test_snapshot_quant(mode, tol):
    """Quantized snapshots change only the backward, within the storage's precision."""
    ins = make_inputs(2, 60, W=4, R=3, hd=16, slots_per_stream=32)
    dy, dM = torch.randn(2, 60, 16), torch.randn(64, 16)
    y0, M0, g0 = run_op(ins, dy, dM, chunk_size=16, slots_per_stream=32)
    y, M, grads = run_op(ins, dy, dM, chunk_size=16, slots_per_stream=32, snapshot_quant=mode)
    assert torch.equal(y, y0) and torch.equal(M, M0)
    errs = [rel_err(a, b) for a, b in zip(grads, g0)]
    assert max(errs) <= tol, errs
    assert max(errs) > 0  # the stored rows really were quantized


def test_snapshot_bf16_on_bf16_bank_is_none():
    ins = make_inputs(1, 40, hd=16, dtype=torch.bfloat16)
    dy, dM = torch.randn(1, 40, 16), torch.randn(64, 16)
    a = run_op(ins, dy, dM, chunk_size=16)
    b = run_op(ins, dy, dM, chunk_size=16, snapshot_quant="bf16")
    assert all(torch.equal(x, y) for x, y in zip(a[2], b[2]))


def test_grad_bank_fp32():
    ins = make_inputs(1, 200, W=4, R=4, hd=16, slots_per_stream=16, dtype=torch.bfloat16)
    dy, dM = torch.randn(1, 200, 16), torch.randn(16, 16)
    _, _, g0 = reference_outputs(ins, (dy, dM))
    _, _, lo = run_op(ins, dy, dM, chunk_size=16)
    _, _, hi = run_op(ins, dy, dM, chunk_size=16, grad_bank_fp32=True)
    assert hi[0].dtype == torch.bfloat16
    assert rel_err(hi[0], g0[0]) <= 2e-2
    assert rel_err(hi[0], g0[0]) <= rel_err(lo[0], g0[0]) + 1e-3


def test_no_grad_saves_nothing():
    ins = make_inputs(1, 100)
    out = torch.ops.sdm.write_read(*ins, 16, 0, False, "none", False, False)
    assert out[2].numel() == 0 and out[3].numel() == 0
    ins = make_inputs(1, 100).leaves()
    out = torch.ops.sdm.write_read(*ins, 16, 0, False, "none", False, False)
    with pytest.raises(RuntimeError, match="save_for_backward=False"):
        out[0].sum().backward()


@pytest.mark.parametrize("used", ["readings", "final"])
def test_backward_of_one_output(used):
    """A loss of one output: the other's gradient is zero (materialized inside the
    backward, not by autograd); the undo log is not differentiable."""
    ins = make_inputs(2, 40, W=4, R=3, hd=8, slots_per_stream=24)
    dy = torch.randn(2, 40, 8) if used == "readings" else torch.zeros(2, 40, 8)
    dM = torch.randn(ins.bank.shape) if used == "final" else torch.zeros(ins.bank.shape)
    _, _, want = reference_outputs(ins, (dy, dM))
    leaves = ins.leaves()
    y, M, rows, scales = torch.ops.sdm.write_read(*leaves, 16, 24)
    assert not rows.requires_grad and not scales.requires_grad
    loss = (y * dy).sum() if used == "readings" else (M * dM).sum()
    grads = torch.autograd.grad(loss, [leaves[i] for i in FLOAT_INPUTS])
    for name, a, b in zip(GRAD_NAMES, grads, want):
        assert rel_err(a, b) <= 1e-5, (name, rel_err(a, b))


def test_forward_hands_kept_values_to_its_own_backward(monkeypatch):
    """``kept.keep_for_backward``: what an implementation's forward offers reaches the
    backward of that call only (through its autograd context), never another call's."""
    from sdm_inductor import cpu, kept, ops
    seen = []

    class Keeping:   # the CPU implementation, offering a marker per forward
        NAME = "cpu-keeping"
        n = 0

        def forward(self, *args):
            out = cpu.forward(*args)
            self.n += 1
            kept.keep_for_backward(out[0], f"call {self.n}")
            return out

        def backward(self, *args):
            seen.append(kept.kept_for_backward())
            return cpu.backward(*args)

    monkeypatch.setitem(ops.IMPLS, "cpu", Keeping())
    ins = make_inputs(1, 20, W=2, R=2, hd=4, slots_per_stream=8)
    y1 = torch.ops.sdm.write_read(*ins.leaves(), 16, 8)[0]
    with torch.no_grad():   # offers, but no autograd context takes it
        torch.ops.sdm.write_read(*ins, 16, 8)
    y3 = torch.ops.sdm.write_read(*ins.leaves(), 16, 8)[0]
    y3.sum().backward()
    y1.sum().backward()
    # the backward op called directly: nothing kept
    torch.ops.sdm.write_read_backward(
        torch.ones_like(y1), torch.zeros_like(ins.bank), ins.bank,
        *torch.ops.sdm.write_read(*ins, 16, 8)[2:], *tuple(ins)[1:], 16, "none", False)
    # called with a forward's own outputs and inputs, as a compiled graph calls it (no
    # autograd context): that forward's offer, found by its undo log's identity; none once
    # an input was modified in place, or for another forward's log
    k_val = ins.k_val.clone()
    args = (ins.bank, ins.k_idx, k_val, *tuple(ins)[3:])
    y, final, rows, scales = torch.ops.sdm.write_read(*args, 16, 8)   # call 5
    other = torch.ops.sdm.write_read(*args, 16, 8)[2]                 # call 6

    def backward(log):
        torch.ops.sdm.write_read_backward(torch.ones_like(y), torch.zeros_like(final), final,
                                          log, scales, *args[1:], 16, "none", False)
    backward(rows)
    backward(other)
    k_val.mul_(1.0)
    backward(rows)
    assert seen == ["call 3", "call 1", None, "call 5", None, None], seen


def _offer_markers(monkeypatch):
    """The CPU implementation, offering a fresh marker object per forward
    (``kept.keep_for_backward``): weak references to the markers, in call order, and for
    each backward whether it found something kept."""
    import weakref
    from sdm_inductor import cpu, kept, ops

    class Marker:
        pass
    refs, seen = [], []

    class Keeping:
        NAME = "cpu-keeping"

        def forward(self, *args):
            out = cpu.forward(*args)
            marker = Marker()
            refs.append(weakref.ref(marker))
            kept.keep_for_backward(out[0], marker)
            return out

        def backward(self, *args):
            seen.append(kept.kept_for_backward() is not None)
            return cpu.backward(*args)

    monkeypatch.setitem(ops.IMPLS, "cpu", Keeping())
    return refs, seen


def test_untaken_offer_lives_as_long_as_its_log(monkeypatch):
    """A forward called with no autograd context (as a compiled graph calls it) keeps its
    offer only while its undo log lives (found by the log's identity), not until the next
    call: with the readings and the log gone, what it kept is freed."""
    import gc
    from sdm_inductor import kept
    refs, _ = _offer_markers(monkeypatch)
    ins = make_inputs(1, 20, W=2, R=2, hd=4, slots_per_stream=8)
    y, final, rows, scales = torch.ops.sdm.write_read(*ins, 16, 8)
    del y
    gc.collect()
    assert refs[0]() is not None and kept.kept_by_log(rows, final, tuple(ins)[1:]) is refs[0]()
    del rows
    gc.collect()
    assert refs[0]() is None


def test_kept_values_are_freed_when_the_backward_ends(monkeypatch):
    """What a forward kept lives until its last backward ends, not as long as its graph
    (the readings still referenced, as a training loop holds its loss until the next
    step). A second backward through the retained graph finds it by the undo log, which
    the graph still holds, and gives the same gradients."""
    refs, seen = _offer_markers(monkeypatch)
    ins = make_inputs(1, 20, W=2, R=2, hd=4, slots_per_stream=8)
    leaves = ins.leaves()
    y = torch.ops.sdm.write_read(*leaves, 16, 8)[0]
    first = torch.autograd.grad(y.sum(), leaves[3], retain_graph=True)
    assert refs[0]() is not None   # the retained graph's undo log still keys it
    second = torch.autograd.grad(y.sum(), leaves[3])
    assert refs[0]() is None       # y and its graph still alive
    assert seen == [True, True] and torch.equal(first[0], second[0])


def test_block_bounded_working_memory(monkeypatch):
    """Phase 1 runs on blocks of chunks: results do not depend on the block size."""
    from sdm_inductor import cpu
    ins = make_inputs(2, 200, W=4, R=3, hd=8, slots_per_stream=24)
    y0, M0 = sdm_inductor.write_read(*ins, chunk_size=16, slots_per_stream=24)
    monkeypatch.setattr(cpu, "_BLOCK_ENTRIES", 2 * 16 * 4)  # one chunk per block
    y1, M1 = sdm_inductor.write_read(*ins, chunk_size=16, slots_per_stream=24)
    assert rel_err(y1, y0) < 1e-6 and rel_err(M1, M0) < 1e-6


# ------------------------------------------------------------------ the 2.0.0 interface

def test_sdm_write_read_in_place_flat_layout():
    ins = make_inputs(3, 21, W=4, R=3, hd=8, slots_per_stream=24, per_write_gate=True)
    y0, M0, _ = reference_outputs(ins)
    flat = [t.reshape(63, *t.shape[2:]) for t in ins[1:]]
    memory = ins.bank.clone()
    with torch.no_grad():
        y = sdm_inductor.sdm_write_read(memory, *flat, chunk_size=16, num_memory_slots=24,
                                        num_parallel=3, key_weighted_decay=True)
    assert y.shape == (63, 8)
    assert rel_err(y, y0.reshape(63, 8)) < 1e-5 and rel_err(memory, M0) < 1e-5


def test_sdm_write_read_gradients_reach_initial_memory():
    ins = make_inputs(2, 30, W=4, R=3, hd=8, slots_per_stream=24)
    dy, dM = torch.randn(60, 8), torch.zeros(48, 8)
    _, _, g0 = reference_outputs(ins, (dy.view(2, 30, 8), dM))
    memory, *rest = ins.leaves()
    before = memory.detach().clone()
    flat = [t.reshape(60, *t.shape[2:]) if i != 3 else t.reshape(60) for i, t in enumerate(rest)]
    y = sdm_inductor.sdm_write_read(memory, *flat, chunk_size=16, num_memory_slots=24,
                                    num_parallel=2)
    assert not torch.equal(memory.detach(), before)  # advanced in place
    (y * dy).sum().backward()
    assert rel_err(memory.grad, g0[0]) < 1e-4
    assert rel_err(rest[1].grad, g0[1]) < 1e-4 and rel_err(rest[4].grad, g0[4]) < 1e-4


def test_beta_and_g_flat_forms():
    ins = make_inputs(1, 20)
    ref = sdm_inductor.sdm_write_read(ins.bank.clone(), *[t[0] for t in ins[1:]], chunk_size=16)
    for beta, g in ((ins.beta[0][:, None], ins.g[0][:, 0]), (ins.beta[0], ins.g[0])):
        y = sdm_inductor.sdm_write_read(ins.bank.clone(), ins.k_idx[0], ins.k_val[0], ins.v[0],
                                        beta, g, ins.q_idx[0], ins.q_val[0], chunk_size=16)
        assert torch.equal(y, ref)


# ------------------------------------------------------------------ malformed calls

def _call(**over):
    ins = make_inputs(2, 12, W=4, R=3, hd=8, slots_per_stream=24)
    args = dict(zip(("memory", "k_idx", "k_val", "v", "beta", "g", "q_idx", "q_val"), ins))
    kw = dict(chunk_size=16, num_memory_slots=24, num_parallel=2)
    for k, v in over.items():
        if k in args:
            args[k] = v(args[k])
        else:
            kw[k] = v
    memory = args.pop("memory")
    before = memory.clone()
    return memory, before, lambda: sdm_inductor.sdm_write_read(memory, *args.values(), **kw)


BAD = [
    ("memory", dict(memory=lambda m: m.double()), "float32 or bfloat16"),
    ("memory", dict(memory=lambda m: m[None]), "2-D"),
    ("k_idx", dict(k_idx=lambda t: t.float()), "int32 or int64"),
    ("k_val", dict(k_val=lambda t: t[..., :3]), "shape"),
    ("v", dict(v=lambda t: t[..., :5]), "hd"),
    ("beta", dict(beta=lambda t: t[:, :5]), "one value per token"),
    ("beta", dict(beta=lambda t: t[..., None].expand(2, 12, 2)), "one value per token"),
    ("g", dict(g=lambda t: t.expand(2, 12, 3)), "W"),
    ("q_val", dict(q_val=lambda t: t[..., :2]), "like q_idx"),
    ("q_idx", dict(q_idx=lambda t: t.int().float()), "int32 or int64"),
    ("chunk_size", dict(chunk_size=8), "16..256"),
    ("chunk_size", dict(chunk_size=512), "16..256"),
    ("snapshot_quant", dict(snapshot_quant="fp4"), "one of"),
    ("num_memory_slots", dict(num_memory_slots=7), "divisor"),
    ("num_parallel", dict(num_memory_slots=12), "streams"),
    ("num_parallel", dict(num_parallel=5), "streams"),
    ("shared_bank", dict(num_memory_slots=0), "shared_bank"),
    ("g", dict(key_weighted_decay=True), "per write slot"),
    ("k_idx", dict(k_idx=lambda t: t + 24), "rows of stream"),
    # min - 1: always one row below stream 0's range (t - 1 missed when no read hit a
    # stream's first row, about 5% of random inputs)
    ("q_idx", dict(q_idx=lambda t: t - t.min() - 1), "rows of stream"),
]


@pytest.mark.parametrize("arg,over,msg", BAD, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(BAD)])
def test_malformed_call_refused_before_work(arg, over, msg):
    memory, before, call = _call(**over)
    with pytest.raises(ValueError, match=msg) as info:
        call()
    assert f"'{arg}'" in str(info.value)
    if memory.dtype == before.dtype and memory.shape == before.shape:
        assert torch.equal(memory, before)


def test_slots_per_token_limits():
    ins = make_inputs(1, 4, W=4)
    with pytest.raises(ValueError, match="'k_idx'.*1..256"):
        sdm_inductor.write_read(ins.bank, ins.k_idx[..., :0], ins.k_val[..., :0], *ins[3:],
                                chunk_size=16)
    wide = torch.zeros(1, 4, 257, dtype=torch.long)
    with pytest.raises(ValueError, match="'q_idx'.*1..256"):
        sdm_inductor.write_read(*ins[:6], wide, wide.float(), chunk_size=16)


def test_shared_bank_must_be_disjoint():
    ins = make_inputs(2, 10, W=4, R=3, hd=8, slots_per_stream=24)
    k_idx = ins.k_idx.clone()
    k_idx[1, 3, 0] = k_idx[0, 0, 1]  # stream 1 writes a row of stream 0
    bank = ins.bank.clone()
    with pytest.raises(ValueError, match="disjoint"):
        torch.ops.sdm.write_read_(bank, k_idx, *ins[2:], 16, 0, True)
    assert torch.equal(bank, ins.bank)


def test_index_checks_in_token_windows(monkeypatch):
    """The host-side checks look at a bounded window of tokens at a time (their working
    memory does not grow with T): positions past the first window are still found and
    reported with their global token, and repeats are counted over every window."""
    from sdm_inductor import validation
    monkeypatch.setattr(validation, "CHECK_WINDOW_TOKENS", 3)
    ins = make_inputs(2, 10, W=4, R=3, hd=8, slots_per_stream=24, repeats=True)
    assert sdm_inductor.repeated_write_slots(ins.k_idx) == 2 * 5
    k_idx = ins.k_idx.clone()
    k_idx[1, 7, 2] = 3                      # a row of stream 0, written by stream 1
    bank = ins.bank.clone()
    with pytest.raises(ValueError, match=r"'k_idx'.*3 at \[1, 7, 2\]"):
        torch.ops.sdm.write_read_(bank, k_idx, *ins[2:], 16, 24, False)
    q_idx = ins.q_idx.clone()
    q_idx[0, 8, 1] = k_idx[1, 4, 0]         # stream 0 reads a row stream 1 writes
    with pytest.raises(ValueError, match=r"disjoint.*at \[0, 8, 1\] also written by stream 1"):
        torch.ops.sdm.write_read_(bank, ins.k_idx, *ins[2:6], q_idx, ins.q_val, 16, 0, True)
    assert torch.equal(bank, ins.bank)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("sph", [24, 0])
@pytest.mark.parametrize("where,value", [((1, 9, 3), -1), ((0, 0, 0), 48), ((1, 4, 1), None)])
def test_out_of_range_index_named_at_its_place(dtype, sph, where, value):
    """One bad index anywhere (either end of the sequence, below or above the range) in
    either index dtype is found and named with its position, own ranges per stream (24)
    and one bank (0: [0, 48)). ``None``: a row that stream 0 writes, written by stream 1
    too: out of stream 1's own range, or in range but not disjoint on one bank."""
    ins = make_inputs(2, 10, W=4, R=3, hd=8, slots_per_stream=24, seed=5)
    k_idx = ins.k_idx.to(dtype).clone()
    q_idx = ins.q_idx.to(dtype)
    if value is None:
        value = int(k_idx[0, 0, 0])
    k_idx[where] = value
    bank = ins.bank.clone()
    call = lambda: torch.ops.sdm.write_read_(bank, k_idx, *ins[2:6], q_idx, ins.q_val, 16, sph,
                                             sph == 0)
    if not sph and 0 <= value < 48:
        with pytest.raises(ValueError, match="disjoint"):
            call()
    else:
        want = "rows of stream" if sph else r"bank rows in \[0, 48\)"
        with pytest.raises(ValueError, match=rf"'k_idx'.*{want}.*{value} at \[{where[0]}, "
                                             rf"{where[1]}, {where[2]}\]"):
            call()
    assert torch.equal(bank, ins.bank)


class _DeferringImpl:
    """The CPU implementation behind the interface of one that waits for the index check
    itself (like CUDA's ``host``): it queues its "Phase 1", then waits. With ``wait``
    False it stands for an implementation path that never waits and writes nothing
    (readings of zeros), like the T = 0 path."""
    AWAITS_INDEX_CHECK = True
    NAME = "deferring"

    def __init__(self, wait: bool):
        self.wait, self.seen = wait, []

    def forward(self, *args):
        from sdm_inductor import cpu, ops
        self.seen.append("phase 1")
        if self.wait:
            ops.await_index_check()
            self.seen.append("waited")
            return cpu.forward(*args)
        bank, k_idx = args[:2]
        P, T, W = k_idx.shape
        return (bank.new_zeros(P, T, bank.shape[1]), bank.new_empty(0, W, bank.shape[1]),
                bank.new_empty(0))


@pytest.mark.parametrize("wait", [True, False])
def test_index_check_awaited_by_the_implementation(monkeypatch, wait):
    """An implementation may run work that writes nothing before it waits for the call's
    index check (``ops.await_index_check``): the bad call is refused at the wait, before
    any write; a path that never waits is still refused when the op returns; no check is
    left behind for the next call."""
    from sdm_inductor import ops
    impl = _DeferringImpl(wait)
    monkeypatch.setitem(ops.IMPLS, "cpu", impl)
    ins = make_inputs(2, 10, W=4, R=3, hd=8, slots_per_stream=24, seed=3)
    k_idx = ins.k_idx.clone()
    k_idx[1, 6, 2] = 60
    with pytest.raises(ValueError, match=r"'k_idx'.*60 at \[1, 6, 2\]"):
        sdm_inductor.write_read(ins.bank, k_idx, *ins[2:], chunk_size=16, slots_per_stream=24)
    assert impl.seen == ["phase 1"]
    assert getattr(ops._PENDING, "check", None) is None
    bank = ins.bank.clone()
    if wait:   # in place: refused before the bank changes
        with pytest.raises(ValueError, match="'k_idx'"):
            torch.ops.sdm.write_read_(bank, k_idx, *ins[2:], 16, 24, False)
        assert torch.equal(bank, ins.bank)
    impl.seen.clear()
    y, _ = sdm_inductor.write_read(ins.bank, *ins[1:], chunk_size=16, slots_per_stream=24)
    if wait:
        assert impl.seen == ["phase 1", "waited"]
        assert rel_err(y, reference_outputs(ins)[0]) <= 1e-5
    else:
        assert impl.seen == ["phase 1"] and not y.any()


def test_device_mismatch_named():
    ins = make_inputs(1, 4)
    with pytest.raises(ValueError, match="'v'.*device"):
        sdm_inductor.write_read(ins.bank, ins.k_idx, ins.k_val, ins.v.to("meta"), *ins[4:],
                                chunk_size=16)


# ------------------------------------------------------------------ opcheck

OPCHECK_CONFIGS = [
    dict(P=1, T=5, W=2, R=2, per_write_gate=False),
    dict(P=2, T=19, W=3, R=4, per_write_gate=True),
    dict(P=3, T=33, W=4, R=1, per_write_gate=False, repeats=True),
]


@pytest.mark.parametrize("cfg", OPCHECK_CONFIGS)
def test_opcheck_write_read(cfg):
    ins = make_inputs(hd=4, slots_per_stream=16, **cfg)
    P = cfg["P"]
    opcheck(torch.ops.sdm.write_read.default, tuple(ins.leaves()),
            dict(chunk_size=16, slots_per_stream=16))
    opcheck(torch.ops.sdm.write_read_.default, tuple(ins), dict(chunk_size=16, slots_per_stream=16))
    opcheck(torch.ops.sdm.write_read.default, tuple(ins.leaves()),
            dict(chunk_size=16, slots_per_stream=0, shared_bank=P > 1, snapshot_quant="fp8"))


def test_opcheck_backward_op():
    ins = make_inputs(2, 20, W=3, R=2, hd=4, slots_per_stream=16)
    _, final, rows, scales = torch.ops.sdm.write_read(*ins, 16, 16)
    args = (torch.randn(2, 20, 4), torch.randn(32, 4), final, rows, scales, *ins[1:], 16, "none",
            False)
    opcheck(torch.ops.sdm.write_read_backward.default, args)


def test_backward_op_gates_strided():
    """Gates that are views of another layout (the layer's per-token gates of a
    ``[1, T, H]`` projection, per stream: ``[H, T]`` with strides ``(1, H)``): the fake
    impl gives their gradients the layout the implementation returns (contiguous), or a
    compiled backward fails its output's stride assertion."""
    ins = make_inputs(2, 20, W=3, R=2, hd=4, slots_per_stream=16)
    beta = ins.beta.t().contiguous().t()
    g = ins.g[..., 0].t().contiguous().t()[..., None]
    assert not beta.is_contiguous() and not g.is_contiguous()
    ins = ins._replace(beta=beta, g=g)
    _, final, rows, scales = torch.ops.sdm.write_read(*ins, 16, 16)
    args = (torch.randn(2, 20, 4), torch.randn(32, 4), final, rows, scales, *ins[1:], 16, "none",
            False)
    opcheck(torch.ops.sdm.write_read_backward.default, args)


BAD_BACKWARD = [  # (argument, index in the backward's args, replacement, message)
    ("grad_readings", 0, lambda a: a[:, :5], "readings' shape"),
    ("grad_final", 1, lambda a: a.double(), "float32 or bfloat16"),
    ("final_bank", 2, lambda a: a[:7], "final bank"),
    ("final_bank", 2, lambda a: a.bfloat16(), "final bank"),
    # a snapshot of W + R rows per token (an older layout) is refused by name
    ("saved_rows", 3, lambda a: torch.zeros(a.shape[0], 5, a.shape[2]), "undo log"),
    ("saved_rows", 3, lambda a: a[:0], "undo log"),
    ("saved_scales", 4, lambda a: torch.ones(3), "float32"),
    ("v", 7, lambda a: a[..., :3], "hd"),
    ("saved_rows", 12, lambda a: 64, "chunk_size=64"),   # chunk_size 64: another log shape
]


@pytest.mark.parametrize("arg,i,fix,msg", BAD_BACKWARD,
                         ids=[f"{a}-{n}" for n, (a, *_) in enumerate(BAD_BACKWARD)])
def test_malformed_backward_call_refused(arg, i, fix, msg):
    """``sdm::write_read_backward`` called by hand with what no forward produced: a clear
    error naming the argument (before any kernel reads a wrongly sized log)."""
    ins = make_inputs(2, 20, W=3, R=2, hd=4, slots_per_stream=16)
    _, final, rows, scales = torch.ops.sdm.write_read(*ins, 16, 16)
    args = [torch.randn(2, 20, 4), torch.randn(32, 4), final, rows, scales, *ins[1:], 16,
            "none", False]
    torch.ops.sdm.write_read_backward(*args)   # the well-formed call runs
    args[i] = fix(args[i])
    with pytest.raises(ValueError, match=msg) as info:
        torch.ops.sdm.write_read_backward(*args)
    assert f"'{arg}'" in str(info.value)


def test_opcheck_helpers():
    x = torch.randn(2, 5, 12, requires_grad=True)
    opcheck(torch.ops.sdm.split_heads.default, (x, 3))
    opcheck(torch.ops.sdm.merge_heads.default, (torch.randn(6, 5, 4, requires_grad=True), 3))
    opcheck(torch.ops.sdm.expand_bank.default, (torch.randn(7, 4, requires_grad=True), 3))


def test_heads_and_expand():
    x = torch.randn(2, 5, 12)
    s = torch.ops.sdm.split_heads(x, 3)
    assert s.shape == (6, 5, 4)
    assert torch.equal(s[1 * 3 + 2], x[1, :, 8:12])  # stream b*H + h
    assert torch.equal(torch.ops.sdm.merge_heads(s, 3), x)
    bank = torch.randn(7, 4, requires_grad=True)
    big = torch.ops.sdm.expand_bank(bank, 3)
    w = torch.randn(21, 4)
    (big * w).sum().backward()
    assert torch.allclose(bank.grad, w.view(3, 7, 4).sum(0))
    with pytest.raises(ValueError, match="'num_heads'"):
        torch.ops.sdm.split_heads(x, 5)


def test_banks_whose_rows_are_not_contiguous():
    """A column slice of a wider bank and a transposed bank on CPU, in place and functional
    with gradients, against the oracle (the CUDA implementation: the interpreter's
    ``strided_banks`` case and ``test_cuda.py``)."""
    from sdm_inductor.testing import check_strided_banks
    check_strided_banks(make_inputs(P=2, T=20, W=3, R=2, hd=16, slots_per_stream=24, seed=15),
                        16, 1e-5)
