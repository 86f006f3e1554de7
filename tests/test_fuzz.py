"""Hypothesis fuzz of the CPU op against the oracle over random shapes and options,
including empty sequences and full-forget gates (-inf, -1e4); and of malformed calls of
every entry point (refused naming the argument, or computed right where the contract
accepts the change)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import sdm_inductor
from sdm_inductor.gates import LOG_DECAY_FLOOR
from sdm_inductor.testing import FLOAT_INPUTS, make_inputs, reference_outputs, rel_err, with_gates


@st.composite
def configs(draw):
    P = draw(st.integers(1, 3))
    W = draw(st.integers(1, 6))
    return dict(
        P=P, T=draw(st.integers(0, 70)), W=W, R=draw(st.integers(1, 6)),
        hd=draw(st.sampled_from([1, 3, 8])),
        slots_per_stream=draw(st.integers(W, W + 20)),
        per_write_gate=draw(st.booleans()), repeats=draw(st.booleans()),
        shared=draw(st.booleans()) and P > 1,
        chunk_size=draw(st.sampled_from([16, 17, 32, 64])),
        index_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        # a gate value set on every few tokens: none, a full forget, a saturated one
        extreme=draw(st.sampled_from([None, float("-inf"), -1e4])),
        every=draw(st.integers(1, 7)),
        seed=draw(st.integers(0, 2**30)),
    )


EMPTY = dict(P=2, T=0, W=3, R=2, hd=3, slots_per_stream=5, per_write_gate=False,
             repeats=False, shared=False, chunk_size=16, index_dtype=torch.int64,
             extreme=None, every=1, seed=0)


def _most_forgets_in_a_chunk(g, C: int) -> int:
    """The most tokens of one chunk of one stream whose gate is a full forget."""
    P, T = g.shape[:2]
    if not P * T:
        return 0
    floored = (g <= LOG_DECAY_FLOOR).any(-1).float()
    pad = -T % C
    per_chunk = torch.nn.functional.pad(floored, (0, pad)).view(P, -1, C).sum(-1)
    return int(per_chunk.max())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
@example(EMPTY)
@example(dict(EMPTY, T=40, extreme=float("-inf"), every=3, per_write_gate=True))
@example(dict(EMPTY, T=20, hd=0))          # zero-width rows: nothing moves
@example(dict(EMPTY, P=0, T=20))
def test_fuzz_against_oracle(cfg):
    cfg = dict(cfg)
    shared, C = cfg.pop("shared"), cfg.pop("chunk_size")
    extreme, every = cfg.pop("extreme"), cfg.pop("every")
    ins = make_inputs(**cfg)
    if extreme is not None and cfg["T"] > 0:
        ins = with_gates(ins, extreme, every)
    P, T, hd = cfg["P"], cfg["T"], cfg["hd"]
    gen = torch.Generator().manual_seed(cfg["seed"])   # the example decides everything
    dy, dM = torch.randn(P, T, hd, generator=gen), torch.randn(ins.bank.shape, generator=gen)
    y0, M0, g0 = reference_outputs(ins, (dy, dM))
    leaves = ins.leaves()
    y, M = sdm_inductor.write_read(
        *leaves, chunk_size=C, shared_bank=shared,
        slots_per_stream=0 if shared else cfg["slots_per_stream"])
    assert y.shape == (P, T, hd) and M.shape == ins.bank.shape
    # floored gates (gates.LOG_DECAY_FLOOR): each full forget of a slot earlier in its
    # chunk adds about 1e-5 relative error (docs/spec.md, input ranges; at most 1.1e-5
    # forward and 1.2e-5 in the gradients over 1,500 such examples): the tolerances grow
    # with the most forgets in a chunk
    forgets = _most_forgets_in_a_chunk(ins.g, C)
    fwd_tol, grad_tol = (max(5e-5, 2e-5 * forgets), max(2e-4, 4e-5 * forgets)) \
        if extreme is not None else (1e-5, 1e-4)
    # readings whose terms cancel (read weights of both signs) are known to fp32 only as
    # well as the token loop itself knows them in fp32: the op within 4x of that
    y32, M32, _ = reference_outputs(ins, compute_dtype=torch.float32)
    assert rel_err(y, y0) <= max(fwd_tol, 4 * rel_err(y32, y0))
    assert rel_err(M, M0) <= max(fwd_tol, 4 * rel_err(M32, M0))
    with torch.no_grad():   # saves nothing; up to cpu.DECODE_MAX_T tokens: the token loop
        y_ng, M_ng = sdm_inductor.write_read(
            *ins, chunk_size=C, shared_bank=shared,
            slots_per_stream=0 if shared else cfg["slots_per_stream"])
    assert rel_err(y_ng, y0) <= max(fwd_tol, 4 * rel_err(y32, y0))
    assert rel_err(M_ng, M0) <= max(fwd_tol, 4 * rel_err(M32, M0))
    ((y * dy).sum() + (M * dM).sum()).backward()
    for i, ref in zip(FLOAT_INPUTS, g0):
        # a gradient whose terms cancel (dg of one token, O(1) terms summing to ~1e-5) is
        # known to fp32 only absolutely: 1e-6 is ~10 fp32 roundings of its O(1) terms
        err = float((leaves[i].grad.double() - ref).abs().max()) if ref.numel() else 0.0
        assert rel_err(leaves[i].grad, ref) <= grad_tol or err <= 1e-6, (i, err)


# ------------------------------------------------------------------ malformed calls

CALL_NAMES = ("bank", "k_idx", "k_val", "v", "beta", "g", "q_idx", "q_val")
FLOAT_NAMES = ("k_val", "v", "beta", "g", "q_val")
# how the 2.0.0 interface spells the arguments the others call otherwise
API20 = {"bank": "memory", "slots_per_stream": "num_memory_slots"}
T_FUZZ = 11


def _entries(P: int):
    """name -> call(tensors as [P, T, *] in CALL_NAMES order, options) -> readings."""
    def flat(t):
        return t.flatten(0, 1) if isinstance(t, torch.Tensor) and t.dim() >= 2 \
            and tuple(t.shape[:2]) == (P, T_FUZZ) else t

    def api20(ts, o):
        o = dict(o)   # the caller's options stay as they are
        o["num_memory_slots"] = o.pop("slots_per_stream")
        return sdm_inductor.sdm_write_read(ts[0], *map(flat, ts[1:]), num_parallel=P, **o)

    return {
        "write_read_": lambda ts, o: torch.ops.sdm.write_read_(
            *ts, chunk_size=o["chunk_size"], slots_per_stream=o["slots_per_stream"],
            shared_bank=o["shared_bank"]),
        "ops.write_read": lambda ts, o: torch.ops.sdm.write_read(
            *ts, o["chunk_size"], o["slots_per_stream"], o["shared_bank"], o["snapshot_quant"],
            o["grad_bank_fp32"], False)[0],
        "write_read": lambda ts, o: sdm_inductor.write_read(*ts, **o)[0],
        "sdm_write_read": api20,
    }


def _mutations(name, t, S):
    """(label, value, valid): ``valid`` mutations must give the oracle's result, the others
    an SDMArgumentError (``"named"``: naming ``name``; ``"any"``: naming some argument, as
    a shape that disagrees with another argument's may be blamed on either)."""
    out = [("None", None, "named")]
    if name in FLOAT_NAMES:
        out += [("int64", t.round().long(), "named"), ("bool", t > 0, "named"),
                ("float64", t.double(), "valid"), ("float16", t.half(), "valid"),
                ("bfloat16", t.bfloat16(), "valid")]
    elif name == "bank":
        out += [("float64", t.double(), "named"), ("float16", t.half(), "named"),
                ("3-D", t[None], "named"), ("bfloat16", t.bfloat16(), "valid")]
    else:   # indices
        out += [("float32", t.float(), "named"), ("int32", t.int(), "valid"),
                ("row -1", _poke(t, -1), "named"), ("row S", _poke(t, S), "named"),
                ("row 2**40", _poke(t, 2**40), "named")]
    if t.dim() >= 2:
        out += [("transposed copy", t.mT.contiguous().mT, "valid"),
                ("one dim less", t[..., 0], "any"), ("one row more", torch.cat([t, t[..., :1]], -1), "any"),
                ("a token less", t[:, 1:], "any")]
    if name in FLOAT_NAMES or name == "bank":
        out.append(("expanded", t[..., :1].expand(t.shape), "valid"))
    return out


def _poke(t, value):
    u = t.clone()
    u.view(-1)[u.numel() // 2] = value
    return u


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_malformed_calls_refused_by_name_or_computed_right(data):
    """One argument of a valid call of each entry point changed at random: a malformed
    call raises SDMArgumentError naming an argument as the entry point spells it (the
    changed one where only it can be at fault) with the bank untouched; a change the
    contract accepts (other float dtypes, strides, int32 indices) gives the oracle's
    readings and bank."""
    P, W, R, hd, sps = data.draw(st.integers(1, 2)), 3, 2, 4, 16
    ins = make_inputs(P, T_FUZZ, W=W, R=R, hd=hd, slots_per_stream=sps,
                      per_write_gate=data.draw(st.booleans()), seed=data.draw(st.integers(0, 999)))
    entry = data.draw(st.sampled_from(sorted(_entries(P))))
    name = data.draw(st.sampled_from(CALL_NAMES))
    t = dict(zip(CALL_NAMES, ins))[name]
    _check_mutation(P, sps, ins, entry, name,
                    *data.draw(st.sampled_from(_mutations(name, t, P * sps))))


@pytest.mark.parametrize("name", ("bank",) + FLOAT_NAMES)
def test_expanded_inputs_reach_every_entry_point(name):
    """Every entry point given one input with zero strides (``t[..., :1].expand``, as
    given, not a dense copy): the oracle's result, or for a bank written in place a refusal
    naming it with the bank untouched."""
    P, sps = 2, 16
    ins = make_inputs(P, T_FUZZ, W=3, R=2, hd=4, slots_per_stream=sps, per_write_gate=True,
                      seed=5)   # (per-write gates: g has a last dimension to expand)
    t = dict(zip(CALL_NAMES, ins))[name]
    (label, value, kind), = [m for m in _mutations(name, t, P * sps) if m[0] == "expanded"]
    assert 0 in value.stride()
    for entry in sorted(_entries(P)):
        _check_mutation(P, sps, ins, entry, name, label, value, kind)


def _check_mutation(P, sps, ins, entry, name, label, value, kind):
    """Call ``entry`` with ``ins`` but ``name`` replaced by ``value`` (mutation ``label``
    of kind ``kind``, ``_mutations``) and check the result or the refusal."""
    entries = _entries(P)
    # every tensor a copy (a call may write the bank, and value stays the input as given),
    # but an expanded one, which reaches the call with its zero strides (a clone would be
    # dense): the in-place entries must refuse such a bank, the functional ones copy it
    ts = [value if n == name and label == "expanded" else
          value.clone() if n == name and isinstance(value, torch.Tensor) else
          value if n == name else x.clone() for n, x in zip(CALL_NAMES, ins)]
    before = ts[0].clone() if isinstance(ts[0], torch.Tensor) else None
    options = dict(chunk_size=16, slots_per_stream=sps, shared_bank=False, snapshot_quant="none",
                   grad_bank_fp32=False)
    call = entries[entry]
    spell = (lambda n: API20.get(n, n)) if entry == "sdm_write_read" else (lambda n: n)
    note = f"{entry}: {name} {label}"
    if entry == "sdm_write_read" and name == "g" and label == "one dim less":
        kind, value = "valid", value[..., None]   # the 2.0.0 interface's per-token g [P, T]
    if name == "bank" and label == "expanded" and entry in ("write_read_", "sdm_write_read"):
        kind = "named"   # written in place: its elements must not share memory
    if kind == "valid":
        y = call(ts, options)
        ref = ins._replace(**{name: value.to(torch.float64) if value.is_floating_point() else value})
        y0, M0, _ = reference_outputs(ref._replace(bank=before.double()))
        tol = 2e-2 if ts[0].dtype == torch.bfloat16 or label in ("float16", "bfloat16") else 1e-5
        assert rel_err(y.reshape(y0.shape), y0) <= tol, note
        if entry in ("write_read_", "sdm_write_read"):
            assert rel_err(ts[0], M0) <= tol, note
        return
    with pytest.raises((sdm_inductor.SDMArgumentError, RuntimeError)) as info:
        call(ts, options)
    msg = str(info.value)
    # a torch.ops schema refuses a non-tensor itself (RuntimeError naming the argument),
    # except None, which it passes to the op
    assert isinstance(info.value, sdm_inductor.SDMArgumentError) or (
        entry in ("write_read_", "ops.write_read") and label != "None"
        and f"argument '{name}'" in msg), (note, msg)
    names = [name] if kind == "named" else [*CALL_NAMES, "slots_per_stream", "num_parallel"]
    assert any(f"'{spell(n)}'" in msg for n in names), (note, msg)
    if before is not None and ts[0].shape == before.shape and ts[0].dtype == before.dtype:
        assert torch.equal(ts[0], before), note
