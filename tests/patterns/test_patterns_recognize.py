"""Pattern rewrites, checked with Dynamo + the torch-level pass + eager execution of the
rewritten graph (no Inductor: fast). Every case is compared with eager on fresh random
inputs and checked rewritten / left alone as expected."""
from __future__ import annotations

import logging

import pytest
import torch

import sdm_inductor
from sdm_inductor.patterns import Report, RepeatedWriteSlotError, explain, rewrites
from sdm_inductor.patterns.torch_frontend import rewrite_dynamo_graph

import patterns_corpus as C

NAMES = ("M", "k_idx", "k_val", "v", "beta", "g", "q_idx", "q_val")
PER_TOKEN_GATE = {"p_index_put_einsum"}


def rewrite_compile(fn):
    """torch.compile with a backend that applies the torch-level rewrite and runs the
    rewritten graph eagerly; returns (compiled fn, report)."""
    report = Report()

    def backend(gm, example_inputs):
        report.extend(rewrite_dynamo_graph(gm.graph))
        return gm.forward

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend), report


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _close(out, ref, dtype):
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    for a, b in zip(_tuple(out), _tuple(ref)):
        torch.testing.assert_close(a.float(), b.float(), **tol)


def _inputs(fn, **kw):
    return C.inputs(per_write=fn.__name__ not in PER_TOKEN_GATE, **kw)


@pytest.mark.parametrize("fn", C.POSITIVES, ids=lambda f: f.__name__)
def test_positive_rewritten_and_equal(fn):
    d = _inputs(fn, seed=hash(fn.__name__) % 1000)
    compiled, report = rewrite_compile(fn)
    out = compiled(**d)
    assert len(report.rewritten) == 1, str(report)
    assert report.rewritten[0].tokens == C.T
    assert not report.rejected, str(report)
    _close(out, fn(**d), torch.float32)


@pytest.mark.parametrize("fn", C.NEAR_MISSES, ids=lambda f: f.__name__)
def test_near_miss_left_alone_and_equal(fn):
    d = C.inputs(seed=hash(fn.__name__) % 1000)
    compiled, report = rewrite_compile(fn)
    out = compiled(**d)
    assert not report.rewritten, str(report)
    assert report.rejected and all(r.reason for r in report.rejected), str(report)
    _close(out, fn(**d), torch.float32)


def _rewritten_like_eager_with_gradients(fn, d, chains: int):
    """``fn`` rewritten into ``chains`` ops gives eager's outputs and gradients."""
    out = fn(**d)
    (out[0].sin().sum() + out[1].pow(2).sum()).backward()
    ref_out = tuple(o.detach() for o in out)
    ref = {k: t.grad.clone() for k, t in d.items() if t.grad is not None}
    for t in d.values():
        t.grad = None
    compiled, report = rewrite_compile(fn)
    out = compiled(**d)
    assert len(report.rewritten) == chains, str(report)
    _close(out, ref_out, torch.float32)
    (out[0].sin().sum() + out[1].pow(2).sum()).backward()
    for k in ref:
        torch.testing.assert_close(d[k].grad, ref[k], atol=1e-5, rtol=1e-4, msg=k)


@pytest.mark.parametrize("fn", C.BATCHED, ids=lambda f: f.__name__)
def test_streams_batched_in_each_step(fn):
    """B streams per step: a [B, S, hd] bank indexed per batch, a flat bank with offsets,
    a [B, H, S, hd] bank indexed per batch and head, slots shared by the streams.
    Gradients too (the op's backward through the stream layout)."""
    _rewritten_like_eager_with_gradients(fn, C.inputs_for(fn, seed=17, requires_grad=True), 1)


def test_per_stream_loops_over_views_written_in_place():
    """``Mb = M[b]`` written in place, one loop per stream: each loop is an op on the view,
    and the base ``M`` returned holds every stream's final rows. Gradients too."""
    d = C.inputs_batched(seed=23, requires_grad=True)
    _rewritten_like_eager_with_gradients(C.p_stream_views_in_place, d, d["M"].shape[0])


@pytest.mark.parametrize("fn", C.BATCHED_NEAR_MISSES, ids=lambda f: f.__name__)
def test_streams_near_miss(fn):
    d = C.inputs_for(fn, seed=19)
    compiled, report = rewrite_compile(fn)
    out = compiled(**d)
    assert not report.rewritten and report.rejected, str(report)
    _close(out, fn(**d), torch.float32)


def test_corpus_sizes():
    assert len(C.POSITIVES) + len(C.BATCHED) + 2 >= 12   # + the Projected and DecodeStep modules
    assert len(C.NEAR_MISSES) + len(C.BATCHED_NEAR_MISSES) >= 15


@pytest.mark.parametrize("fn", [C.p_setitem_mulsum, C.p_gather_scatter_outer, C.p_scan],
                         ids=lambda f: f.__name__)
def test_bf16_bank(fn):
    d = _inputs(fn, dtype=torch.bfloat16, seed=3)
    compiled, report = rewrite_compile(fn)
    out = compiled(**d)
    assert len(report.rewritten) == 1, str(report)
    _close(out, fn(**d), torch.bfloat16)


def test_hoisted_inputs_topk_module_and_gradients():
    """Per-token inputs computed in the loop from x (projections, softmax, topk slots):
    hoisted and stacked; the slots are proven distinct by topk (no runtime check);
    gradients of every parameter equal eager's (through the op's backward)."""
    torch.manual_seed(0)
    m = C.Projected()
    x = torch.randn(C.T, 12)
    m(x).pow(2).sum().backward()
    ref = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    compiled, report = rewrite_compile(m)
    out = compiled(x)
    out.pow(2).sum().backward()
    assert len(report.rewritten) == 1 and report.rewritten[0].distinct == "topk", str(report)
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], atol=1e-5, rtol=1e-4, msg=n)


def test_training_gradients_of_inputs():
    d = C.inputs(requires_grad=True, seed=5)
    out = C.p_index_select_copy_matmul(**d)
    (out[0].sin().sum() + out[1].pow(2).sum()).backward()
    ref = {k: t.grad.clone() for k, t in d.items() if t.grad is not None}
    for t in d.values():
        t.grad = None
    compiled, report = rewrite_compile(C.p_index_select_copy_matmul)
    out = compiled(**d)
    (out[0].sin().sum() + out[1].pow(2).sum()).backward()
    assert len(report.rewritten) == 1
    assert set(ref) == {"M", "k_val", "v", "beta", "g", "q_val"}
    for k in ref:
        torch.testing.assert_close(d[k].grad, ref[k], atol=1e-5, rtol=1e-4, msg=k)


def test_decode_step_on_buffer_in_place():
    """A chain of one token that advances a module buffer in place -> sdm.write_read_."""
    d = C.inputs(T=1, seed=7)
    args = [d[k][0] for k in NAMES[1:]]
    eager, comp = C.DecodeStep(), C.DecodeStep()
    compiled, report = rewrite_compile(comp)
    for _ in range(2):   # the buffer advances on every call
        r_ref, r = eager(*args), compiled(*args)
        torch.testing.assert_close(r, r_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(comp.M, eager.M, atol=1e-5, rtol=1e-5)
    assert len(report.rewritten) == 1 and report.rewritten[0].op == "sdm.write_read_", str(report)
    assert report.rewritten[0].tokens == 1


def test_repeated_write_slot_raises_naming_the_loop():
    d = C.inputs(seed=11)
    d["k_idx"][2, 1] = d["k_idx"][2, 0]     # token 2 writes one slot twice
    compiled, report = rewrite_compile(C.p_setitem_mulsum)
    with pytest.raises(RepeatedWriteSlotError, match=r"token loop at patterns_corpus\.py:\d+"):
        compiled(**d)
    assert report.rewritten[0].distinct == "runtime check"


def test_assume_distinct_flag_drops_the_check():
    d = C.inputs(seed=12)
    with rewrites(True, assume_distinct_write_slots=True):
        compiled, report = rewrite_compile(C.p_setitem_mulsum)
        out = compiled(**d)
    assert report.rewritten[0].distinct.startswith("assumed")
    _close(out, C.p_setitem_mulsum(**d), torch.float32)
    assert not sdm_inductor.patterns.config.assume_distinct_write_slots


def test_explain_report_reads_well():
    d = C.inputs(seed=13)

    def two_loops(**kw):
        a = C.p_setitem_mulsum(**kw)
        b = C.n_no_delta(**kw)
        return a[0] + b[0]

    report = explain(two_loops, **d)
    assert len(report.rewritten) == 1 and len(report.rejected) == 1
    text = str(report)
    assert "1 chain(s) rewritten" in text and "6 token(s)" in text
    assert "no delta" in text and "patterns_corpus.py:" in text


def test_log_artifact_prints_decisions():
    from sdm_inductor.patterns import log as sdm_log
    from sdm_inductor.patterns.passes import TorchLevelPass
    assert torch._logging._internal.log_registry.is_artifact("sdm")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    sdm_log.log.addHandler(handler)
    torch._logging.set_logs(modules={"sdm": True})
    try:
        def backend(gm, ex):
            TorchLevelPass()(gm.graph)
            return gm.forward
        torch._dynamo.reset()
        torch.compile(C.p_bmm, backend=backend)(**C.inputs())
    finally:
        torch._logging.set_logs()
        sdm_log.log.removeHandler(handler)
    text = "\n".join(r.getMessage() for r in records)
    assert "rewritten: unrolled loop" in text and "6 token(s)" in text


@pytest.mark.parametrize("split", [False, True], ids=["one_stream", "split_streams"])
def test_nn_layer_naive_loop_is_rewritten(split, monkeypatch):
    """sdm_inductor.nn's naive token loop (streams one after the other, product-key slots)
    becomes the op -- one stream of P*T tokens, or (``split_sequential_streams``) P streams;
    outputs and gradients equal eager's; the product keys prove distinct write slots."""
    from sdm_inductor.nn import SparseDeltaMemory
    monkeypatch.setattr(sdm_inductor.patterns.config, "split_sequential_streams", split)
    torch.manual_seed(0)
    m = SparseDeltaMemory(32, num_heads=2, slots_per_head=64, top_k=4, naive=True)
    x = torch.randn(2, 5, 32)
    ref = m(x)
    ref.pow(2).sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    compiled, report = rewrite_compile(m)
    out = compiled(x)
    assert len(report.rewritten) == 1 and report.rewritten[0].distinct == "product keys", str(report)
    assert sdm_inductor.last_dispatch()["P"] == (4 if split else 1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    out.pow(2).sum().backward()
    for n, g in grads.items():
        torch.testing.assert_close(dict(m.named_parameters())[n].grad, g, atol=1e-5, rtol=1e-4, msg=n)


def test_two_banks_second_fed_by_first_readings():
    """Two loops in one graph, the second one's values projected from the first one's
    readings: the first is rewritten, then (next round) the second; gradients equal."""
    d = C.inputs(seed=23, requires_grad=True)
    d["q_idx"] = torch.stack([torch.randperm(C.S, generator=torch.Generator().manual_seed(t))[:C.R]
                              for t in range(C.T)])        # the second bank writes at q_idx
    out = C.p_two_layers(**d)
    sum(o.pow(2).sum() for o in out).backward()
    ref_out = tuple(o.detach() for o in out)
    ref = {k: t.grad.clone() for k, t in d.items() if t.grad is not None}
    for t in d.values():
        t.grad = None
    compiled, report = rewrite_compile(C.p_two_layers)
    out = compiled(**d)
    assert len(report.rewritten) == 2 and not report.rejected, str(report)
    _close(out, ref_out, torch.float32)
    sum(o.pow(2).sum() for o in out).backward()
    for k in ref:
        torch.testing.assert_close(d[k].grad, ref[k], atol=1e-5, rtol=1e-4, msg=k)


# ---------------------------------------------------------------- one write slot per token (W = 1)

W1_R1 = {"p_setitem_mulsum", "p_w1_row_squeezed", "p_scan", "p_w1_sliced_index"}   # R = 1 too


@pytest.mark.parametrize("fn", C.W1_POSITIVES, ids=lambda f: f.__name__)
def test_w1_rewritten_and_equal(fn):
    """W = 1 ([1, hd] rows, or [hd] rows of squeezed spellings), R = 1 for some: rewritten,
    slots distinct without a check, equal to eager."""
    d = C.inputs_w1(seed=hash(fn.__name__) % 1000, R=1 if fn.__name__ in W1_R1 else C.R)
    compiled, report = rewrite_compile(fn)
    out = compiled(**d)
    assert len(report.rewritten) == 1 and not report.rejected, str(report)
    assert report.rewritten[0].tokens == C.T
    assert report.rewritten[0].distinct == "one write slot per token", str(report)
    _close(out, fn(**d), torch.float32)


@pytest.mark.parametrize("fn", C.W1_NEAR_MISSES, ids=lambda f: f.__name__)
def test_w1_near_miss_left_alone_and_equal(fn):
    d = C.inputs_w1(seed=hash(fn.__name__) % 1000)
    compiled, report = rewrite_compile(fn)
    out = compiled(**d)
    assert not report.rewritten and report.rejected, str(report)
    _close(out, fn(**d), torch.float32)


def test_w1_gradients():
    """W = 1 = R: gradients of every input through the op equal eager's."""
    fn = C.p_w1_row_squeezed
    d = C.inputs_w1(seed=8, R=1, requires_grad=True)
    out = fn(**d)
    (out[0].sin().sum() + out[1].pow(2).sum()).backward()
    ref = {k: t.grad.clone() for k, t in d.items() if t.grad is not None}
    for t in d.values():
        t.grad = None
    compiled, report = rewrite_compile(fn)
    out = compiled(**d)
    (out[0].sin().sum() + out[1].pow(2).sum()).backward()
    assert len(report.rewritten) == 1, str(report)
    assert set(ref) == {"M", "k_val", "v", "beta", "g", "q_val"}
    for k in ref:
        torch.testing.assert_close(d[k].grad, ref[k], atol=1e-5, rtol=1e-4, msg=k)


def test_w1_streams_batched_bank_and_flat_near_miss():
    """One row per stream: a [B, S, hd] bank indexed ``M[arange(B), idx[:, t]]`` is
    rewritten (B streams, W = R = 1); the same on a flat bank with per-stream offsets
    reads like one stream whose slots retrieve each from their own row: left alone."""
    d = C.inputs_w1_batched(seed=4)
    compiled, report = rewrite_compile(C.p_w1_batched_bank)
    out = compiled(**d)
    assert len(report.rewritten) == 1 and not report.rejected, str(report)
    assert sdm_inductor.last_dispatch()["P"] == C.B
    _close(out, C.p_w1_batched_bank(**d), torch.float32)
    d = C.inputs_w1_batched(seed=4, flat=True)
    compiled, report = rewrite_compile(C.n_w1_flat_streams)
    out = compiled(**d)
    assert not report.rewritten and "flat bank" in str(report), str(report)
    _close(out, C.n_w1_flat_streams(**d), torch.float32)


# ---------------------------------------------------------------- scan bodies computing their inputs

def _graph_nodes(fn, *args):
    """(number of nodes of the rewritten Dynamo graph, it holds a scan, report)."""
    seen = {}
    report = Report()

    def backend(gm, example_inputs):
        report.extend(rewrite_dynamo_graph(gm.graph))
        seen["n"] = len(gm.graph.nodes)
        seen["scan"] = any(n.target is torch.ops.higher_order.scan for n in gm.graph.nodes)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*args)
    return seen["n"], seen["scan"], report


@pytest.mark.parametrize("variant", ["gdn", "topk", "w1"])
def test_scan_body_inputs_hoisted(variant):
    """sigmoid(b_t), -exp(A_log) * softplus(a_t + dt_bias), softmax(logits_t), x_t @ Wv (and
    topk slots of x_t @ Wk) computed in the scan body: hoisted, the scan rewritten from its
    body; outputs and parameter gradients equal eager's; the rewritten graph does not grow
    with T (no unrolling)."""
    w = 1 if variant == "w1" else C.W
    m = C.ScanProjected("gdn" if variant == "w1" else variant, w=w)
    args = C.scan_inputs(w=w, seed=2)
    ref = m(*args)
    (ref[0].pow(2).sum() + ref[1].sin().sum()).backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    compiled, report = rewrite_compile(m)
    out = compiled(*args)
    assert len(report.rewritten) == 1 and not report.rejected, str(report)
    assert report.rewritten[0].form == "scan (torch)" and report.rewritten[0].tokens == C.T
    assert report.rewritten[0].distinct == {"gdn": "runtime check", "topk": "topk",
                                            "w1": "one write slot per token"}[variant]
    _close(out, ref, torch.float32)
    (out[0].pow(2).sum() + out[1].sin().sum()).backward()
    assert set(grads) >= {"wv", "A_log", "dt_bias", "bank"}
    for n, p in m.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.grad, grads[n], atol=1e-5, rtol=1e-4, msg=n)
    if variant == "gdn":
        with torch.no_grad():
            sizes = [_graph_nodes(m, *C.scan_inputs(T=T, w=w)) for T in (4, 16)]
        assert all(not has_scan and rep.rewritten for _, has_scan, rep in sizes), sizes
        assert sizes[0][0] == sizes[1][0]


@pytest.mark.parametrize("variant", ["noise", "inplace"])
def test_scan_body_inputs_near_miss(variant):
    """Random numbers or an in-place change in the part of the body that computes the
    inputs: hoisting would change the program; the scan is left as written, with the reason."""
    m = C.ScanProjected(variant)
    args = C.scan_inputs(seed=3)
    compiled, report = rewrite_compile(m)
    with torch.no_grad():
        torch.manual_seed(0)
        out = compiled(*args)
        torch.manual_seed(0)
        ref = m(*args)
    assert not report.rewritten and report.rejected, str(report)
    assert ("random numbers" if variant == "noise" else "changed in place") in str(report), str(report)
    _close(out, ref, torch.float32)


def test_scan_input_from_loop_state_left_alone():
    """beta computed in the body from a second carry (loop state): left alone."""
    d = C.inputs(seed=6)
    args = (d["M"], d["k_idx"], d["k_val"], d["v"], d["beta"])
    fn = C.n_scan_carried_beta
    compiled, report = rewrite_compile(fn)
    out = compiled(*args, None, None, None)
    assert not report.rewritten and "carries" in str(report), str(report)
    _close(out, fn(*args, None, None, None), torch.float32)
