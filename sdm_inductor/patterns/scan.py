"""``torch._higher_order_ops.scan`` loops: recognised from the body, never unrolled.

The body is analysed once, like one token of an unrolled loop: its bank carry is the
chain's root, its ``xs`` slices are the per-token inputs. When the body is one
canonical token step, the scan becomes one op call whose per-token inputs are the
``xs`` themselves (sliced per token by the scan, whole here), so compile time does not
depend on T. Per-token inputs computed inside the body are not hoisted (left alone,
with the reason).
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from . import config
from .canonical import Reject
from .distinct import proof
from .interpret import Analysis, location
from .report import RejectedChain, Report, RewrittenChain
from .rewrite import remove_dead_code, Emitter

__all__ = ["rewrite_scans"]


def _is_scan(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is torch.ops.higher_order.scan


def rewrite_scans(graph: fx.Graph, frontend, level: str) -> Report:
    report = Report()
    for node in list(graph.nodes):
        if not _is_scan(node):
            continue
        where = location(node)
        state = {"mutating": False}
        try:
            _rewrite_scan(graph, node, frontend, level, report, state)
        except Reject as e:
            report.rejected.append(RejectedChain(where, 0, f"scan: {e}"))
        except Exception as e:      # noqa: BLE001
            if state["mutating"]:
                raise
            report.rejected.append(RejectedChain(where, 0, f"scan: recognizer error, left as written: {e!r}"))
    if report.rewritten and graph.owning_module is not None:
        remove_dead_code(graph)
        graph.lint()
        graph.owning_module.recompile()
    return report


def _meta(n):
    v = n.meta.get("val", n.meta.get("example_value")) if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _rewrite_scan(graph, node, fe, level, report, state):
    body_ref, init, xs, extra = node.args[:4]
    if node.kwargs or len(node.args) > 4:
        raise Reject("scan with extra arguments")
    owner = graph.owning_module
    body = getattr(owner, body_ref.target) if body_ref.op == "get_attr" else None
    if not isinstance(body, fx.GraphModule):
        raise Reject("scan body is not a graph")
    if len(init) != 1:
        raise Reject(f"{len(init)} carries (only a bank carry is recognised)")
    phs = [n for n in body.graph.nodes if n.op == "placeholder"]
    if len(phs) != len(init) + len(xs) + len(extra):
        raise Reject("scan body signature")
    outer = dict(zip(phs, list(init) + list(xs) + list(extra)))
    per_token = set(phs[len(init):len(init) + len(xs)])
    an = Analysis(body.graph, fe).run()
    chains, rejected = an.chains()
    if rejected:
        raise Reject(rejected[0].reason)
    if len(chains) != 1 or chains[0].length != 1 or chains[0].bank.root is not phs[0]:
        raise Reject("the body is not one token step on the bank carry")
    chain = chains[0]
    step = chain.steps[0]
    out_node = next(n for n in body.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    if not any(e.producer is outs[0] for e in chain.final_escapes):
        raise Reject("the carry returned is not the bank after the token's write")
    ys = outs[1:]
    read_of = {p: r for lst in chain.reads.values() for p, r in lst}
    if any(y not in read_of for y in ys) or len({id(read_of[y]) for y in ys}) > 1 and any(
            read_of[y].q_idx.key != read_of[ys[0]].q_idx.key for y in ys):
        raise Reject("a per-token output is not the token's reading")
    w, r = step.write, step.read
    T = _meta(xs[0]).shape[0] if xs else None
    if T is None:
        raise Reject("scan without xs")

    def src(atom):
        n = atom.node
        if n not in outer:
            raise Reject(f"per-token input {n.name} is computed inside the scan body "
                         "(compute it before the scan to have it hoisted)")
        return outer[n], n in per_token

    # check every role comes from the scan's inputs before touching the graph
    atoms = [w.k_idx, *[f.atom for f in w.k + w.v + w.beta]]
    if w.gate is not None:
        atoms.append(w.gate.atom.exp_of)
    if r is not None:
        atoms += [r.q_idx, *[f.atom for f in r.q]]
    for a in atoms:
        src(a)
    if chain.bank.dtype not in (torch.float32, torch.bfloat16):
        raise Reject(f"bank dtype {chain.bank.dtype}")
    k_src, k_tok = src(w.k_idx)
    distinct = proof(k_src) if k_tok else None
    if distinct is None and config.assume_distinct_write_slots:
        distinct = "assumed (assume_distinct_write_slots)"

    if not all(u.op == "call_function" and u.target is operator.getitem for u in node.users):
        raise Reject("scan result used whole")
    state["mutating"] = True
    em = Emitter(graph, node, level == "aten")
    root = init[0]
    hd = chain.bank.shape[1]
    dtype, dev = chain.bank.dtype, _meta(root).device
    W, R = w.W, (r.R if r is not None else 1)

    def factor(rf_atom, labels):
        s, tok = src(rf_atom)
        live = [d for d, lb in zip(rf_atom.shape, labels) if lb is not None]
        n = live[0] if live else 1
        return em.reshape(s, (T, n) if tok else (1, n))

    def product(factors, n, coef, dt, gate=None):
        xs_ = [factor(f.atom, f.labels) for f in factors]
        if not xs_:
            return em.full((T, n), float(coef), dt, dev)
        x = xs_[0]
        for y in xs_[1:]:
            x = em.mul(x, y)
        if coef != 1.0:
            x = em.mul(x, float(coef))
        return em.expand(x, (T, n))

    k_idx = em.unsqueeze(em.reshape(k_src, (T, W)) if k_tok else em.expand(em.reshape(k_src, (1, W)), (T, W)), 0)
    k_val = em.unsqueeze(product(w.k, W, 1.0, dtype), 0)
    v = em.unsqueeze(product(w.v, hd, 1.0, dtype), 0)
    beta = em.reshape(product(w.beta, 1, w.coef, torch.float32), (1, T))
    if w.gate is None:
        g = em.full((1, T, 1), 0.0, torch.float32, dev)
    else:
        G = W if w.per_write_gate else 1
        g = em.unsqueeze(em.expand(factor(w.gate.atom.exp_of, w.gate.labels), (T, G)), 0)
    if r is None:
        q_idx = em.full((1, T, 1), 0, torch.int64, dev)
        q_val = em.full((1, T, 1), 0.0, dtype, dev)
    else:
        qs, qtok = src(r.q_idx)
        q_idx = em.unsqueeze(em.reshape(qs, (T, R)) if qtok else em.expand(em.reshape(qs, (1, R)), (T, R)), 0)
        q_val = em.unsqueeze(product(r.q, R, r.coef, dtype), 0)
    if distinct is None:
        k_idx = em.call(torch.ops.sdm.check_distinct_write_slots.default, k_idx,
                        f"the scan loop at {location(node)}")
    grad = any(_meta(n) is not None and _meta(n).requires_grad for n in [root, *xs, *extra])
    out = em.call(torch.ops.sdm.write_read.default, root, k_idx, k_val, v, beta, g, q_idx, q_val,
                  config.chunk_size, 0, False, "none", False, grad)
    readings, final = em.getitem(out, 0), em.getitem(out, 1)
    for user in list(node.users):
        i = user.args[1]
        if i == 0:
            user.replace_all_uses_with(final)
        else:
            y = ys[i - 1]
            rr = read_of[y]
            x = em.select0(readings, 0)
            if rr.coef != r.coef:
                x = em.mul(x, rr.coef / r.coef)
            x = em.reshape(x, (T, *rr.shape))
            user.replace_all_uses_with(x)
        graph.erase_node(user)
    graph.erase_node(node)
    report.rewritten.append(RewrittenChain(location(node), T, f"scan ({level})", "sdm.write_read",
                                           distinct or "runtime check"))
