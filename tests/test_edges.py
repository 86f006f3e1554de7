"""Edges of the contract on CPU: full-forget gates, empty sequences, non-finite inputs,
and errors that name each entry point's own arguments."""
from __future__ import annotations

import pytest
import torch

import sdm_inductor
from sdm_inductor import api, gates
from sdm_inductor.nn import SparseDeltaMemory
from sdm_inductor.testing import (FLOAT_INPUTS, gated_reference, make_inputs,
                                  reference_outputs, rel_err, with_gates)

GRAD_NAMES = ("bank", "k_val", "v", "beta", "g", "q_val")
INF = float("inf")
LOG_DECAY_FLOOR = gates.LOG_DECAY_FLOOR


def _against_oracle(ins, C, sph, fwd_tol=1e-5, grad_tol=1e-4):
    P, T = ins.k_idx.shape[:2]
    gen = torch.Generator().manual_seed(1)
    dy = torch.randn(P, T, ins.bank.shape[1], generator=gen)
    dM = torch.randn(ins.bank.shape, generator=gen)
    y0, M0, g0 = reference_outputs(ins, (dy, dM))
    leaves = ins.leaves()
    y, M = sdm_inductor.write_read(*leaves, chunk_size=C, slots_per_stream=sph)
    assert rel_err(y, y0) <= fwd_tol and rel_err(M, M0) <= fwd_tol
    ((y.float() * dy).sum() + (M.float() * dM).sum()).backward()
    for name, i, ref in zip(GRAD_NAMES, FLOAT_INPUTS, g0):
        assert rel_err(leaves[i].grad, ref) <= grad_tol, (name, rel_err(leaves[i].grad, ref))
    return leaves


# ------------------------------------------------------------------ full-forget gates

@pytest.mark.parametrize("value", [-INF, -1e4, -200.0, LOG_DECAY_FLOOR])
@pytest.mark.parametrize("per_write", [False, True])
def test_full_forget_gates_give_the_loop(value, per_write):
    """-inf (exp(g) = 0: the row is forgotten) and very negative finite gates: the loop's
    readings, bank and gradients (d/dg = 0 there), over several chunks and with a run of
    full forgets; -1e4 also keeps the precision of the small gates after it."""
    ins = with_gates(make_inputs(P=2, T=70, W=3, R=3, hd=5, slots_per_stream=8,
                                 per_write_gate=per_write, seed=3), value)
    for C in (16, 64):
        leaves = _against_oracle(ins, C, 8)
    g_grad = leaves[5].grad
    assert torch.isfinite(g_grad).all()
    forgets = ins.g <= LOG_DECAY_FLOOR
    assert forgets.any() and torch.equal(g_grad[forgets], torch.zeros_like(g_grad[forgets]))


def test_full_forget_bf16_and_in_place_api():
    ins = with_gates(make_inputs(P=1, T=40, W=4, R=3, hd=8, slots_per_stream=16, seed=4,
                                 dtype=torch.bfloat16), -INF)
    y0, M0, _ = reference_outputs(ins)
    y, M = sdm_inductor.write_read(*ins, chunk_size=16, slots_per_stream=16)
    assert rel_err(y, y0) <= 2e-2 and rel_err(M, M0) <= 2e-2
    memory = ins.bank.clone()
    y2 = sdm_inductor.sdm_write_read(memory, *ins[1:], chunk_size=16, num_memory_slots=16)
    assert torch.equal(y2, y) and torch.equal(memory, M)


def test_full_forget_exact_reset():
    """Right after a full forget of every written slot, a token's write starts from zero
    rows: its reading is what a fresh bank gives (the old bank leaves no trace)."""
    ins = make_inputs(P=1, T=20, W=2, R=2, hd=4, slots_per_stream=8, seed=5)
    g = ins.g.clone()
    g[0, 10] = -INF
    k_idx = ins.k_idx.clone()
    k_idx[0, 10] = k_idx[0, 9]          # token 10 rewrites token 9's rows
    q_idx = ins.q_idx.clone()
    q_idx[0, 10] = k_idx[0, 10]         # and reads them
    ins = ins._replace(g=g, k_idx=k_idx, q_idx=q_idx)
    y = sdm_inductor.write_read(*ins, chunk_size=16, slots_per_stream=8)[0]
    beta, kv, v, qv = ins.beta[0, 10], ins.k_val[0, 10], ins.v[0, 10], ins.q_val[0, 10]
    # from zero rows: delta = beta * v, each row = k * delta
    want = (qv[:, None] * kv[:, None] * beta * v).sum(0)
    torch.testing.assert_close(y[0, 10], want, rtol=1e-5, atol=1e-6)


def test_gated_op_with_saturated_forget_gates():
    """``a_raw`` of 1e4 (g ~ -1e4) and +inf (g = -inf) in the gated op: the loop's values,
    and gradients finite, 0 through a gate below the floor (never 0 * inf)."""
    ins = make_inputs(P=2, T=40, W=3, R=3, hd=5, slots_per_stream=8, seed=6)
    gen = torch.Generator().manual_seed(2)
    b_raw, a_raw = torch.randn(2, 40, generator=gen), torch.randn(2, 40, generator=gen)
    a_raw[:, ::4] = 1e4
    raw = (b_raw, a_raw, torch.tensor([0.2, -0.1]), torch.tensor([0.5, 0.0]))
    dy, dM = torch.randn(2, 40, 5, generator=gen), torch.randn(ins.bank.shape, generator=gen)
    y0, M0, g0 = gated_reference(ins, raw, (dy, dM))
    x = [t.clone().requires_grad_() for t in (ins.bank, ins.k_val, ins.v, ins.q_val, *raw)]
    y, M = api.write_read_gated(x[0], ins.k_idx, x[1], x[2], *x[4:], ins.q_idx, x[3],
                                chunk_size=16, slots_per_stream=8)
    assert rel_err(y, y0) <= 1e-5 and rel_err(M, M0) <= 1e-5
    torch.autograd.backward((y, M), (dy, dM))
    for t, ref in zip(x, g0):
        assert rel_err(t.grad, ref) <= 1e-4
    raw[1][:, 1] = INF
    y0, M0, _ = gated_reference(ins, raw)
    x = [t.clone().requires_grad_() for t in raw]
    y, M = api.write_read_gated(ins.bank, ins.k_idx, ins.k_val, ins.v, *x, ins.q_idx,
                                ins.q_val, chunk_size=16, slots_per_stream=8)
    assert rel_err(y, y0) <= 1e-5 and rel_err(M, M0) <= 1e-5
    torch.autograd.backward((y, M), (dy, dM))
    assert all(torch.isfinite(t.grad).all() for t in x)


def test_floor_grad_keeps_nan():
    d = torch.ones(5)
    g = torch.tensor([-INF, -1e4, LOG_DECAY_FLOOR, -1.0, float("nan")])
    assert gates.floor_grad(d, g).tolist()[:4] == [0.0, 0.0, 0.0, 1.0]
    assert gates.floor_grad(d, g)[4] == 1.0


# ------------------------------------------------------------------ non-finite inputs

def test_nan_in_v_stays_in_its_stream_and_chunks():
    """The documented reach of a non-finite input: it may spread to every later reading
    and written row of its stream (structural zeros of the chunk matrices meet it), never
    to other streams, earlier chunks, or rows no token of its stream writes after it."""
    ins = make_inputs(P=2, T=40, W=2, R=2, hd=4, slots_per_stream=16, seed=7)
    v = ins.v.clone()
    v[0, 20, 1] = float("nan")
    ins = ins._replace(v=v)
    y0, M0 = sdm_inductor.write_read(*make_inputs(P=2, T=40, W=2, R=2, hd=4,
                                                  slots_per_stream=16, seed=7),
                                     chunk_size=16, slots_per_stream=16)
    y, M = sdm_inductor.write_read(*ins, chunk_size=16, slots_per_stream=16)
    assert torch.equal(y[1], y0[1]) and torch.equal(M[16:], M0[16:])   # the other stream
    assert torch.equal(y[0, :16], y0[0, :16])                         # earlier chunks
    later = torch.zeros(16, dtype=torch.bool)
    later[ins.k_idx[0, 20:].reshape(-1)] = True
    assert torch.equal(M[:16][~later], M0[:16][~later])              # rows written before only
    assert torch.isnan(y[0, 20]).any()


# ------------------------------------------------------------------ calls with nothing to do

def _empty(P=2, hd=4, sph=16, W=2, R=2, flat=False):
    ins = make_inputs(P=P, T=0, W=W, R=R, hd=hd, slots_per_stream=sph, seed=8)
    return ins if not flat else ins._replace(**{
        n: t.reshape(0, *t.shape[2:]) for n, t in zip(ins._fields[1:], ins[1:])})


def _nothing_to_do(case):
    """Inputs (slots_per_stream 16) that move nothing: no tokens, no streams (a bank of
    two streams' rows, an empty batch), or zero-width rows."""
    if case == "no tokens":
        return _empty()
    if case == "no streams":
        ins = make_inputs(P=2, T=40, W=2, R=2, hd=4, slots_per_stream=16, seed=8)
        return ins._replace(**{n: t[:0] for n, t in zip(ins._fields[1:], ins[1:])})
    return make_inputs(P=2, T=40, W=2, R=2, hd=0, slots_per_stream=16, seed=8)


@pytest.mark.parametrize("case", ["no tokens", "no streams", "zero-width rows"])
@pytest.mark.parametrize("grad", [False, True])
def test_calls_with_nothing_to_do_every_entry_point(case, grad):
    """No tokens, no streams or zero-width rows: readings [P, T, hd] (empty), the bank
    unchanged (final bank = bank); with autograd, the bank's gradient is the final bank's
    and every other gradient zero."""
    ins = _nothing_to_do(case)
    P, T, W = ins.k_idx.shape
    hd, R = ins.bank.shape[1], ins.q_idx.shape[2]
    raw = (torch.zeros(P, T), torch.zeros(P, T), torch.zeros(P), torch.zeros(P))

    def functional(bank, k_val):
        return sdm_inductor.write_read(bank, ins.k_idx, k_val, *ins[3:], slots_per_stream=16)

    def gated(bank, k_val):
        return api.write_read_gated(bank, ins.k_idx, k_val, ins.v, *raw, ins.q_idx,
                                    ins.q_val, slots_per_stream=16)

    for call in (functional, gated):
        bank = ins.bank.clone().requires_grad_(grad)
        k_val = ins.k_val.clone().requires_grad_(grad)
        y, M = call(bank, k_val)
        assert y.shape == (P, T, hd) and torch.equal(M, ins.bank)
        if grad:
            dM = torch.randn_like(M)
            ((M * dM).sum() + y.sum()).backward()
            assert torch.equal(bank.grad, dM)
            assert k_val.grad is None or torch.equal(k_val.grad, torch.zeros(P, T, W))
    for flat in (False, True):
        e = _empty(flat=flat) if case == "no tokens" else ins
        if flat and case != "no tokens":
            e = e._replace(**{n: t.reshape(P * T, *t.shape[2:])
                              for n, t in zip(e._fields[1:], e[1:])})
        memory = e.bank.clone().requires_grad_(grad)
        # no streams: num_parallel=0, with the flat layout's no rows (T reads 0 there)
        y = sdm_inductor.sdm_write_read(memory, *e[1:], num_memory_slots=16, num_parallel=P)
        assert y.shape == ((P * T, hd) if flat else (P, T, hd))
        assert torch.equal(memory.detach(), e.bank)
    y = torch.ops.sdm.write_read_(ins.bank.clone(), *ins[1:], 64, 16)
    assert y.shape == (P, T, hd)
    y, M, rows, scales = torch.ops.sdm.write_read(*ins, 64, 16)
    assert torch.equal(M, ins.bank)
    grads = torch.ops.sdm.write_read_backward(
        torch.zeros(P, T, hd), torch.ones(32, hd), M, rows, scales, *ins[1:], 64, "none", False)
    assert torch.equal(grads[0], torch.ones(32, hd))
    assert [tuple(t.shape) for t in grads[1:]] == [(P, T, W), (P, T, hd), (P, T), (P, T, 1),
                                                   (P, T, R)]
    assert all(not t.any() for t in grads[1:])


@pytest.mark.parametrize("kw", [{}, dict(key_weighted_decay=True), dict(naive=True)])
def test_empty_sequence_layer(kw):
    layer = SparseDeltaMemory(16, num_heads=2, slots_per_head=16, top_k=4, **kw)
    x = torch.zeros(2, 0, 16, requires_grad=True)
    cache = layer.new_cache()
    y = layer(x, cache)
    assert y.shape == (2, 0, 16)
    assert torch.equal(cache.bank, layer.initial_bank(2)) and cache.seen_tokens == 0
    y.sum().backward()   # naive=True: no token connects x to y (x.grad stays None)
    assert (x.grad is None) == layer.naive and (layer.naive or x.grad.shape == (2, 0, 16))
    y = layer(torch.randn(2, 3, 16), cache)   # the empty call left a usable cache
    assert cache.seen_tokens == 3


@pytest.mark.parametrize("kw", [{}, dict(naive=True)])
def test_empty_batch_layer(kw):
    """A batch of no sequences: empty output, zero gradients for the parameters."""
    layer = SparseDeltaMemory(16, num_heads=2, slots_per_head=16, top_k=4, **kw)
    x = torch.randn(0, 5, 16, requires_grad=True)
    y = layer(x)
    assert y.shape == (0, 5, 16)
    y.sum().backward()   # naive=True: no stream connects x to y (x.grad stays None)
    assert (x.grad is None) == layer.naive and (layer.naive or x.grad.shape == (0, 5, 16))
    assert all(p.grad is None or not p.grad.any() for p in layer.parameters())


# ------------------------------------------------------------------ dtypes and names

@pytest.mark.parametrize("arg", ["k_val", "v", "q_val", "beta", "g"])
def test_integer_inputs_refused_before_any_cast(arg):
    ins = make_inputs(P=2, T=6, W=2, R=2, hd=4, slots_per_stream=16, seed=9)
    args = dict(zip(ins._fields, ins))
    args[arg] = args[arg].round().long()
    memory = args.pop("bank")
    before = memory.clone()
    with pytest.raises(sdm_inductor.SDMArgumentError, match=f"'{arg}'.*floating-point"):
        sdm_inductor.sdm_write_read(memory, *args.values(), num_memory_slots=16, num_parallel=2)
    with pytest.raises(sdm_inductor.SDMArgumentError, match=f"'{arg}'.*floating-point"):
        sdm_inductor.write_read(memory, *args.values(), slots_per_stream=16)
    assert torch.equal(memory, before)


OTHER_API = ("'memory'", "'num_memory_slots'", "'num_parallel'")


def _functional_errors():
    ins = make_inputs(P=2, T=6, W=2, R=2, hd=4, slots_per_stream=16, seed=10)
    calls = [
        lambda: sdm_inductor.write_read(ins.bank, *ins[1:], slots_per_stream=32),
        lambda: sdm_inductor.write_read(ins.bank, *ins[1:], slots_per_stream=8),
        lambda: sdm_inductor.write_read(ins.bank, *ins[1:], slots_per_stream=5),
        lambda: sdm_inductor.write_read(ins.bank, *ins[1:], slots_per_stream=-1),
        lambda: sdm_inductor.write_read(ins.bank, *ins[1:]),
        lambda: sdm_inductor.write_read(ins.bank.double(), *ins[1:], slots_per_stream=16),
        lambda: sdm_inductor.write_read(ins.bank, *ins[1:3], ins.v[..., :3], *ins[4:],
                                        slots_per_stream=16),
        lambda: torch.ops.sdm.write_read(ins.bank, *ins[1:], 64, 8),
        lambda: torch.ops.sdm.write_read_(ins.bank, *ins[1:], 64, 8),
        lambda: api.write_read_gated(ins.bank, ins.k_idx, ins.k_val, ins.v, torch.zeros(2, 6),
                                     torch.zeros(2, 6), torch.zeros(2), torch.zeros(2),
                                     ins.q_idx, ins.q_val, slots_per_stream=8),
    ]
    return calls


@pytest.mark.parametrize("i", range(10))
def test_functional_errors_name_its_own_arguments(i):
    with pytest.raises(sdm_inductor.SDMArgumentError) as info:
        _functional_errors()[i]()
    msg = str(info.value)
    assert not any(name in msg for name in OTHER_API), msg
    assert any(name in msg for name in ("'bank'", "'slots_per_stream'", "'shared_bank'", "'v'")), msg


def test_flat_layout_errors_quote_the_callers_shapes():
    """``sdm_write_read`` with ``[P*T, *]`` inputs checks their shapes in that layout, so the
    error quotes the shape passed, not the op's ``[P, T, *]`` view of it; an index error
    gives its position as [stream, token, entry]."""
    ins = make_inputs(P=2, T=5, W=4, R=3, hd=16, slots_per_stream=32, seed=12)
    flat = dict(zip(ins._fields[1:], (t.flatten(0, 1) for t in ins[1:])))
    bad = [("k_val", flat["k_val"][:, :3], r"'k_val'.*\[10, 4\].*got \[10, 3\]"),
           ("v", flat["v"][:, :8], r"'v'.*\[10, 16\] \(hd from the memory\), got \[10, 8\]"),
           ("q_val", flat["q_val"][:, :2], r"'q_val'.*\[10, 3\].*got \[10, 2\]"),
           ("g", torch.zeros(10, 3), r"'g'.*\[10, 4\] \(W = 4\), got \[10, 3\]"),
           ("beta", torch.zeros(9), r"'beta'.*\[10\].*got \[9\]"),
           ("k_idx", flat["k_idx"].index_fill(0, torch.tensor([7]), 999),
            r"'k_idx'.*999 at \[1, 2, 0\] \(stream, token, entry\)")]
    for name, value, msg in bad:
        memory = ins.bank.clone()
        with pytest.raises(sdm_inductor.SDMArgumentError, match=msg):
            sdm_inductor.sdm_write_read(memory, **dict(flat, **{name: value}),
                                        num_memory_slots=32, num_parallel=2)
        assert torch.equal(memory, ins.bank)
    with pytest.raises(sdm_inductor.SDMArgumentError, match="'num_parallel'.*0 only with no"):
        sdm_inductor.sdm_write_read(ins.bank.clone(), **flat, num_memory_slots=32, num_parallel=0)


def test_layout_helpers_refuse_by_name():
    """``split_heads`` / ``merge_heads`` / ``expand_bank`` refuse a malformed call with
    ``SDMArgumentError`` naming the argument (None too: a schema's Tensor takes it)."""
    x = torch.randn(2, 3, 12)
    for call, msg in ((lambda: torch.ops.sdm.split_heads(None, 2), "'x'.*NoneType"),
                      (lambda: torch.ops.sdm.merge_heads(x[0], 2), "'x'.*3-D.*shape \\[3, 12\\]"),
                      (lambda: torch.ops.sdm.split_heads(x, 5), "'num_heads'.*divisor.*got 5"),
                      (lambda: torch.ops.sdm.expand_bank(None, 2), "'bank'.*NoneType"),
                      (lambda: torch.ops.sdm.expand_bank(x[0], -1), "'batch'.*>= 0.*got -1")):
        with pytest.raises(sdm_inductor.SDMArgumentError, match=msg):
            call()


def test_streams_mismatch_named_per_interface():
    ins = make_inputs(P=2, T=6, W=2, R=2, hd=4, slots_per_stream=16, seed=11)
    with pytest.raises(sdm_inductor.SDMArgumentError, match="'slots_per_stream'.*16 for 2 streams"):
        sdm_inductor.write_read(ins.bank, *ins[1:], slots_per_stream=8)
    with pytest.raises(sdm_inductor.SDMArgumentError, match="'num_parallel'.*4 streams"):
        sdm_inductor.sdm_write_read(ins.bank.clone(), *ins[1:], num_memory_slots=8, num_parallel=2)
    with pytest.raises(sdm_inductor.SDMArgumentError, match="'memory'.*float32 or bfloat16"):
        sdm_inductor.sdm_write_read(ins.bank.double(), *ins[1:], num_memory_slots=16,
                                    num_parallel=2)


def test_layer_names_cache_and_x():
    layer = SparseDeltaMemory(16, num_heads=2, slots_per_head=16, top_k=4)
    other = SparseDeltaMemory(16, num_heads=4, slots_per_head=16, top_k=4)
    cache = other.new_cache()
    other(torch.randn(2, 3, 16), cache)
    with pytest.raises(sdm_inductor.SDMArgumentError, match="'cache'.*another layer"):
        layer(torch.randn(2, 3, 16), cache)
    cache.bank = layer.initial_bank(2).detach().bfloat16()
    with pytest.raises(sdm_inductor.SDMArgumentError, match="'cache'.*float32"):
        layer(torch.randn(2, 3, 16), cache)
    for x, msg in ((torch.randn(2, 3, 16).double(), "dtype torch.float32"),
                   (torch.randint(0, 3, (2, 3, 16)), "floating-point")):
        with pytest.raises(sdm_inductor.SDMArgumentError, match=f"'x'.*{msg}"):
            layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):   # autocast casts x itself
        assert layer(torch.randn(2, 3, 16).bfloat16()).shape == (2, 3, 16)


# ------------------------------------------------------------------ memory shared with the bank

def _arena(ins, gap):
    """The bank and ``v`` in one buffer: v's rows start ``gap`` rows after the bank's first
    row (``gap`` < bank rows: v is made of bank rows)."""
    S, hd = ins.bank.shape
    P, T = ins.k_idx.shape[:2]
    buf = torch.zeros(max(S, gap + P * T), hd)
    buf[:S] = ins.bank
    buf[gap:gap + P * T] = ins.v.reshape(P * T, hd)
    return buf, buf[:S], buf[gap:gap + P * T].view(P, T, hd)


def test_inputs_sharing_the_banks_memory_refused_by_the_in_place_calls():
    """An in-place call reads its inputs as the tokens come: one that shares the bank's
    memory would see the bank's writes. Refused, naming it, before the bank changes; the
    functional form (which writes a copy) takes it; memory apart in one buffer is fine."""
    ins = make_inputs(P=2, T=6, W=2, R=2, hd=4, slots_per_stream=16, seed=12)
    buf, bank, v = _arena(ins, gap=4)
    before = buf.clone()
    with pytest.raises(sdm_inductor.SDMArgumentError, match="'v'.*apart from the bank"):
        torch.ops.sdm.write_read_(bank, ins.k_idx, ins.k_val, v, *ins[4:], 64, 16)
    with pytest.raises(sdm_inductor.SDMArgumentError, match="'v'.*apart from the memory"):
        sdm_inductor.sdm_write_read(bank, ins.k_idx, ins.k_val, v, *ins[4:], num_memory_slots=16,
                                    num_parallel=2)
    assert torch.equal(buf, before)
    y, M = sdm_inductor.write_read(bank, ins.k_idx, ins.k_val, v, *ins[4:], slots_per_stream=16)
    y1, M1 = sdm_inductor.write_read(bank.clone(), ins.k_idx, ins.k_val, v.clone(), *ins[4:],
                                     slots_per_stream=16)
    assert torch.equal(y, y1) and torch.equal(M, M1)
    y0, M0 = sdm_inductor.write_read(*ins, slots_per_stream=16)
    buf, bank, v = _arena(ins, gap=32)           # v right after the bank: apart
    y = torch.ops.sdm.write_read_(bank, ins.k_idx, ins.k_val, v, *ins[4:], 64, 16)
    assert torch.equal(y, y0) and torch.equal(bank, M0)


def test_banks_whose_elements_share_memory_refused_by_the_in_place_calls():
    """An expanded bank (a zero stride) cannot be written in place: refused, naming it as
    the caller spells it, before any work; the functional form takes it."""
    ins = make_inputs(P=2, T=6, W=2, R=2, hd=4, slots_per_stream=16, seed=12)
    bank = ins.bank[:1].expand_as(ins.bank)
    with pytest.raises(sdm_inductor.SDMArgumentError,
                       match=r"'bank'.*memory of their own.*strides \[0, 1\]"):
        torch.ops.sdm.write_read_(bank, *ins[1:], 64, 16)
    with pytest.raises(sdm_inductor.SDMArgumentError, match="'memory'.*memory of their own"):
        sdm_inductor.sdm_write_read(bank, *ins[1:], num_memory_slots=16, num_parallel=2)
    y, M = sdm_inductor.write_read(bank, *ins[1:], slots_per_stream=16)
    y0, M0 = sdm_inductor.write_read(bank.clone(), *ins[1:], slots_per_stream=16)
    assert torch.equal(y, y0) and torch.equal(M, M0)


def test_integer_options_take_what_the_ops_take():
    """numpy and 0-d tensor integers work in the Python interface as in the ops; a bool
    is not a stream count."""
    np = pytest.importorskip("numpy")
    ins = make_inputs(P=2, T=20, W=2, R=2, hd=4, slots_per_stream=16, seed=13)
    y0 = sdm_inductor.sdm_write_read(ins.bank.clone(), *ins[1:], chunk_size=16,
                                     num_memory_slots=16, num_parallel=2)
    for box in (np.int64, torch.tensor):
        y = sdm_inductor.sdm_write_read(ins.bank.clone(), *ins[1:], chunk_size=box(16),
                                        num_memory_slots=box(16), num_parallel=box(2))
        assert torch.equal(y, y0)
    flat = [t.flatten(0, 1) for t in ins[1:]]
    with pytest.raises(sdm_inductor.SDMArgumentError, match="'num_parallel'.*got True"):
        sdm_inductor.sdm_write_read(ins.bank.clone(), *flat, num_parallel=True)


def _option_calls(ins, flat):
    """Each Python-interface entry point as ``call(**options)`` on valid tensors."""
    raw = (torch.zeros(2, 6), torch.zeros(2, 6), torch.zeros(2), torch.zeros(2))
    return {
        "write_read": lambda **kw: sdm_inductor.write_read(
            ins.bank, *ins[1:], **{"slots_per_stream": 16, **kw}),
        "write_read_gated": lambda **kw: api.write_read_gated(
            ins.bank, *ins[1:4], *raw, *ins[6:], **{"slots_per_stream": 16, **kw}),
        "sdm_write_read": lambda **kw: sdm_inductor.sdm_write_read(
            ins.bank, *flat, num_parallel=2, **{"num_memory_slots": 16, **kw}),
    }


# (option, value, entry points; None: all three) the ops' schemas would take or turn into
# something else: 1 / 0 / None for a flag, True for an int
BAD_OPTIONS = [
    ("shared_bank", None, None), ("shared_bank", 1, None), ("shared_bank", "yes", None),
    ("grad_bank_fp32", "yes", None), ("grad_bank_fp32", None, None),
    ("chunk_size", True, None), ("chunk_size", 64.0, None), ("chunk_size", 2**70, None),
    ("snapshot_quant", None, None), ("snapshot_quant", 3, None),
    ("slots_per_stream", True, ("write_read", "write_read_gated")),
    ("slots_per_stream", 2**70, ("write_read", "write_read_gated")),
    ("num_memory_slots", True, ("sdm_write_read",)),
    ("key_weighted_decay", "x", ("sdm_write_read",)),
]


@pytest.mark.parametrize("option,value,entries", BAD_OPTIONS,
                         ids=[f"{o}={v!r}" for o, v, _ in BAD_OPTIONS])
def test_python_interface_options_refused_by_name(option, value, entries):
    """Options of the wrong type are refused naming the option, not cast by an op's schema
    (a bool's 0 / 1 / None, True as 1) or left unread (``grad_bank_fp32`` of a call
    without gradients)."""
    ins = make_inputs(P=2, T=6, W=2, R=2, hd=4, slots_per_stream=16, seed=14)
    before = ins.bank.clone()
    for name, call in _option_calls(ins, [t.flatten(0, 1) for t in ins[1:]]).items():
        if entries is not None and name not in entries:
            continue
        with pytest.raises(sdm_inductor.SDMArgumentError, match=f"'{option}'") as info:
            call(**{option: value})
        assert repr(value)[:12] in str(info.value), (name, str(info.value))
    assert torch.equal(ins.bank, before)


@pytest.mark.parametrize("arg", ["bank", "k_idx", "v", "beta", "g", "q_val"])
def test_non_tensor_inputs_refused_by_name(arg):
    """A missing or non-tensor input is named by every entry point; the ops take None for
    a ``Tensor`` argument from Python, so their own check must catch it."""
    ins = make_inputs(P=2, T=6, W=2, R=2, hd=4, slots_per_stream=16, seed=15)
    args = dict(zip(ins._fields, ins))
    args[arg] = None
    before = ins.bank.clone()
    calls = [lambda: sdm_inductor.write_read(*args.values(), slots_per_stream=16)]
    if arg != "bank":   # a schema refuses None for the mutated bank itself
        calls += [lambda: torch.ops.sdm.write_read(*args.values(), 64, 16),
                  lambda: torch.ops.sdm.write_read_(*args.values(), 64, 16)]
    for call in calls:
        with pytest.raises(sdm_inductor.SDMArgumentError, match=f"'{arg}'.*a tensor"):
            call()
    assert torch.equal(ins.bank, before)


def test_forward_mode_ad_refused_not_zero():
    """torch gives a custom op without a forward-mode rule zero tangents without a word:
    every entry point refuses an input that carries a tangent, naming it."""
    import torch.autograd.forward_ad as fwAD
    ins = make_inputs(P=2, T=20, W=2, R=2, hd=4, slots_per_stream=16, seed=14)

    def readings(v):
        return sdm_inductor.write_read(ins.bank, ins.k_idx, ins.k_val, v, *ins[4:],
                                       slots_per_stream=16)[0]

    with pytest.raises(NotImplementedError, match="'v'.*forward-mode"):
        torch.func.jvp(readings, (ins.v,), (torch.ones_like(ins.v),))
    layer = SparseDeltaMemory(16, num_heads=2, slots_per_head=16, top_k=4)
    x = torch.randn(2, 3, 16)
    with pytest.raises(NotImplementedError, match="forward-mode"):
        torch.func.jvp(layer, (x,), (torch.ones_like(x),))
    bank = ins.bank.clone()
    with fwAD.dual_level():
        v = fwAD.make_dual(ins.v, torch.ones_like(ins.v))
        with pytest.raises(NotImplementedError, match="'v'.*forward-mode"):
            torch.ops.sdm.write_read_(bank, ins.k_idx, ins.k_val, v, *ins[4:], 64, 16)
        with pytest.raises(NotImplementedError, match="'memory'.*forward-mode"):
            sdm_inductor.sdm_write_read(fwAD.make_dual(bank, torch.ones_like(bank)),
                                        *ins[1:], num_memory_slots=16, num_parallel=2)
    assert torch.equal(bank, ins.bank)
