"""Replace a recognised chain by one call of the fused op.

Per-token roles (atoms of the steps) are stacked into the op's canonical ``[P, T, *]``
layout in front of the call; the readings and the final bank replace every use of the
loop's results; the loop's nodes are erased. Emission is level-aware: torch functions
on Dynamo graphs, aten ops on post-grad graphs and exported programs.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from . import config
from .canonical import Reject, RoleFactor
from .distinct import proof
from .interpret import Analysis, Chain, location

__all__ = ["rewrite_chain", "Emitter"]

aten = torch.ops.aten


class Emitter:
    """Builds nodes in front of ``before``; ``aten`` selects the op level."""

    def __init__(self, graph: fx.Graph, before: fx.Node, aten_level: bool):
        self.g = graph
        self.before = before
        self.aten = aten_level

    def _call(self, fn, *args, **kwargs):
        with self.g.inserting_before(self.before):
            return self.g.call_function(fn, args, kwargs)

    def reshape(self, x, shape):
        return self._call(aten.reshape.default if self.aten else torch.reshape, x, list(shape))

    def mul(self, x, y):
        return self._call(aten.mul.Tensor if self.aten else torch.mul, x, y)

    def full(self, shape, value, dtype, device):
        return self._call(aten.full.default if self.aten else torch.full, list(shape), value,
                          dtype=dtype, device=device)

    def stack(self, xs):
        if self.aten:
            return self._call(aten.cat.default, [self._call(aten.unsqueeze.default, x, 0) for x in xs], 0)
        return self._call(torch.stack, list(xs), 0)

    def unsqueeze(self, x, d):
        return self._call(aten.unsqueeze.default if self.aten else torch.unsqueeze, x, d)

    def expand(self, x, shape):
        return self._call(aten.expand.default if self.aten else torch.broadcast_to, x, list(shape))

    def cast(self, x, dtype):
        if self.aten:
            return self._call(torch.ops.prims.convert_element_type.default, x, dtype)
        return self._call(torch.Tensor.to, x, dtype)

    def select(self, x, i, j):
        if self.aten:
            return self._call(aten.select.int, self._call(aten.select.int, x, 0, i), 0, j)
        return self._call(operator.getitem, x, (i, j))

    def slice0(self, x, start, stop):
        if self.aten:
            return self._call(aten.slice.Tensor, x, 0, start, stop)
        return self._call(operator.getitem, x, slice(start, stop))

    def select0(self, x, i):
        if self.aten:
            return self._call(aten.select.int, x, 0, i)
        return self._call(operator.getitem, x, i)

    def getitem(self, x, i):
        return self._call(operator.getitem, x, i)

    def call(self, op, *args):
        return self._call(op, *args)


def _factor(em: Emitter, rf: RoleFactor):
    """The atom of ``rf`` as a tensor over its one live axis (or a scalar)."""
    shape = rf.atom.shape
    live = [s for s, lb in zip(shape, rf.labels) if lb is not None]
    want = tuple(live)
    if tuple(shape) == want:
        return rf.atom.node
    return em.reshape(rf.atom.node, want)


def _product(em: Emitter, factors, size, coef, dtype, device, fill=1.0):
    """prod(factors) * coef broadcast to ``size`` (a shape), ones when there are none."""
    if not factors:
        return em.full(size, float(coef) * fill, dtype, device)
    x = _factor(em, factors[0])
    for rf in factors[1:]:
        x = em.mul(x, _factor(em, rf))
    if coef != 1.0:
        x = em.mul(x, float(coef))
    live = [s for s, lb in zip(factors[0].atom.shape, factors[0].labels) if lb is not None]
    if any(len([1 for lb in rf.labels if lb is not None]) for rf in factors) and size:
        return x if _has_axis(factors) else em.expand(x, size)
    return em.expand(x, size) if size else em.reshape(x, ())


def _has_axis(factors) -> bool:
    return any(lb is not None for rf in factors for lb in rf.labels)


def _consecutive_selects(nodes):
    """``nodes[t] == base[start + t]`` for one base: the stacked tensor is a slice of it."""
    base, start = None, None
    for t, n in enumerate(nodes):
        if not (isinstance(n, fx.Node) and n.op == "call_function" and n.target is operator.getitem
                and isinstance(n.args[1], int)):
            return None
        if base is None:
            base, start = n.args[0], n.args[1]
        if n.args[0] is not base or n.args[1] != start + t:
            return None
    return base, start


class _Roles:
    """Stacks one role over the tokens, reusing ``x[t]`` slices where the loop had them."""

    def __init__(self, em: Emitter):
        self.em = em

    def stack(self, per_token, fast_nodes=None):
        if fast_nodes is not None:
            hit = _consecutive_selects(fast_nodes)
            if hit is not None:
                base, start = hit
                v = base.meta.get("val", base.meta.get("example_value"))
                if v is not None and start == 0 and v.shape[0] == len(fast_nodes):
                    return self.em.unsqueeze(base, 0)
                return self.em.unsqueeze(self.em.slice0(base, start, start + len(fast_nodes)), 0)
        return self.em.unsqueeze(self.em.stack([f() for f in per_token]), 0)


def _single(factors):
    """The node when a role is one atom with all of its dims along the role axis."""
    if len(factors) == 1:
        rf = factors[0]
        if sum(lb is not None for lb in rf.labels) == len(rf.atom.shape):
            return rf.atom.node
    return None


def plan_insertion(an: Analysis, chain: Chain):
    """The node before which the op goes, and nodes that must move in front of it."""
    order = {n: i for i, n in enumerate(an.graph.nodes)}
    erase = set(chain.nodes) - {chain.bank.root}
    firsts = [e.consumer for e in an.escapes if e.consumer not in erase and chain.bank.id in
              _deps_of(e.value) and not (getattr(e.value, "version", None) == 0)]
    out = next(n for n in an.graph.nodes if n.op == "output")
    before = min(firsts, key=order.get) if firsts else out
    # the op must come after every write node (in place on a graph input)
    roles = _role_nodes(chain) | {chain.bank.root}
    late = [n for n in roles if order[n] >= order[before]]
    move = []
    if late:
        closure, stack = set(), list(late)
        while stack:
            n = stack.pop()
            if n in closure or order[n] < order[before]:
                continue
            closure.add(n)
            stack.extend(n.all_input_nodes)
        for n in closure:
            if n in erase or n.op in ("placeholder", "output") or n in an.volatile:
                raise Reject(f"a per-token input ({n.name}) is computed after the loop's results are used")
            from .optable import _is_impure
            if n.op in ("call_function", "call_method") and _is_impure(n):
                raise Reject(f"a per-token input ({n.name}) draws random numbers or mutates; "
                             "hoisting it would change the program")
        move = sorted(closure, key=order.get)
    for n in _role_closure(chain):
        if n in an.volatile:
            raise Reject(f"a per-token input ({n.name}) is changed in place inside the loop")
    return before, move


def _deps_of(v):
    from .interpret import _deps
    return _deps(v)


def _role_nodes(chain: Chain) -> set:
    out = set()
    for st in chain.steps:
        w = st.write
        out.add(w.k_idx.node)
        for rf in w.k + w.beta + w.v:
            out.add(rf.atom.node)
        if w.gate is not None:
            out.add(w.gate.atom.exp_of.node)
        if st.read is not None:
            out.add(st.read.q_idx.node)
            for rf in st.read.q:
                out.add(rf.atom.node)
    return out


def _role_closure(chain: Chain) -> set:
    seen, stack = set(), list(_role_nodes(chain))
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


def check_chain(an: Analysis, chain: Chain):
    """Everything that must hold before the graph is touched; returns (before, move)."""
    Ws = {st.write.W for st in chain.steps}
    hds = {st.write.hd for st in chain.steps}
    if len(Ws) != 1 or len(hds) != 1:
        raise Reject("tokens write different numbers of slots")
    if chain.bank.dtype not in (torch.float32, torch.bfloat16):
        raise Reject(f"bank dtype {chain.bank.dtype} (the op takes float32 or bfloat16)")
    Rs = {st.read.R for st in chain.steps if st.read is not None}
    if len(Rs) > 1:
        raise Reject("tokens read different numbers of slots")
    proofs = {proof(st.write.k_idx.node) for st in chain.steps}
    chain.distinct = None if None in proofs else sorted(proofs)[0]
    if chain.distinct is None and config.assume_distinct_write_slots:
        chain.distinct = "assumed (assume_distinct_write_slots)"
    return plan_insertion(an, chain)


def rewrite_chain(an: Analysis, chain: Chain, before, move, aten_level: bool, needs_grad: bool):
    g = an.graph
    for n in move:
        before.prepend(n)
    em = Emitter(g, before, aten_level)
    root = chain.bank.root
    S, hd = chain.bank.shape
    dtype = chain.bank.dtype
    dev = _device(root)
    steps = chain.steps
    W = steps[0].write.W
    reads = [st.read for st in steps]
    R = max([r.R for r in reads if r is not None] or [1])
    rs = _Roles(em)
    f32 = torch.float32

    k_idx = rs.stack([lambda w=st.write: _idx(em, w.k_idx) for st in steps],
                     [_plain(st.write.k_idx) for st in steps])
    k_val = rs.stack([lambda w=st.write: _product(em, w.k, (W,), 1.0, dtype, dev) for st in steps],
                     [_single(st.write.k) for st in steps] if all(_single(st.write.k) is not None for st in steps) else None)
    v = rs.stack([lambda w=st.write: _product(em, w.v, (hd,), 1.0, dtype, dev) for st in steps],
                 [_single(st.write.v) for st in steps] if all(_single(st.write.v) is not None and
                                                              st.write.coef == 1.0 for st in steps) else None)
    beta = rs.stack([lambda w=st.write: _product(em, w.beta, (), w.coef, f32, dev) for st in steps],
                    [_single(st.write.beta) if st.write.coef == 1.0 else None for st in steps])
    beta = em.reshape(beta, (1, len(steps)))
    per_write = any(st.write.per_write_gate for st in steps)
    G = W if per_write else 1
    g_ = rs.stack([lambda w=st.write: _gate(em, w, G, dev) for st in steps],
                  [w.gate.atom.exp_of.node if w.gate is not None and _single([w.gate]) is not None else None
                   for w in (st.write for st in steps)] if per_write and all(
                      st.write.gate is not None and _single([st.write.gate]) is not None for st in steps) else None)
    q_idx = rs.stack([lambda r=r: _idx(em, r.q_idx) if r is not None else
                      em.full((R,), 0, torch.int64, dev) for r in reads],
                     [_plain(r.q_idx) if r is not None else None for r in reads])
    q_val = rs.stack([lambda r=r: _product(em, r.q, (R,), r.coef, dtype, dev) if r is not None else
                      em.full((R,), 0.0, dtype, dev) for r in reads],
                     [_single(r.q) if r is not None and r.coef == 1.0 else None for r in reads])
    if chain.distinct is None:
        k_idx = em.call(torch.ops.sdm.check_distinct_write_slots.default, k_idx,
                        f"the token loop at {chain.where}")
    inplace = chain.bank.inplace_root and root.op in ("placeholder", "get_attr")
    bank_in = _unclone(root, set(chain.nodes)) if not inplace else root
    args = (bank_in, k_idx, k_val, v, beta, g_, q_idx, q_val, config.chunk_size, 0, False)
    if inplace and not needs_grad:
        readings = em.call(torch.ops.sdm.write_read_.default, *args)
        final = root
    else:
        out = em.call(torch.ops.sdm.write_read.default, *args, "none", False, needs_grad)
        readings, final = em.getitem(out, 0), em.getitem(out, 1)
        if inplace:
            em.call(aten.copy_.default if aten_level else torch.Tensor.copy_, root, final)
    # results
    done = _stacked_readings(em, g, chain, readings)
    for ver, lst in chain.reads.items():
        ref = steps[ver - 1].read
        for producer, r in lst:
            users = [e.consumer for e in an.escapes if e.producer is producer and e.consumer not in done]
            if not users:
                continue
            node = _reading(em, readings, ver - 1, r, ref, hd)
            for u in users:
                u.replace_input_with(producer, node)
    for e in chain.final_escapes:
        if e.producer is not final:
            e.consumer.replace_input_with(e.producer, final)
    for user in done:
        g.erase_node(user)
    _erase(g, set(chain.nodes) - {root})
    return readings


def _unclone(root, chain_nodes):
    """``x`` for a root ``x.clone()`` used only by the loop: the functional op copies the
    bank itself, so the loop's own clone would be a second copy."""
    is_clone = (root.op == "call_method" and root.target == "clone") or root.target in (
        torch.clone, aten.clone.default)
    if (is_clone and not root.kwargs and len(root.args) == 1 and isinstance(root.args[0], fx.Node)
            and all(u in chain_nodes for u in root.users)):
        return root.args[0]
    return root


def _stacked_readings(em, g, chain, readings) -> set:
    """``torch.stack([reading_1, ..., reading_T])`` becomes ``readings[0]`` (one view, not
    T selects and a copy); returns the stack nodes so replaced."""
    if em.aten:
        return set()
    order = {}
    for ver, lst in chain.reads.items():
        for producer, r in lst:
            if r.coef == chain.steps[ver - 1].read.coef and tuple(r.shape) == (chain.steps[0].write.hd,):
                order[producer] = ver
    done = set()
    T = chain.length
    for producer in list(order):
        for user in list(producer.users):
            if user in done or user.target is not torch.stack:
                continue
            items = user.args[0]
            dim = user.args[1] if len(user.args) > 1 else user.kwargs.get("dim", 0)
            if dim == 0 and len(items) == T and [order.get(x) for x in items] == list(range(1, T + 1)):
                user.replace_all_uses_with(em.select0(readings, 0))
                done.add(user)      # erased at the end: the emitter inserts in front of it
    return done


def _reading(em, readings, t, r, ref, hd):
    x = em.select(readings, 0, t)
    if r.coef != ref.coef:
        x = em.mul(x, r.coef / ref.coef)
    if tuple(r.shape) != (hd,):
        x = em.reshape(x, r.shape)
    return x


def _gate(em, w, G, dev):
    if w.gate is None:
        return em.full((G,), 0.0, torch.float32, dev)
    x = _factor(em, RoleFactor(w.gate.atom.exp_of, w.gate.labels))
    if not w.per_write_gate:
        x = em.reshape(x, (1,))
    return em.expand(x, (G,)) if G != 1 else x


def _idx(em, atom):
    live = tuple(s for s in atom.shape if s != 1) or (1,)
    return atom.node if tuple(atom.shape) == live else em.reshape(atom.node, live)


def _plain(atom):
    return atom.node if len(atom.shape) == 1 else None


def _device(node):
    v = node.meta.get("val", node.meta.get("example_value"))
    return v.device if isinstance(v, torch.Tensor) else torch.device("cpu")


def _erase(g: fx.Graph, nodes: set):
    for n in reversed(list(g.nodes)):
        if n in nodes:
            if any(u not in nodes for u in n.users):
                bad = [u.name for u in n.users if u not in nodes]
                raise RuntimeError(f"sdm rewrite: {n.name} still used by {bad}")
            g.erase_node(n)
            nodes.discard(n)
