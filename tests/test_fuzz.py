"""Hypothesis fuzz of the CPU op against the oracle over random shapes and options."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sdm_inductor
from sdm_inductor.testing import FLOAT_INPUTS, make_inputs, reference_outputs, rel_err


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
        seed=draw(st.integers(0, 2**30)),
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_fuzz_against_oracle(cfg):
    shared, C = cfg.pop("shared"), cfg.pop("chunk_size")
    ins = make_inputs(**cfg)
    P, T, hd = cfg["P"], cfg["T"], cfg["hd"]
    dy, dM = torch.randn(P, T, hd), torch.randn(ins.bank.shape)
    y0, M0, g0 = reference_outputs(ins, (dy, dM))
    leaves = ins.leaves()
    y, M = sdm_inductor.write_read(
        *leaves, chunk_size=C, shared_bank=shared,
        slots_per_stream=0 if shared else cfg["slots_per_stream"])
    assert y.shape == (P, T, hd) and M.shape == ins.bank.shape
    assert rel_err(y, y0) <= 1e-5 and rel_err(M, M0) <= 1e-5
    ((y * dy).sum() + (M * dM).sum()).backward()
    for i, ref in zip(FLOAT_INPUTS, g0):
        assert rel_err(leaves[i].grad, ref) <= 1e-4, i
