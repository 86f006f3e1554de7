"""``torch._higher_order_ops.scan`` loops: recognised from the body, never unrolled.

The body is analysed once, like one token of an unrolled loop: its bank carry is the
chain's root, its ``xs`` slices are the per-token inputs. When the body is one
canonical token step, the scan becomes one op call whose per-token inputs are the
``xs`` themselves (sliced per token by the scan, whole here), so compile time does not
depend on T.

Per-token inputs computed inside the body from values that do not depend on the bank
(``sigmoid(b_t)``, ``-exp(A_log) * softplus(a_t + dt_bias)``, ``softmax(logits_t)``,
``x_t @ Wv``, ``topk`` slots) are hoisted: their part of the body is applied to the
whole ``xs`` once, as ``torch.vmap`` of that part over the scanned dim (exact by vmap's
contract, ``f(xs)[t] == f(xs[t])``), traced to aten ops in front of the op call. Values
computed only from the scan's constant inputs are computed once. Left alone (with the
reason) when that part draws random numbers, changes something in place, has an op
without a vmap batching rule (hoisting would unroll it) or symbolic shapes.
"""
from __future__ import annotations

import math

import operator

import torch
import torch.fx as fx

from . import config
from .canonical import Reject
from .distinct import proof
from .interpret import Analysis, location
from .report import RejectedChain, Report, RewrittenChain
from .rewrite import remove_dead_code, Emitter, canonical_roles
from .safety import Checked, Snapshot

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
        snap = Snapshot(graph)
        try:
            _rewrite_scan(graph, node, frontend, level, report, state)
        except Reject as e:
            if state["mutating"]:
                _restore(snap, report, where, e)
                break       # the nodes listed above are the ones before the restore
            report.rejected.append(RejectedChain(where, 0, f"scan: {e}"))
        except Exception as e:      # noqa: BLE001
            if state["mutating"]:
                _restore(snap, report, where, e)
                break
            report.rejected.append(RejectedChain(where, 0, f"scan: recognizer error, left as written: {e!r}"))
    if report.rewritten and graph.owning_module is not None:
        remove_dead_code(graph)
        graph.lint()
        graph.owning_module.recompile()
    return report


def _restore(snap, report, where, e):
    """A scan whose replacement was refused or failed half-way: the graph is put back as
    it was before this scan (scans rewritten before it stay rewritten)."""
    snap.restore()
    why = str(e) if isinstance(e, Reject) else f"rewrite error: {e!r}"
    report.rejected.append(RejectedChain(where, 0, f"scan: left as written: {why}"))


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
            raise Reject(f"per-token input {n.name} is computed inside the scan body and was not hoisted")
        return outer[n], n in per_token

    # check every role comes from the scan's inputs (or can be hoisted) before touching the graph
    atoms = [w.k_idx, *[f.atom for f in w.k + w.v + w.beta]]
    if w.gate is not None:
        atoms.append(w.gate.atom.exp_of)
    if r is not None:
        atoms += [r.q_idx, *[f.atom for f in r.q]]
    if chain.bank.dtype not in (torch.float32, torch.bfloat16):
        raise Reject(f"bank dtype {chain.bank.dtype}")
    hoists = _plan_hoists(an, body, phs, per_token, outer, [a.node for a in atoms if a.node not in outer])
    k_node = w.k_idx.node
    if w.W == 1:
        distinct = "one write slot per token"
    elif k_node in outer:
        distinct = proof(outer[k_node]) if k_node in per_token else None
    else:
        distinct = proof(k_node)    # computed in the body: its proof holds for every token
    if distinct is None and config.assume_distinct_write_slots:
        distinct = "assumed (assume_distinct_write_slots)"

    if not all(u.op == "call_function" and u.target is operator.getitem for u in node.users):
        raise Reject("scan result used whole")
    state["mutating"] = True
    for traced, inputs, targets, batched in hoists:
        for t, x in zip(targets, _inline(graph, node, traced, inputs)):
            outer[t] = x
            if batched:
                per_token.add(t)
    for a in atoms:
        src(a)
    k_src, k_tok = src(w.k_idx)
    em = Emitter(graph, node, level == "aten", Checked(graph, fe.META))
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
    v = em.unsqueeze(product(w.v, hd, w.v_coef, dtype), 0)
    beta = em.reshape(product(w.beta, 1, w.coef, torch.float32), (1, T))
    log_a = math.log(w.decay_coef)      # a number on the decay (rows * 0.9)
    if w.gate is None:
        g = em.full((1, T, 1), log_a, torch.float32, dev)
    else:
        G = W if w.per_write_gate else 1
        g = em.log_decay(factor(w.gate.atom.exp_of, w.gate.labels), w.gate.atom.exp_of.decay)
        if log_a != 0.0:
            g = em.add(g, log_a)
        g = em.unsqueeze(em.expand(g, (T, G)), 0)
    if r is None:
        q_idx = em.full((1, T, 1), 0, torch.int64, dev)
        q_val = em.full((1, T, 1), 0.0, dtype, dev)
    else:
        qs, qtok = src(r.q_idx)
        q_idx = em.unsqueeze(em.reshape(qs, (T, R)) if qtok else em.expand(em.reshape(qs, (1, R)), (T, R)), 0)
        q_val = em.unsqueeze(product(r.q, R, r.coef, dtype), 0)
    G = W if (w.gate is not None and w.per_write_gate) else 1
    roles = canonical_roles(em, dict(k_idx=k_idx, k_val=k_val, v=v, beta=beta, g=g, q_idx=q_idx,
                                     q_val=q_val), 1, T, dict(W=W, R=R, G=G, hd=hd), dtype)
    k_idx, k_val, v, beta, g, q_idx, q_val = (roles[n] for n in ("k_idx", "k_val", "v", "beta", "g",
                                                                  "q_idx", "q_val"))
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


# ---------------------------------------------------------------- hoisting

def _closure(targets) -> set:
    """``targets`` and every body node they are computed from (up to placeholders)."""
    seen, stack = set(), list(targets)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op != "placeholder":
            stack.extend(n.all_input_nodes)
    return seen


def _plan_hoists(an, body, phs, per_token, outer, inner):
    """Role atoms computed inside the body -> [(traced aten graph, its outer input nodes,
    the body nodes it computes, batched over the tokens)]. Everything is checked and
    traced here; the parent graph is not touched."""
    from .optable import _is_impure
    inner = list(dict.fromkeys(inner))
    if not inner:
        return []
    carry = phs[0]
    tok = [n for n in inner if _closure([n]) & per_token]
    const = [n for n in inner if n not in tok]
    plans = []
    for targets, batched in ((tok, True), (const, False)):
        if not targets:
            continue
        cl = _closure(targets)
        names = ", ".join(sorted(t.name for t in targets))
        if carry in cl:
            raise Reject(f"per-token input(s) {names} depend on the bank carry")
        for n in sorted(cl, key=lambda n: n.name):
            if n in an.volatile:
                raise Reject(f"per-token input {n.name}, computed inside the scan body, is changed in "
                             "place there (not hoisted)")
            if n.op in ("call_function", "call_method") and _is_impure(n):
                who = ", ".join(sorted(t.name for t in targets if n in _closure([t])))
                raise Reject(f"per-token input(s) {who} are computed inside the scan body with "
                             f"{n.name}, which draws random numbers or mutates: hoisting it out of the "
                             "loop would change the program")
        used = [p for p in phs if p in cl]
        g = fx.Graph()
        env = {p: g.placeholder(p.name) for p in used}
        for n in body.graph.nodes:
            if n in cl and n.op != "placeholder":
                env[n] = g.node_copy(n, lambda x: env[x])
        g.output(tuple(env[t] for t in targets))
        part = fx.GraphModule(body, g)
        inputs = [outer[p] for p in used]
        traced = _trace(part, inputs, [p in per_token for p in used] if batched else None, names)
        plans.append((traced, inputs, targets, batched))
    return plans


def _trace(part: fx.GraphModule, inputs, in_dims, names):
    """``part`` (or ``vmap(part)`` over the inputs flagged in ``in_dims``) traced to a
    functional aten graph on fake copies of ``inputs``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    metas = [_meta(x) for x in inputs]
    if any(m is None for m in metas):
        raise Reject(f"per-token input(s) {names} are computed inside the scan body from a non-tensor")
    if any(not all(isinstance(d, int) for d in m.shape) for m in metas):
        raise Reject(f"per-token input(s) {names} are computed inside the scan body; hoisting them "
                     "needs static shapes")
    if in_dims is not None:
        dims = tuple(0 if b else None for b in in_dims)
        fn = torch.vmap(part, in_dims=dims)
    else:
        fn = part
    fallback = torch._C._functorch._is_vmap_fallback_enabled()
    mode = FakeTensorMode()
    try:
        torch._C._functorch._set_vmap_fallback_enabled(False)  # no per-token loop in the hoisted code
        with mode:
            fakes = [torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=m.device) for m in metas]
            traced = make_fx(torch.func.functionalize(fn, remove="mutations"))(*fakes)
    except Exception as e:      # noqa: BLE001 - the graph is untouched
        raise Reject(f"per-token input(s) {names} are computed inside the scan body in a way that "
                     f"cannot be applied to all tokens at once (not hoisted): {type(e).__name__}: "
                     f"{str(e).splitlines()[0] if str(e) else ''}") from None
    finally:
        torch._C._functorch._set_vmap_fallback_enabled(fallback)
    if any(n.op == "get_attr" for n in traced.graph.nodes):
        raise Reject(f"per-token input(s) {names} use a tensor constant made inside the scan body (not hoisted)")
    if any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
           and n.target._schema.is_mutable for n in traced.graph.nodes):
        raise Reject(f"per-token input(s) {names}: the hoisted computation mutates (not hoisted)")
    return traced


def _inline(graph: fx.Graph, before: fx.Node, traced: fx.GraphModule, inputs):
    """Copy ``traced``'s nodes in front of ``before``, its placeholders bound to
    ``inputs``; returns the nodes of its outputs."""
    env = dict(zip([n for n in traced.graph.nodes if n.op == "placeholder"], inputs))
    outs = None
    with graph.inserting_before(before):
        for n in traced.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                outs = fx.node.map_arg(n.args[0], lambda x: env[x])
                break
            new = graph.node_copy(n, lambda x: env[x])
            new.meta = {}       # fake values of the tracing mode are not the graph's
            env[n] = new
    return list(outs)
