"""Rewrites never break a working program: generated token loops checked against eager
(``fuzz_programs`` / ``fuzz_check``), replacements refused by the op's own rules left
alone with the reason, a pass that fails half-way putting the graph back, and the loop
spellings that were left alone for reasons that did not hold."""
from __future__ import annotations

import logging

import pytest
import torch

import sdm_inductor
from sdm_inductor.patterns import config, explain, rewrite
from sdm_inductor.patterns.passes import TorchLevelPass

import fuzz_check as FC
import fuzz_programs as FP

N_EXPLAIN = 160      # programs checked at explain level (no Inductor codegen)


def _run_many(specs):
    outcomes = []
    for spec in specs:
        outcomes.append(FC.check(spec))
        torch._dynamo.reset()
    return outcomes


def test_generated_programs_equal_eager_and_mutants_left_alone():
    outcomes = _run_many(FP.programs(N_EXPLAIN, seed=2026))
    bad = FC.failures(outcomes)
    assert not bad, "\n".join(FC.describe(o) for o in bad[:5]) + "\n" + FC.table(outcomes)
    pos = [o for o in outcomes if o.positive]
    muts = [o for o in outcomes if not o.positive]
    assert len(pos) > 80 and len(muts) > 30
    assert {o.spec.mutation for o in muts} == set(FP.MUTATIONS)
    left = [o for o in pos if not o.rewritten]
    assert len(left) <= 0.05 * len(pos), "\n".join(FC.describe(o) for o in left[:5]) + FC.table(outcomes)
    assert all(o.reasons for o in outcomes if not o.rewritten)


def test_generated_programs_gradients_equal_eager():
    """Gradients through rewritten programs (float32 positives) equal eager's."""
    checked, bad = 0, []
    for spec in FP.programs(80, seed=77, mutant_share=0.0):
        if spec.bank_dtype != "float32" or checked == 24:
            continue
        done, why = FC.check_grads(spec)
        torch._dynamo.reset()
        checked += done
        if why is not None:
            bad.append(f"{spec.short()}\n{FP.source(spec)}{why}")
    assert checked == 24 and not bad, "\n".join(bad[:3])


def test_generator_is_reproducible_and_covers_the_grammar():
    a, b = FP.programs(300, seed=5), FP.programs(300, seed=5)
    assert [FP.source(x) for x in a] == [FP.source(x) for x in b]
    seen = {f: {getattr(s, f) for s in a} for f in ("layout", "W", "R", "bank_dtype", "idx_dtype", "gate",
                                                   "beta", "read", "write", "contract", "outer", "form",
                                                   "scale", "decay", "root", "shared", "number")}
    assert seen["layout"] == {"one", "batched", "heads", "flat", "flat_global"}
    assert seen["W"] == {1, 2, 3} and seen["R"] == {1, 2}
    assert seen["write"] == {"index_put", "setitem", "index_copy", "scatter", "index_add", "scatter_add",
                             "zeros_add", "setitem_add"}
    assert seen["read"] == {"index", "index_select", "gather", "embedding", "take_along_dim"}
    assert seen["form"] == {"unrolled", "scan"}
    assert seen["gate"] == {"none", "T", "T1", "TW"} and seen["beta"] == {"none", "T", "T1", "scalar"}
    assert seen["contract"] == {"mulsum", "matmul", "einsum", "bmm", "tmatmul"}
    assert seen["scale"] == {"none", "value", "retrieval"}
    assert seen["outer"] == {"mul", "outer", "einsum", "addcmul"}
    assert seen["decay"] == {"exp", "sigmoid"}
    assert seen["root"] == {"input", "view"}
    assert seen["shared"] == {False, True}
    assert seen["number"] == {False, True}


@pytest.mark.parametrize("seed,root", [(11, "input"), (12, "view")])
def test_generated_programs_through_inductor(seed, root):
    """A few programs through the full torch.compile (the passes installed by import); one
    whose bank is a view at a storage offset (torch bugs: ``lowerings/offset_views.py``)."""
    spec = next(s for s in FP.programs(40, seed=seed)
                if s.mutation is None and s.form == "unrolled" and s.root == root)
    outcome = FC.check(spec, runner=FC.inductor_run)
    assert outcome.rewritten and not outcome.crash and not outcome.mismatch, FC.describe(outcome)


# ---------------------------------------------------------------- the reported loops

def issue_loop(mem, k_idx, k_val, v, beta, g, q_idx, q_val):
    outs = []
    for t in range(k_idx.shape[0]):
        rows = mem[k_idx[t]] * g[t].exp()[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * rows).sum(0))
        mem = mem.index_put((k_idx[t],), rows + k_val[t][:, None] * delta[None])
        outs.append((q_val[t][:, None] * mem[q_idx[t]]).sum(0))
    return torch.stack(outs), mem


def _issue_inputs(beta_shape, g_shape, T=6, S=24, hd=8, W=3, R=2, dtype=torch.float32, idx=torch.int64):
    gen = torch.Generator().manual_seed(3)
    return dict(mem=torch.randn(S, hd, generator=gen).to(dtype),
                k_idx=torch.stack([torch.randperm(S, generator=gen)[:W] for _ in range(T)]).to(idx),
                k_val=torch.randn(T, W, generator=gen).to(dtype), v=torch.randn(T, hd, generator=gen).to(dtype),
                beta=torch.rand(beta_shape, generator=gen), g=-torch.rand(g_shape, generator=gen),
                q_idx=torch.randint(0, S, (T, R), generator=gen).to(idx),
                q_val=torch.randn(T, R, generator=gen).to(dtype))


def loop_per_token_scalars(mem, k_idx, k_val, v, beta, g, q_idx, q_val):      # beta, g: [T]
    outs = []
    for t in range(k_idx.shape[0]):
        rows = mem[k_idx[t]] * g[t].exp()
        delta = beta[t] * (v[t] - (k_val[t][:, None] * rows).sum(0))
        mem = mem.index_put((k_idx[t],), rows + k_val[t][:, None] * delta[None])
        outs.append((q_val[t][:, None] * mem[q_idx[t]]).sum(0))
    return torch.stack(outs), mem


def loop_per_write_gate(mem, k_idx, k_val, v, beta, g, q_idx, q_val):      # g: [T, W] fp32
    outs = []
    for t in range(k_idx.shape[0]):
        rows = (mem[k_idx[t]] * g[t].exp()[:, None]).to(mem.dtype)
        delta = beta[t] * (v[t] - (k_val[t][:, None] * rows).sum(0))
        mem = mem.index_put((k_idx[t],), (rows + k_val[t][:, None] * delta[None]).to(mem.dtype))
        outs.append((q_val[t][:, None] * mem[q_idx[t]]).sum(0))
    return torch.stack(outs), mem


def loop_broadcast_scalars(mem, k_idx, k_val, v, beta, g, q_idx, q_val):      # beta, g: 0-d
    outs = []
    for t in range(k_idx.shape[0]):
        rows = mem[k_idx[t]] * torch.exp(g)
        delta = beta * (v[t] - (k_val[t][:, None] * rows).sum(0))
        mem = mem.index_put((k_idx[t],), rows + k_val[t][:, None] * delta[None])
        outs.append((q_val[t][:, None] * mem[q_idx[t]]).sum(0))
    return torch.stack(outs), mem


@pytest.mark.parametrize("fn,beta_shape,g_shape,dtype,idx", [
    (issue_loop, (6, 1), (6, 1), torch.float32, torch.int64),          # the 2.0.0 layout
    (loop_per_token_scalars, (6,), (6,), torch.float32, torch.int32),   # 0-d per token
    (loop_per_write_gate, (6, 1), (6, 3), torch.bfloat16, torch.int32),  # bf16 bank, fp32 gates
    (loop_broadcast_scalars, (), (), torch.float32, torch.int64),       # one value for all tokens
], ids=["T1", "T", "TW-bf16", "broadcast"])
def test_gate_and_beta_layouts_rewritten_and_equal(fn, beta_shape, g_shape, dtype, idx):
    d = _issue_inputs(beta_shape, g_shape, dtype=dtype, idx=idx)
    ref = fn(**d)
    out, report = FC.explain_run(fn, d)
    torch._dynamo.reset()
    assert len(report.rewritten) == 1 and not report.rejected, str(report)
    FC.compare(out, ref, "float32" if dtype == torch.float32 else "bfloat16")


def test_issue_loop_through_inductor():
    d = _issue_inputs((6, 1), (6, 1))
    torch._dynamo.reset()
    out = torch.compile(issue_loop)(**d)
    assert sdm_inductor.patterns.last_report().rewritten
    FC.compare(out, issue_loop(**d), "float32")


def sparse_delta_reference(mem, idx, k, v, beta, g, q_idx, q):
    """A delta scattered into a zeros buffer, then added (the public tests' reference form);
    the output buffer allocated from the bank's metadata before the loop."""
    T = idx.shape[0]
    out = mem.new_empty(T, mem.shape[-1])
    for t in range(T):
        rows = mem[idx[t]]
        decayed = rows * torch.exp(g[t])[:, None]       # g: [T, 1]
        delta = beta[t] * (v[t] - k[t] @ decayed)
        upd = torch.zeros_like(mem)
        upd.scatter_add_(0, idx[t].unsqueeze(-1).expand_as(rows), decayed - rows + k[t][:, None] * delta)
        mem = mem + upd
        out[t] = q[t] @ mem[q_idx[t]]
    return out, mem


def flat_global_rows(mem, k_idx, k_val, v, beta, g, q_idx, q_val):
    """A flat [B*S, hd] bank, per-stream global row ids flattened, rows viewed per stream."""
    B, T, W = k_idx.shape
    outs = []
    for t in range(T):
        idx = k_idx[:, t].reshape(-1)
        rows = mem[idx].view(B, W, -1) * g[:, t].exp()[:, None, None]
        delta = beta[:, t, None] * (v[:, t] - torch.einsum("bw,bwd->bd", k_val[:, t], rows))
        mem = mem.index_put((idx,), (rows + k_val[:, t, :, None] * delta[:, None]).reshape(B * W, -1))
        outs.append(torch.einsum("br,brd->bd", q_val[:, t], mem[q_idx[:, t].reshape(-1)].view(B, -1, mem.shape[-1])))
    return torch.stack(outs, 1), mem


def _flat_inputs(B=2, S=12, T=5, W=3, R=2, hd=8):
    gen = torch.Generator().manual_seed(9)
    off = (torch.arange(B) * S)[:, None, None]
    return dict(mem=torch.randn(B * S, hd, generator=gen),
                k_idx=torch.stack([torch.stack([torch.randperm(S, generator=gen)[:W] for _ in range(T)])
                                   for _ in range(B)]) + off,
                k_val=torch.randn(B, T, W, generator=gen), v=torch.randn(B, T, hd, generator=gen),
                beta=torch.rand(B, T, generator=gen), g=-torch.rand(B, T, generator=gen),
                q_idx=torch.randint(0, S, (B, T, R), generator=gen) + off,
                q_val=torch.randn(B, T, R, generator=gen))


@pytest.mark.parametrize("fn", [sparse_delta_reference, flat_global_rows], ids=lambda f: f.__name__)
def test_reported_forms_rewritten_and_equal(fn):
    if fn is flat_global_rows:
        d = _flat_inputs()
    else:
        d = _issue_inputs((6,), (6, 1))
        d = dict(mem=d["mem"], idx=d["k_idx"], k=d["k_val"], v=d["v"], beta=d["beta"], g=d["g"],
                 q_idx=d["q_idx"], q=d["q_val"])
    ref = fn(**d)
    out, report = FC.explain_run(fn, d)
    torch._dynamo.reset()
    assert len(report.rewritten) == 1 and not report.rejected, str(report)
    FC.compare(out, ref, "float32")


# ---------------------------------------------------------------- safety

def test_replacement_refused_by_the_op_is_left_alone(monkeypatch):
    """A replacement the op would refuse (here an invalid chunk size) is never made: the
    chain is reported as left alone with the op's reason, in the report and the log."""
    from sdm_inductor.patterns import log as sdm_log
    monkeypatch.setattr(config, "chunk_size", 0)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    sdm_log.log.addHandler(handler)
    torch._logging.set_logs(modules={"sdm": True})
    d = _issue_inputs((6, 1), (6, 1))
    try:
        report = explain(issue_loop, **d)

        def backend(gm, ex):
            TorchLevelPass()(gm.graph)
            return gm.forward
        torch._dynamo.reset()
        out = torch.compile(issue_loop, backend=backend)(**d)
    finally:
        torch._logging.set_logs()
        sdm_log.log.removeHandler(handler)
        torch._dynamo.reset()
    assert not report.rewritten and "chunk_size" in str(report), str(report)
    text = "\n".join(r.getMessage() for r in records)
    assert "left alone" in text and "chunk_size" in text
    FC.compare(out, issue_loop(**d), "float32")


def test_exception_inside_the_pass_puts_the_graph_back(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(rewrite, "_erase", broken)
    d = _issue_inputs((6, 1), (6, 1))
    codes, report = [], sdm_inductor.patterns.Report()

    def backend(gm, ex):
        codes.append(gm.graph.python_code("self").src)
        report.extend(sdm_inductor.patterns.torch_frontend.rewrite_dynamo_graph(gm.graph))
        gm.graph.lint()
        gm.recompile()
        codes.append(gm.graph.python_code("self").src)
        return gm.forward
    torch._dynamo.reset()
    out = torch.compile(issue_loop, backend=backend)(**d)
    torch._dynamo.reset()
    assert codes[0] == codes[1]
    assert not report.rewritten and "boom" in str(report), str(report)
    FC.compare(out, issue_loop(**d), "float32")


def in_place_loop(mem, k_idx, k_val, v, beta, g, q_idx, q_val):
    outs = []
    for t in range(k_idx.shape[0]):
        rows = mem[k_idx[t]] * g[t].exp()[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * rows).sum(0))
        mem[k_idx[t]] = rows + k_val[t][:, None] * delta[None]
        outs.append((q_val[t][:, None] * mem[q_idx[t]]).sum(0))
    return torch.stack(outs)


def test_values_sharing_the_banks_memory():
    """``v`` passed in as rows of the bank that the loop writes in place: each token reads
    the writes of the tokens before, which the op (reading its inputs at the call) would
    not. Traced so, the loop is left alone with the reason and computes as written;
    traced apart and called so (Dynamo does not guard on inputs becoming aliased), the op
    refuses the call before the bank changes."""
    d = _issue_inputs((6, 1), (6, 1))
    reports = []

    def backend(gm, ex):
        reports.append(sdm_inductor.patterns.torch_frontend.rewrite_dynamo_graph(gm.graph))
        gm.recompile()
        return gm.forward

    def run(fn, mem):
        return fn(**dict(d, mem=mem, v=mem[:6]))

    torch._dynamo.reset()
    compiled = torch.compile(in_place_loop, backend=backend)
    m0, m1 = d["mem"].clone(), d["mem"].clone()
    FC.compare(run(compiled, m1), run(in_place_loop, m0), "float32")
    assert torch.equal(m0, m1)
    assert not reports[-1].rewritten and "shares memory with the bank" in str(reports[-1])
    torch._dynamo.reset()
    compiled = torch.compile(in_place_loop, backend=backend)
    compiled(**dict(d, mem=d["mem"].clone()))
    assert reports[-1].rewritten, str(reports[-1])
    m2 = d["mem"].clone()
    with pytest.raises(sdm_inductor.SDMArgumentError, match="'v'.*apart from the bank"):
        run(compiled, m2)
    torch._dynamo.reset()
    assert torch.equal(m2, d["mem"])


def loop_with_cancelled_read(mem, k_idx, k_val, v, beta, g, q_idx, q_val):
    outs = []
    for t in range(k_idx.shape[0]):
        before = mem[q_idx[t]].sum()            # the state before token t's write
        rows = mem[k_idx[t]] * g[t].exp()[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * rows).sum(0))
        mem = mem.index_put((k_idx[t],), rows + k_val[t][:, None] * delta[None])
        outs.append((q_val[t][:, None] * mem[q_idx[t]]).sum(0) + 0 * before)
    return torch.stack(outs), mem


def test_bank_values_that_cancel_are_still_uses_of_the_bank():
    """``0 * x`` of a bank read is 0 in the algebra, not in floats (an inf row gives NaN):
    the read is a use of the bank's state between tokens, and the loop is left alone with
    that reason, not by an error half-way through the rewrite."""
    d = _issue_inputs((6, 1), (6, 1))
    d["mem"][d["q_idx"][2, 0]] = float("inf")
    torch._dynamo.reset()
    (y, M), report = FC.explain_run(loop_with_cancelled_read, {k: t.clone() for k, t in d.items()})
    torch._dynamo.reset()
    assert not report.rewritten and "leaves the loop" in str(report), str(report)
    assert "error" not in str(report), str(report)
    y0, M0 = loop_with_cancelled_read(**d)
    assert y0.isnan().any()
    torch.testing.assert_close((y, M), (y0, M0), equal_nan=True)
