"""``sdm::write_read_gated``: the gate prologue inside the op.

``beta = sigmoid(b)`` and ``g = -exp(A_log) * softplus(a + dt_bias)`` from the raw gate
inputs, computed inside the op (on CUDA by Phase 1's prep kernel). Checked against
``sdm::write_read`` fed the same gates computed with torch, against the float64 oracle,
with opcheck, malformed calls, the prep kernel under ``TRITON_INTERPRET=1`` (subprocess,
like ``test_kernels_interpret.py``), on CUDA when there is a GPU, and the layer under
``torch.compile``.
"""
from __future__ import annotations

import os
import re
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import sdm_inductor  # noqa: F401  (registers the ops)
from sdm_inductor import SDMArgumentError, gates
from sdm_inductor.reference import sdm_write_read_reference
from sdm_inductor.testing import gated_reference, make_inputs, rel_err, undo_log_rows_used

HERE = os.path.dirname(os.path.abspath(__file__))
GRAD_NAMES = ("bank", "k_val", "v", "b_raw", "a_raw", "A_log", "dt_bias", "q_val")


def raw_gates(P, T, layout="streams", seed=0, dtype=torch.float32, device="cpu"):
    """Raw gate inputs: ``[P, T]`` ("streams") or ``[B, T, H]`` with ``B * H = P``
    ("tokens", a projection's output; ``H = 2``). ``a`` spans the softplus threshold
    and its small-value tail."""
    gen = torch.Generator().manual_seed(seed)
    shape = (P, T) if layout == "streams" else (P // 2, T, 2)
    b = torch.randn(shape, generator=gen) * 2
    a = torch.randn(shape, generator=gen) * 8
    a.view(-1)[:4] = torch.tensor([25.0, -30.0, 20.5, -19.0])
    A_log = torch.empty(P).uniform_(-1.5, 0.5, generator=gen)
    dt_bias = torch.randn(P, generator=gen)
    return tuple(t.to(device=device, dtype=dtype) for t in (b, a, A_log, dt_bias))


def gated_args(ins, raw):
    b, a, A_log, dt_bias = raw
    return (ins.bank, ins.k_idx, ins.k_val, ins.v, b, a, A_log, dt_bias, ins.q_idx, ins.q_val)


def torch_path(ins, raw, **opts):
    """The same computation as sdm::write_read_gated, with the gates as torch ops."""
    beta, g = gates.torch_gates(*raw)
    return torch.ops.sdm.write_read(ins.bank, ins.k_idx, ins.k_val, ins.v, beta, g, ins.q_idx,
                                    ins.q_val, **opts)


def leaves(ins, raw):
    return (ins.leaves(), tuple(t.detach().clone().requires_grad_() for t in raw))


def grads_of(fn, ins, raw, dy, dM):
    ins, raw = leaves(ins, raw)
    y, M = fn(ins, raw)[:2]
    loss = (y.float() * dy.float()).sum() + (M.float() * dM.float()).sum()
    wrt = [ins.bank, ins.k_val, ins.v, *raw, ins.q_val]
    return y, M, torch.autograd.grad(loss, wrt)


# ------------------------------------------------------------------ CPU: against write_read

@pytest.mark.parametrize("layout", ["streams", "tokens"])
@pytest.mark.parametrize("T", [5, 37])
def test_matches_write_read_with_torch_gates_fp32(layout, T):
    ins = make_inputs(P=4, T=T, W=3, R=2, hd=8, slots_per_stream=16, repeats=True, seed=T)
    raw = raw_gates(4, T, layout, seed=T)
    opts = dict(chunk_size=16, slots_per_stream=16)
    y, M, rows, scales = torch.ops.sdm.write_read_gated(*gated_args(ins, raw), **opts)
    assert sdm_inductor.last_dispatch()["gates"] == "torch"
    y0, M0, rows0, scales0 = torch_path(ins, raw, **opts)
    assert rel_err(y, y0) <= 1e-6 and rel_err(M, M0) <= 1e-6, (rel_err(y, y0), rel_err(M, M0))
    assert torch.equal(rows, rows0) and torch.equal(scales, scales0)


def test_matches_write_read_with_torch_gates_bf16():
    ins = make_inputs(P=4, T=40, W=4, R=3, hd=16, slots_per_stream=16, dtype=torch.bfloat16,
                      seed=3)
    raw = raw_gates(4, 40, "tokens", seed=3, dtype=torch.bfloat16)
    opts = dict(chunk_size=16, slots_per_stream=16)
    y, M = torch.ops.sdm.write_read_gated(*gated_args(ins, raw), **opts)[:2]
    y0, M0 = torch_path(ins, raw, **opts)[:2]
    assert y.dtype == M.dtype == torch.bfloat16
    assert rel_err(y, y0) <= 2e-2 and rel_err(M, M0) <= 2e-2
    # and the float64 oracle with the gates of the same bf16 raw inputs
    beta, g = gates.torch_gates(*(t.double() for t in raw))
    y_ref, M_ref = sdm_write_read_reference(ins.bank, ins.k_idx, ins.k_val, ins.v, beta, g,
                                            ins.q_idx, ins.q_val, compute_dtype=torch.float64)
    assert rel_err(y, y_ref) <= 2e-2 and rel_err(M, M_ref) <= 2e-2


def test_torch_gates_are_the_layer_formulas():
    b, a, A_log, dt_bias = raw_gates(4, 9, "tokens", seed=5)
    beta, g = gates.torch_gates(b, a, A_log, dt_bias)
    # per [B, T, H] like the layer, then to streams p = b * H + h
    Ah, dh = A_log.view(2, 1, 2), dt_bias.view(2, 1, 2)
    want_g = -torch.exp(Ah) * F.softplus(a + dh)
    # (vectorised and strided loops may round the last bit differently)
    assert rel_err(beta, torch.sigmoid(b).permute(0, 2, 1).reshape(4, 9)) <= 1e-7
    assert rel_err(g[..., 0], want_g.permute(0, 2, 1).reshape(4, 9)) <= 1e-7


@pytest.mark.parametrize("layout", ["streams", "tokens"])
def test_gradients_match_autograd_through_torch_gates(layout):
    ins = make_inputs(P=4, T=37, W=3, R=2, hd=8, slots_per_stream=16, seed=8)
    raw = raw_gates(4, 37, layout, seed=8)
    opts = dict(chunk_size=16, slots_per_stream=16)
    dy, dM = torch.randn(4, 37, 8), torch.randn_like(ins.bank)
    got = grads_of(lambda i, r: torch.ops.sdm.write_read_gated(*gated_args(i, r), **opts),
                   ins, raw, dy, dM)
    want = grads_of(lambda i, r: torch_path(i, r, **opts), ins, raw, dy, dM)
    for name, a, b in zip(GRAD_NAMES, got[2], want[2]):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert rel_err(a, b) <= 1e-5, (name, rel_err(a, b))
        assert b.abs().sum() > 0, name   # every gradient is exercised


def test_gradients_match_oracle_tiny():
    """Float64 autograd through the oracle token loop with torch gates: the whole chain."""
    ins = make_inputs(P=2, T=7, W=2, R=2, hd=4, slots_per_stream=8, seed=9)
    raw = raw_gates(2, 7, "tokens", seed=9)
    dy, dM = torch.randn(2, 7, 4), torch.randn_like(ins.bank)

    def oracle(i, r):
        beta, g = gates.torch_gates(*r)
        return sdm_write_read_reference(*(t.double() if t.is_floating_point() else t
                                          for t in (i.bank, i.k_idx, i.k_val, i.v, beta, g,
                                                    i.q_idx, i.q_val)))

    got = grads_of(lambda i, r: torch.ops.sdm.write_read_gated(
        *gated_args(i, r), chunk_size=16, slots_per_stream=8), ins, raw, dy, dM)
    want = grads_of(oracle, ins, raw, dy, dM)
    assert rel_err(got[0], want[0]) <= 1e-5 and rel_err(got[1], want[1]) <= 1e-5
    for name, a, b in zip(GRAD_NAMES, got[2], want[2]):
        assert rel_err(a, b) <= 1e-4, (name, rel_err(a, b))


def test_full_forget_from_an_infinite_A_log_has_finite_gradients():
    """``A_log = inf`` makes ``g = -inf`` for its stream: a full forget, whose gradients are
    finite (spec section 4) and none flows to that stream's gate inputs; the other
    streams match the oracle (whose ``0 * inf`` gives NaN there)."""
    ins = make_inputs(P=4, T=9, W=3, R=2, hd=8, slots_per_stream=16, seed=31)
    b, a, A_log, dt_bias = raw_gates(4, 9, seed=31)
    A_log[1] = float("inf")
    leaves = [t.clone().requires_grad_(True) for t in (ins.bank, ins.k_val, ins.v, b, a, A_log,
                                                        dt_bias, ins.q_val)]
    y, M = sdm_inductor.api.write_read_gated(leaves[0], ins.k_idx, *leaves[1:7], ins.q_idx,
                                             leaves[7], slots_per_stream=16)
    gen = torch.Generator().manual_seed(2)
    dy, dM = torch.randn(y.shape, generator=gen), torch.randn(M.shape, generator=gen)
    grads = torch.autograd.grad((y * dy).sum() + (M * dM).sum(), leaves)
    for name, grad in zip(GRAD_NAMES, grads):
        assert torch.isfinite(grad).all(), name
    d_a, d_A_log, d_dt = grads[4], grads[5], grads[6]
    assert not d_a[1].any() and d_A_log[1] == 0 and d_dt[1] == 0
    y_ref, M_ref, g_ref = gated_reference(ins, (b, a, A_log, dt_bias), (dy, dM))
    assert rel_err(y, y_ref) <= 1e-5 and rel_err(M, M_ref) <= 1e-5
    keep = torch.tensor([0, 2, 3])   # the oracle's a_raw / dt_bias gradients: NaN at stream 1
    assert rel_err(d_a[keep], g_ref[5][keep]) <= 1e-5
    assert rel_err(d_dt[keep], g_ref[7][keep]) <= 1e-5


def test_api_saves_only_when_a_gradient_is_needed():
    ins = make_inputs(P=2, T=20, W=2, R=2, hd=4, slots_per_stream=8, seed=4)
    raw = raw_gates(2, 20, seed=4)
    y, M = sdm_inductor.api.write_read_gated(*gated_args(ins, raw), chunk_size=16,
                                             slots_per_stream=8)
    y0, M0 = torch_path(ins, raw, chunk_size=16, slots_per_stream=8)[:2]
    assert torch.equal(y, y0) and torch.equal(M, M0)
    out = torch.ops.sdm.write_read_gated(*gated_args(ins, raw), 16, 8, False, "none", False,
                                         False)
    assert out[2].numel() == 0
    with pytest.raises(RuntimeError, match="save_for_backward=False"):
        b = raw[0].clone().requires_grad_()
        y = torch.ops.sdm.write_read_gated(*gated_args(ins, (b, *raw[1:])), 16, 8, False,
                                           "none", False, False)[0]
        y.sum().backward()


# ------------------------------------------------------------------ opcheck, malformed calls

@pytest.mark.parametrize("layout", ["streams", "tokens"])
def test_opcheck_write_read_gated(layout):
    ins = make_inputs(P=2, T=19, W=3, R=2, hd=4, slots_per_stream=16, seed=2)
    ins, raw = leaves(ins, raw_gates(2, 19, layout, seed=2))
    opcheck(torch.ops.sdm.write_read_gated.default, gated_args(ins, raw),
            dict(chunk_size=16, slots_per_stream=16))
    opcheck(torch.ops.sdm.write_read_gated.default, gated_args(ins, raw),
            dict(chunk_size=16, slots_per_stream=0, shared_bank=True, snapshot_quant="fp8"))


def _bad_call(**over):
    ins = make_inputs(P=4, T=6, W=2, R=2, hd=4, slots_per_stream=8, seed=1)
    b, a, A_log, dt_bias = raw_gates(4, 6, seed=1)
    args = dict(zip(("bank", "k_idx", "k_val", "v", "b_raw", "a_raw", "A_log", "dt_bias",
                     "q_idx", "q_val"), gated_args(ins, (b, a, A_log, dt_bias))))
    args.update(over)
    bank = args["bank"].clone()
    with pytest.raises(SDMArgumentError) as e:
        torch.ops.sdm.write_read_gated(*args.values(), chunk_size=16, slots_per_stream=8)
    assert torch.equal(args["bank"], bank)
    return str(e.value)


@pytest.mark.parametrize("over, arg, msg", [
    (dict(b_raw=torch.randn(4, 5)), "b_raw", "one value per token"),
    (dict(b_raw=torch.randn(3, 6, 2)), "b_raw", "B * H = 4"),
    (dict(b_raw=torch.randn(4, 6, 1)), "a_raw", "the shape of b_raw"),
    (dict(a_raw=torch.randn(4, 6, 2)), "a_raw", "the shape of b_raw"),
    (dict(a_raw=torch.ones(4, 6, dtype=torch.long)), "a_raw", "floating-point"),
    (dict(A_log=torch.randn(2)), "A_log", "one value per stream"),
    (dict(dt_bias=torch.randn(4, 1)), "dt_bias", "one value per stream"),
    (dict(dt_bias=torch.randn(4, device="meta")), "dt_bias", "device cpu"),
    (dict(v=torch.randn(4, 6, 3)), "v", "hd"),
    (dict(k_idx=torch.full((4, 6, 2), 99)), "k_idx", "rows of stream"),
])
def test_malformed_calls_name_the_argument(over, arg, msg):
    text = _bad_call(**over)
    assert f"argument '{arg}'" in text and msg in text, text


def test_malformed_call_refused_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        ins = make_inputs(P=2, T=6, W=2, R=2, hd=4, slots_per_stream=8, seed=1)
        with pytest.raises(SDMArgumentError, match="'A_log'"):
            torch.ops.sdm.write_read_gated(ins.bank, ins.k_idx, ins.k_val, ins.v,
                                           torch.randn(2, 6), torch.randn(2, 6), torch.randn(3),
                                           torch.randn(2), ins.q_idx, ins.q_val, 16, 8)


# ------------------------------------------------------------------ the layer

def _layer(**kw):
    from sdm_inductor.nn import SparseDeltaMemory
    torch.manual_seed(0)
    layer = SparseDeltaMemory(32, num_heads=2, head_dim=8, slots_per_head=16, top_k=4,
                              key_dim=8, chunk_size=16, **kw)
    with torch.no_grad():
        layer.memory.normal_()
        layer.A_log.uniform_(-2, 0)
    return layer


def _layer_with_torch_gates(layer, x):
    """The layer's previous op path: gates as torch ops, then write_read."""
    B, T, _ = x.shape
    r, M = sdm_inductor.api.write_read(layer.initial_bank(B), *layer._streams(x),
                                       chunk_size=16, slots_per_stream=16)
    y = r.view(B, 2, T, 8).transpose(1, 2).reshape(B, T, -1).to(x.dtype)
    if layer.gate_proj is not None:
        y = y * F.silu(layer.gate_proj(x))
    return layer.o_proj(y), M


def test_layer_uses_the_gated_op_and_matches_the_torch_gate_path():
    layer = _layer(output_gate=True)
    x = torch.randn(2, 37, 32, requires_grad=True)
    y = layer(x)
    assert sdm_inductor.last_dispatch()["gates"] == "torch"   # the gated op ran (CPU)
    y0, _ = _layer_with_torch_gates(layer, x)
    assert rel_err(y, y0) <= 1e-6
    dy = torch.randn_like(y)
    params = [x, layer.A_log, layer.dt_bias, layer.a_proj.weight, layer.b_proj.weight,
              layer.b_proj.bias, layer.memory]
    for a, b in zip(torch.autograd.grad(y, params, dy), torch.autograd.grad(y0, params, dy)):
        assert rel_err(a, b) <= 1e-5


def test_layer_key_weighted_decay_keeps_write_read():
    layer = _layer(key_weighted_decay=True)
    with torch.no_grad():
        layer(torch.randn(2, 20, 32))
    assert "gates" not in sdm_inductor.last_dispatch()
    assert sdm_inductor.last_dispatch()["per_write_gate"]


@pytest.mark.compile
def test_layer_compiled_matches_eager():
    layer = _layer(output_gate=True)
    x = torch.randn(2, 37, 32, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    y = compiled(x)
    y0 = layer(x)
    assert rel_err(y, y0) <= 1e-5, rel_err(y, y0)
    dy = torch.randn_like(y)
    params = [x, layer.A_log, layer.dt_bias, layer.a_proj.weight, layer.b_proj.bias]
    for a, b in zip(torch.autograd.grad(y, params, dy), torch.autograd.grad(y0, params, dy)):
        assert rel_err(a, b) <= 1e-5, rel_err(a, b)


# ------------------------------------------------------------------ kernels under the interpreter

def _job(item) -> dict:
    """The case's subprocess (``tests/conftest.py`` starts it with the session)."""
    case = item.callspec.params["case"]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.path.dirname(HERE),
               OMP_NUM_THREADS="1")
    return dict(argv=[sys.executable, os.path.abspath(__file__), case], env=env, timeout=600,
                cost=dict(forward=21, prep=8)[case], warm=True)


@pytest.mark.background(job=_job)
@pytest.mark.parametrize("case", ["forward", "prep"])
def test_gated_kernels_under_interpreter(case, background):
    pytest.importorskip("triton")
    res = background()
    assert res.returncode == 0, f"case {case} failed:\n{res.stdout}\n{res.stderr[-4000:]}"


def case_prep():
    """Phase 1's prep kernel in gated mode against ungated mode fed torch's gates: same
    dense keys, masks and sort keys, the same gates and padded beta (fp32 rounding)."""
    from sdm_inductor.kernels import phase1
    ins = make_inputs(P=4, T=21, W=4, R=3, hd=8, slots_per_stream=16, repeats=True, seed=21)
    for layout, dtype in (("streams", torch.float32), ("tokens", torch.float32),
                          ("tokens", torch.bfloat16)):
        b, a, A_log, dt_bias = raw_gates(4, 21, layout, seed=22, dtype=dtype)
        if layout == "tokens":   # strided views: read in place
            b = torch.randn(2, 21, 5).to(dtype)[..., 1:3].copy_(b)
            a = a.transpose(0, 1).contiguous().transpose(0, 1)
        beta, g = gates.torch_gates(b, a, A_log, dt_bias)
        S = ins.bank.shape[0]
        from sdm_inductor.kernels.host import raw_gate_layout
        got = phase1.prep(S, ins.k_idx, ins.k_val, raw_gate_layout(b), raw_gate_layout(a),
                          ins.q_idx, ins.q_val, 16, (A_log, dt_bias))
        # (the ungated kernel takes contiguous gates, as host.forward_once makes them)
        want = phase1.prep(S, ins.k_idx, ins.k_val, beta.contiguous(), g.contiguous(),
                           ins.q_idx, ins.q_val, 16)
        for name, x, y in zip(("slot", "val", "gate", "key", "first"), got[:5], want[:5]):
            if name == "gate":
                err = (x - y).abs().max().item()
                assert err <= 1e-6 * max(1.0, y.abs().max().item()), (layout, name, err)
            else:
                assert torch.equal(x, y), (layout, name)
        assert got[5] == want[5] == 2
        bp = torch.zeros(4, 32)
        bp[:, :21] = beta
        bp = bp.view(8, 16)   # per segment: 4 streams x 2 chunks
        assert (got[6] - bp).abs().max().item() <= 1e-6, layout
        assert torch.equal(want[6], bp), "ungated prep must copy beta exactly"
        # softplus above / below the threshold and in its tiny tail, per element
        gk = got[2].view(4, 32, 7)[:, :21, 0]
        active = got[0].view(4, 32, 7)[:, :21, 0] >= 0
        rel = ((gk - g[..., 0]).abs() / g[..., 0].abs().clamp_min(1e-30))[active]
        print(layout, dtype, "max rel err of g per element", rel.max().item())
        assert rel.max().item() <= 1e-5, layout


def case_forward():
    """host.forward_gated (chunked with a backward's snapshots, decode, windows) and the
    gated triton_op, against the CPU implementation fed torch's gates."""
    from sdm_inductor import cpu, ops
    from sdm_inductor.kernels import host
    for T, save, layout in ((37, True, "tokens"), (9, False, "streams"), (52, False, "tokens")):
        # repeats only without snapshots: a switched-off repeat's saved row is not defined
        ins = make_inputs(P=4, T=T, W=3, R=2, hd=18, slots_per_stream=16, repeats=not save,
                          seed=T)
        raw = raw_gates(4, T, layout, seed=T)
        beta, g = gates.torch_gates(*raw)
        host.CONFIG["WINDOW_TOKENS"] = 16
        bank = ins.bank.clone()
        y, rows, scales = host.forward_gated(bank, ins.k_idx, ins.k_val, ins.v, *raw, ins.q_idx,
                                             ins.q_val, 16, "none", save)
        d = ops.last_dispatch()
        want_path = "decode" if T <= 16 else "chunked"
        assert d["gates"] == "prep-kernel" and d["kernel_path"] == want_path, d
        if T == 52:
            assert d["windows"] == 4, d
        ref_bank = ins.bank.clone()
        y0, rows0, _ = cpu.forward(ref_bank, ins.k_idx, ins.k_val, ins.v, beta, g, ins.q_idx,
                                   ins.q_val, 16, "none", save)
        print(T, layout, rel_err(y, y0), rel_err(bank, ref_bank))
        assert rel_err(y, y0) <= 1e-5 and rel_err(bank, ref_bank) <= 1e-5
        if save:   # the undo log's used rows
            live = undo_log_rows_used(ins.k_idx, 16)
            assert rows.shape == rows0.shape and rel_err(rows[live], rows0[live]) <= 1e-5
    # the triton_op Inductor emits, run eagerly
    ins = make_inputs(P=4, T=37, W=3, R=2, hd=18, slots_per_stream=16, seed=5)
    raw = raw_gates(4, 37, "tokens", seed=5)
    y, M, rows, scales, _ = torch.ops.sdm.triton_write_read_gated(*gated_args(ins, raw), 16,
                                                                  "none", True)
    y0, M0, rows0, scales0 = torch_path(ins, raw, chunk_size=16, slots_per_stream=16)
    assert rel_err(y, y0) <= 1e-5 and rel_err(M, M0) <= 1e-5
    assert rows.shape == rows0.shape and scales.shape == scales0.shape


# ------------------------------------------------------------------ CUDA (skipped without a GPU)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("T", [9, 150])   # decode (no grad) / chunked
@pytest.mark.parametrize("walk", ["auto", "step"])   # auto: the column walks at this shape
def test_cuda_gated_op_matches_torch_gates(dtype, tol, T, walk, monkeypatch):
    from sdm_inductor.kernels import host
    monkeypatch.setitem(host.CONFIG, "WALK", walk)
    ins = make_inputs(P=4, T=T, W=8, R=6, hd=40, slots_per_stream=64, dtype=dtype,
                      device="cuda", seed=T)
    raw = raw_gates(4, T, "tokens", seed=T, dtype=dtype, device="cuda")
    opts = dict(chunk_size=64, slots_per_stream=64)
    with torch.no_grad():
        y, M = torch.ops.sdm.write_read_gated(*gated_args(ins, raw), **opts,
                                              save_for_backward=False)[:2]
        assert sdm_inductor.last_dispatch()["gates"] == "prep-kernel"
        y0, M0 = torch_path(ins, raw, **opts, save_for_backward=False)[:2]
    assert rel_err(y, y0) <= tol and rel_err(M, M0) <= tol
    dy = torch.randn(4, T, 40, device="cuda", dtype=dtype)
    dM = torch.randn_like(ins.bank)
    got = grads_of(lambda i, r: torch.ops.sdm.write_read_gated(*gated_args(i, r), **opts),
                   ins, raw, dy, dM)
    assert sdm_inductor.last_dispatch()["gates"] == "prep-kernel"
    want = grads_of(lambda i, r: torch_path(i, r, **opts), ins, raw, dy, dM)
    for name, a, b in zip(GRAD_NAMES, got[2], want[2]):
        assert rel_err(a, b) <= tol, (name, rel_err(a, b))


@needs_cuda
@pytest.mark.cuda
@pytest.mark.compile
@pytest.mark.parametrize("emit", ["aot", "always"])
def test_cuda_compiled_layer_has_no_gate_kernel(emit, monkeypatch):
    """The compiled layer on CUDA: matches eager, and no Inductor kernel computes the
    gates (sigmoid / softplus of the forward are inside the prep kernel, whether the
    graph launches it (``EMIT_KERNELS="always"``) or calls the gated op (default))."""
    from torch._inductor.utils import run_and_get_code

    from sdm_inductor.lowerings import write_read as lowering
    monkeypatch.setattr(lowering, "EMIT_KERNELS", emit)
    layer = _layer().cuda()
    x = torch.randn(2, 100, 32, device="cuda")
    compiled = torch.compile(layer, fullgraph=True)
    with torch.no_grad():
        y, (code,) = run_and_get_code(compiled, x)
        y0 = layer(x)
    assert rel_err(y, y0) <= 1e-4
    kernels = dict(re.findall(r"async_compile\.triton\(\s*'(\w+)',\s*'''(.*?)'''", code, re.S))
    if emit == "always":
        assert any("_prep_kernel" in name for name in kernels), sorted(kernels)
    else:
        assert "torch.ops.sdm.write_read_gated.default(" in code
    # Inductor names its own kernels triton_<kind>_...; the op's kernels keep their names
    # (the prep kernel's own source holds a softplus, so the whole code cannot be searched)
    gate_kernels = [name for name, src in kernels.items() if name.startswith("triton_")
                    and ("softplus" in src or "log1p" in src)]
    assert not gate_kernels, f"gate kernels outside the op: {gate_kernels}"


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from sdm_inductor.testing import quick_interpreter
    quick_interpreter()
    globals()["case_" + sys.argv[1]]()
