"""Pattern rewrites inside real torch.compile (Inductor), the installed passes, the FX
graph cache and exported programs. Inductor compiles are few and tiny (CPU CI)."""
from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache

import sdm_inductor
from sdm_inductor.patterns import config, passes, rewrite_exported, rewrites
from sdm_inductor.patterns.passes import AtenLevelPass, TorchLevelPass

import patterns_corpus as C

NAMES = ("M", "k_idx", "k_val", "v", "beta", "g", "q_idx", "q_val")


def _ops_in(gm_graph):
    return [n for n in gm_graph.nodes if "sdm.write_read" in str(n.target)]


# ---------------------------------------------------------------- installation (no compile)

def test_on_by_import_and_switches():
    assert passes.installed() and config.enabled
    with rewrites(False):
        assert not passes.installed()
        assert inductor_config.pre_grad_custom_pass is None
    assert passes.installed()
    sdm_inductor.patterns.disable_rewrites()
    try:
        assert not passes.installed() and not config.enabled
    finally:
        sdm_inductor.patterns.enable_rewrites()
    assert passes.installed()


def test_install_composes_with_other_passes():
    seen = []

    class UserPass(torch._inductor.custom_graph_pass.CustomGraphPass):
        def __call__(self, graph):
            seen.append(graph)

        def uuid(self):
            return "user-pass"

    user = UserPass()
    passes.uninstall()
    try:
        inductor_config.pre_grad_custom_pass = user
        passes.install()
        slot = inductor_config.pre_grad_custom_pass
        chain = slot if isinstance(slot, (list, tuple)) else [slot]
        assert any(p is user or getattr(p, "first", None) is user for p in chain)
        assert passes.installed()
        passes.uninstall()
        assert inductor_config.pre_grad_custom_pass is user
    finally:
        inductor_config.pre_grad_custom_pass = None
        passes.install()


def test_uuid_is_stable_and_follows_settings():
    a, b = TorchLevelPass().uuid(), TorchLevelPass().uuid()
    assert a == b and a != AtenLevelPass().uuid()
    with rewrites(True, assume_distinct_write_slots=True):
        assert TorchLevelPass().uuid() != a
    assert TorchLevelPass().uuid() == a


# ---------------------------------------------------------------- exported programs

@pytest.mark.parametrize("fn", [C.p_gather_scatter_outer, C.p_scan, C.n_no_delta], ids=lambda f: f.__name__)
def test_rewrite_exported(fn):
    class Wrap(torch.nn.Module):
        def forward(self, *a):
            return fn(*a)

    d = C.inputs(seed=21)
    args = tuple(d[k] for k in NAMES)
    ep = torch.export.export(Wrap(), args)
    report = sdm_inductor.patterns.Report()
    ep2 = rewrite_exported(ep, report)
    assert isinstance(ep2, torch.export.ExportedProgram)
    expect = fn is not C.n_no_delta
    assert bool(_ops_in(ep2.graph)) == expect, str(report)
    assert not _ops_in(ep.graph)            # the input program is left as it was
    for a, b in zip(ep2.module()(*args), fn(*args)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_rewrite_exported_w1_and_scan_body_inputs():
    """Aten level: a one-slot loop (squeezed rows) and a scan whose body computes its inputs
    (hoisted as aten ops in front of the op) are rewritten in an exported program."""
    d = C.inputs_w1(seed=22, R=1)

    class W1(torch.nn.Module):
        def forward(self, *a):
            return C.p_w1_row_squeezed(*a)

    cases = [(W1(), tuple(d[k] for k in NAMES), C.p_w1_row_squeezed),
             (C.ScanProjected("gdn"), C.scan_inputs(seed=23), None)]
    for mod, args, eager in cases:
        ep = torch.export.export(mod, args)
        report = sdm_inductor.patterns.Report()
        ep2 = rewrite_exported(ep, report)
        assert len(_ops_in(ep2.graph)) == 1 and not report.rejected, str(report)
        assert not any(n.target is torch.ops.higher_order.scan for n in ep2.graph.nodes)
        with torch.no_grad():
            ref = (eager or mod)(*args)
            for a, b in zip(ep2.module()(*args), ref):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_rewrite_exported_refuses_other_types():
    with pytest.raises(TypeError, match="argument 'ep' of rewrite_exported: expected a torch.export.ExportedProgram"):
        rewrite_exported(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- Inductor

@pytest.mark.compile
def test_inductor_forward_rewritten():
    d = C.inputs(T=12, seed=31)
    torch._dynamo.reset()
    with fresh_cache():  # a warm cache serves the compiled graph without running the passes
        out = torch.compile(C.p_setitem_mulsum)(**d)
    report = sdm_inductor.patterns.last_report()
    assert len(report.rewritten) == 1 and report.rewritten[0].tokens == 12, str(report)
    for a, b in zip(out, C.p_setitem_mulsum(**d)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.compile
def test_inductor_loops_writing_the_callers_bank_through_views():
    """One loop per stream writes ``M[b]`` of the caller's bank in place; the heads'
    loops on a [B, H, S, hd] bank in the same program. Each loop is an op; the caller's
    bank ends as eager leaves it."""
    def fn(M, k_idx, k_val, v, beta, g, q_idx, q_val, heads):
        y, _ = C._views_loop(M, k_idx, k_val, v, beta, g, q_idx, q_val)
        z, final = C.p_heads_bank(**heads)
        return y, z, final

    d, heads = C.inputs_batched(seed=29), C.inputs_heads(seed=31)
    bank = d.pop("M")
    m_eager, m_compiled = bank.clone(), bank.clone()
    ref = fn(m_eager, **d, heads=heads)
    torch._dynamo.reset()
    with fresh_cache():  # a warm cache serves the compiled graph without running the passes
        out = torch.compile(fn, fullgraph=True)(m_compiled, **d, heads=heads)
    assert len(sdm_inductor.patterns.last_report().rewritten) == bank.shape[0] + 1
    for a, b in zip(out + (m_compiled,), ref + (m_eager,)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def rarer_spellings(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    """take_along_dim reads, a sigmoid decay, .T contractions, a number on v, addcmul."""
    outs = []
    for t in range(k_idx.shape[0]):
        rows = torch.take_along_dim(M, k_idx[t][:, None], dim=0) * torch.sigmoid(g[t])[:, None]
        delta = beta[t] * (2.0 * v[t] - rows.T @ k_val[t])
        M = M.index_put((k_idx[t],), torch.addcmul(rows, k_val[t][:, None], delta[None, :]))
        outs.append(M[q_idx[t]].T @ q_val[t])
    return torch.stack(outs), M


@pytest.mark.compile
def test_inductor_rarer_spellings_forward_and_gradients():
    """The replacement's extra nodes (logsigmoid of the gates, the value's number) lower
    through Inductor, forward and backward."""
    d = C.inputs(T=8, seed=32)

    def grads(fn):
        leaves = {k: (t.clone().requires_grad_() if t.is_floating_point() else t)
                  for k, t in d.items()}
        out = fn(**leaves)
        (out[0].sum() + out[1].pow(2).sum()).backward()
        return out, {k: t.grad for k, t in leaves.items() if t.is_floating_point()}

    ref, gref = grads(rarer_spellings)
    torch._dynamo.reset()
    with fresh_cache():
        out, got = grads(torch.compile(rarer_spellings))
    report = sdm_inductor.patterns.last_report()
    assert len(report.rewritten) == 1 and report.rewritten[0].tokens == 8, str(report)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for k in gref:
        torch.testing.assert_close(got[k], gref[k], atol=1e-5, rtol=1e-4, msg=k)


@pytest.mark.compile
def test_inductor_training_gradients():
    torch.manual_seed(1)
    m = C.Projected()
    x = torch.randn(C.T, 12)
    m(x).pow(2).sum().backward()
    ref = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    torch._dynamo.reset()
    with fresh_cache():
        torch.compile(m)(x).pow(2).sum().backward()
    assert sdm_inductor.patterns.last_report().rewritten
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.compile
def test_fx_graph_cache_hit_and_miss_when_switched_off():
    """Same program twice: a cache hit. With the rewrites off the cached (rewritten) graph
    must not be served: a miss, and the program compiles as written."""
    d = C.inputs(T=4, per_write=False, seed=41)
    fn = C.p_index_put_einsum

    def compile_once():
        torch._dynamo.reset()
        counters.clear()
        out = torch.compile(fn)(**d)
        return dict(counters["inductor"]), out

    with fresh_cache(), inductor_config.patch(fx_graph_cache=True):
        first, _ = compile_once()
        second, out = compile_once()
        with rewrites(False):
            off, out_off = compile_once()
    assert first.get("fxgraph_cache_miss") == 1
    assert second.get("fxgraph_cache_hit") == 1 and not second.get("fxgraph_cache_miss")
    assert off.get("fxgraph_cache_miss") == 1 and not off.get("fxgraph_cache_hit")
    assert second.get("extern_calls") and not off.get("extern_calls")   # the op vs the loop
    for a, b, c in zip(out, out_off, fn(**d)):
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b, c, atol=1e-5, rtol=1e-5)


@pytest.mark.compile
def test_post_grad_pass_rewrites_inference_graph():
    """With only the aten-level pass, the post-grad (functional) graph is rewritten."""
    d = C.inputs(T=6, seed=51)
    torch._dynamo.reset()
    counters.clear()
    with fresh_cache(), inductor_config.patch(pre_grad_custom_pass=None), torch.no_grad():
        out = torch.compile(C.p_gather_scatter_outer)(**d)
    report = sdm_inductor.patterns.last_report()
    assert report.rewritten and "aten" in report.rewritten[0].form, str(report)
    for a, b in zip(out, C.p_gather_scatter_outer(**d)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.compile
def test_backend_entry_point_rewrites_when_switched_off_globally():
    """``torch.compile(backend="sdm")`` (entry point ``torch_dynamo_backends``) rewrites
    even with the global switch off, then compiles with Inductor."""
    import importlib.metadata as md
    try:   # entry points exist only for an installed distribution (not a bare PYTHONPATH)
        md.distribution("sdm-inductor")
    except md.PackageNotFoundError:
        pytest.skip("sdm_inductor is not pip-installed: no entry points to test")
    d = C.inputs(T=4, seed=61)
    torch._dynamo.reset()
    with rewrites(False):
        out = torch.compile(C.p_bmm, backend="sdm")(**d)
        assert not passes.installed()
    report = sdm_inductor.patterns.last_report()
    assert len(report.rewritten) == 1 and report.rewritten[0].tokens == 4, str(report)
    for a, b in zip(out, C.p_bmm(**d)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.compile
def test_inductor_scan_body_inputs_hoisted_training():
    """A scan whose body computes its inputs (hoisted as aten ops into Dynamo's graph by the
    pre-grad pass) through AOTAutograd and Inductor: outputs and gradients equal eager's."""
    m = C.ScanProjected("gdn")
    args = C.scan_inputs(seed=71)
    ref = m(*args)
    (ref[0].pow(2).sum() + ref[1].sin().sum()).backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    torch._dynamo.reset()
    with fresh_cache():
        out = torch.compile(m)(*args)
    report = sdm_inductor.patterns.last_report()
    assert len(report.rewritten) == 1 and report.rewritten[0].form == "scan (torch)", str(report)
    (out[0].pow(2).sum() + out[1].sin().sum()).backward()
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for n, p in m.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.grad, grads[n], atol=1e-5, rtol=1e-4, msg=n)
