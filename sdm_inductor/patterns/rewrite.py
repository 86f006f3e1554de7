"""Replace a recognised chain by one call of the fused op.

Per-token roles (atoms of the steps) are stacked into the op's canonical ``[P, T, *]``
layout in front of the call; the readings and the final bank replace every use of the
loop's results; the loop's nodes are erased. Emission is level-aware: torch functions
on Dynamo graphs, aten ops on post-grad graphs and exported programs.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F
import torch.fx as fx

from . import config
from .canonical import Reject, RoleFactor
from .distinct import proof
from .interpret import Analysis, Chain
from .safety import Checked, meta_value

__all__ = ["rewrite_chain", "Emitter", "canonical_roles"]

aten = torch.ops.aten


class Emitter:
    """Builds nodes in front of ``before``; ``aten`` selects the op level."""

    def __init__(self, graph: fx.Graph, before: fx.Node, aten_level: bool, check: Checked | None = None):
        self.g = graph
        self.before = before
        self.aten = aten_level
        self.check = check

    def _call(self, fn, *args, **kwargs):
        with self.g.inserting_before(self.before):
            node = self.g.call_function(fn, args, kwargs)
        if self.check is not None:
            self.check.record(node)
        return node

    def reshape(self, x, shape):
        return self._call(aten.reshape.default if self.aten else torch.reshape, x, list(shape))

    def mul(self, x, y):
        return self._call(aten.mul.Tensor if self.aten else torch.mul, x, y)

    def full(self, shape, value, dtype, device):
        return self._call(aten.full.default if self.aten else torch.full, list(shape), value,
                          dtype=dtype, device=device)

    def stack(self, xs, dim=0):
        if self.aten:
            return self._call(aten.cat.default, [self._call(aten.unsqueeze.default, x, dim) for x in xs], dim)
        return self._call(torch.stack, list(xs), dim)

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

    def permute(self, x, order):
        return self._call(aten.permute.default if self.aten else torch.permute, x, list(order))

    def add(self, x, y):
        return self._call(aten.add.Tensor if self.aten else torch.add, x, y)

    def log_decay(self, x, decay: str):
        """The log-decay ``g`` of a gate atom ``x`` (``Atom.decay``): ``x`` itself for
        ``exp(x)``, ``logsigmoid(x) = -softplus(-x)`` for ``sigmoid(x)``."""
        if decay == "exp":
            return x
        if self.aten:
            neg = aten.neg.default
            return self._call(neg, self._call(aten.softplus.default, self._call(neg, x)))
        return self._call(F.logsigmoid, x)

    def arange(self, n, device):
        return self._call(aten.arange.default if self.aten else torch.arange, n, device=device)

    def slice(self, x, dim, start, stop):
        if self.aten:
            return self._call(aten.slice.Tensor, x, dim, start, stop)
        return self._call(operator.getitem, x, (slice(None),) * dim + (slice(start, stop),))

    def select1(self, x, i):
        if self.aten:
            return self._call(aten.select.int, x, 1, i)
        return self._call(operator.getitem, x, (slice(None), i))

    def select0(self, x, i):
        if self.aten:
            return self._call(aten.select.int, x, 0, i)
        return self._call(operator.getitem, x, i)

    def getitem(self, x, i):
        return self._call(operator.getitem, x, i)

    def call(self, op, *args):
        return self._call(op, *args)


def _atom_value(em: Emitter, atom):
    """The tensor of ``atom``: its node, or its node viewed (a split atom) or broadcast
    over leading dims (an index shared by the streams) to the atom's shape."""
    x, have = atom.node, _meta_shape(atom.node)
    if have is None or have == list(atom.shape):
        return x
    if math.prod(have) != math.prod(atom.shape):
        lead = len(atom.shape) - len(have)
        return em.expand(em.reshape(x, [1] * lead + have), list(atom.shape))
    return em.reshape(x, list(atom.shape))


def _factor_to(em: Emitter, rf: RoleFactor, letters, sizes):
    """The atom of ``rf`` laid out along ``letters`` (size 1 where it does not vary)."""
    live = [(d, lb) for d, lb in zip(rf.atom.shape, rf.labels) if lb is not None]
    names = [lb for _, lb in live]
    x = _atom_value(em, rf.atom)
    if _meta_shape(x) != [d for d, _ in live]:      # size-1 dims (or a virtual atom's view)
        x = em.reshape(x, [d for d, _ in live])
    order = sorted(range(len(names)), key=lambda i: letters.index(names[i]))
    if order != list(range(len(names))):
        x = em.permute(x, order)
    target = [sizes[lt] if lt in names else 1 for lt in letters]
    if [d for d, _ in sorted(live, key=lambda p: letters.index(p[1]))] != target:
        x = em.reshape(x, target)
    return x


def _role(em: Emitter, factors, letters, sizes, coef, dtype, dev):
    """prod(factors) * coef as a tensor of shape [sizes[l] for l in letters]."""
    shape = [sizes[lt] for lt in letters]
    if not factors:
        return em.full(shape, float(coef), dtype, dev)
    x = None
    for rf in factors:
        y = _factor_to(em, rf, letters, sizes)
        x = y if x is None else em.mul(x, y)
    if coef != 1.0:
        x = em.mul(x, float(coef))
    return em.expand(x, shape)


def _plain(factors, coef, letters, sizes, target):
    """The node itself when one atom already has the per-token layout (for the fast path)."""
    if len(factors) != 1 or coef != 1.0:
        return None
    rf = factors[0]
    names = [lb for lb in rf.labels if lb is not None]
    if names != sorted(names, key=letters.index):
        return None
    shape = list(rf.atom.shape)
    if _meta_shape(rf.atom.node) != shape:       # a virtual atom (a view of its node)
        return None
    return rf.atom.node if shape in (list(target), list(target[1:])) and (
        shape == list(target) or not any(n.startswith("s") for n in names)) else None


def _consecutive_selects(nodes):
    """``nodes[t] == base[start + t]`` (or ``base[:, start + t]``) for one base: the
    stacked tensor is a slice of it. Returns (base, start, axis) or None."""
    base = start = axis = None
    for t, n in enumerate(nodes):
        if not (isinstance(n, fx.Node) and n.op == "call_function" and n.target is operator.getitem):
            return None
        idx = n.args[1]
        if isinstance(idx, int):
            ax, i = 0, idx
        elif (isinstance(idx, tuple) and len(idx) == 2 and idx[0] == slice(None) and isinstance(idx[1], int)):
            ax, i = 1, idx[1]
        else:
            return None
        if base is None:
            base, start, axis = n.args[0], i, ax
        if n.args[0] is not base or ax != axis or i != start + t:
            return None
    return base, start, axis


def _meta_shape(n):
    v = n.meta.get("val", n.meta.get("example_value")) if isinstance(n, fx.Node) else None
    return list(v.shape) if isinstance(v, torch.Tensor) else None


def _stack(em: Emitter, per_token, plain, P: int):
    """Per-token tensors [P, *] -> [P, T, *]; a slice of the loop's own input when the
    tokens were ``x[t]`` (P = 1) or ``x[:, t]`` selects of it."""
    T = len(per_token)
    if plain is not None and all(n is not None for n in plain):
        hit = _consecutive_selects(plain)
        if hit is not None:
            base, start, axis = hit
            shape = _meta_shape(base)
            if shape is not None and (axis == 0) == (P == 1 and _meta_shape(plain[0]) == shape[1:]):
                if axis == 0:
                    x = base if (start == 0 and shape[0] == T) else em.slice(base, 0, start, start + T)
                    return em.unsqueeze(x, 0)
                if shape[0] == P:
                    return base if (start == 0 and shape[1] == T) else em.slice(base, 1, start, start + T)
    return em.stack([f() for f in per_token], 1)


def plan_insertion(an: Analysis, chain: Chain):
    """The node before which the op goes, and nodes that must move in front of it."""
    order = {n: i for i, n in enumerate(an.graph.nodes)}
    erase = set(chain.nodes) - {chain.bank.root}
    # the op goes before the first surviving use of any value of the loop
    firsts = [u for n in erase for u in n.users if u not in erase]
    firsts += [e.consumer for e in an.escapes if e.consumer not in erase and chain.bank.id in
               _deps_of(e.value) and getattr(e.value, "version", None) != 0]
    firsts += _after_the_loop_on_its_memory(an, chain)
    out = next(n for n in an.graph.nodes if n.op == "output")
    before = min(firsts, key=order.get) if firsts else out
    # every per-token input and the bank root must exist before the op: those computed
    # later move in front of it with their inputs (a loop node among them: rejected)
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
    _no_other_view_of_the_bank(an, chain)
    proofs = {"one write slot per token" if st.write.W == 1 else proof(st.write.k_idx.node)
              for st in chain.steps}
    chain.distinct = None if None in proofs else sorted(proofs)[0]
    if chain.distinct is None and config.assume_distinct_write_slots:
        chain.distinct = "assumed (assume_distinct_write_slots)"
    return plan_insertion(an, chain)


def _on_its_memory(an: Analysis, chain: Chain):
    """For a bank written in place: (graph order, its last write's position, the nodes
    other than the loop's whose tensors share the bank's memory), or None."""
    if not any(rec.inplace for rec in chain.bank.writes.values()):
        return None
    mem = an._storage(chain.bank.root)
    if mem is None:
        return None
    order = {n: i for i, n in enumerate(an.graph.nodes)}
    last = max(order[rec.node] for rec in chain.bank.writes.values())
    ours = set(chain.nodes) | {chain.bank.root}
    sharers = [n for n in an.graph.nodes if n not in ours and n.op != "output"
               and (st := an._storage(n)) is not None and st.cdata == mem.cdata]
    return order, last, sharers


def _no_other_view_of_the_bank(an: Analysis, chain: Chain):
    """A bank written in place changes every tensor that shares its memory: a loop that
    reads such a tensor (``v`` given as rows of the bank, a view taken inside the loop)
    sees the writes of the tokens before, where the op reads its inputs as they were at
    the call. Refuse when a tensor sharing the bank's memory, other than the bank and the
    loop's own reads of it, is taken or used while the loop runs (from its first access
    of the bank to its last write). Uses before the loop see the first state in both
    programs, and the op goes in front of uses after it (``_after_the_loop_on_its_memory``)."""
    found = _on_its_memory(an, chain)
    if found is None:
        return
    order, last, sharers = found
    root = chain.bank.root
    first = min(order[n] for n in chain.nodes if n is not root)
    for n in sharers:
        # (the bank may be a view of ``n``: taking it is not a read)
        if any(first <= p <= last for p in [order[n]] + [order[u] for u in n.users if u is not root]):
            raise Reject(f"{an.fe.describe(n)} shares memory with the bank written in place "
                         "(the loop would read the writes of the tokens before it)")


def _after_the_loop_on_its_memory(an: Analysis, chain: Chain) -> list:
    """Nodes after the loop's last in-place write that touch the bank's memory through
    another tensor (the base of a bank that is a view, other views of it): they must see
    the final bank, so the op goes in front of them."""
    found = _on_its_memory(an, chain)
    if found is None:
        return []
    order, last, sharers = found
    ours = set(chain.nodes) | {chain.bank.root}
    out = []
    for n in sharers:
        out += [n] if order[n] > last else [u for u in n.users if order[u] > last and u not in ours]
    return out


def rewrite_chain(an: Analysis, chain: Chain, before, move, aten_level: bool, needs_grad: bool):
    """Stack the roles in front of ``before``, call the op, point every surviving use of
    the loop's values at its outputs, erase the loop. The replacement is built and
    checked on fake tensors first (the op's own argument rules); a refusal leaves the
    graph as it was and raises ``Reject`` with the op's reason."""
    g = an.graph
    check = Checked(g, an.fe.META)
    for n in move:
        before.prepend(n)
    em = Emitter(g, before, aten_level, check)
    try:
        readings, final, inplace, groups, dims = _build(em, chain, needs_grad)
    except Exception as e:
        check.undo(g)
        if isinstance(e, Reject):
            raise
        raise Reject(f"the replacement could not be built: {e!r}") from e
    erase = set(chain.nodes) - {chain.bank.root}
    done = _stacked_readings(em, g, chain, readings, groups)
    per_group = chain.length // groups if groups > 1 else 0
    for ver, lst in chain.reads.items():
        ref = chain.steps[ver - 1].read
        for producer, r in lst:
            users = [u for u in producer.users if u not in erase and u not in done]
            if users:
                node = _reading(em, readings, ver - 1, r, ref, dims["hd"], dims["P"], per_group)
                for u in users:
                    u.replace_input_with(producer, node)
    for e in chain.final_escapes:
        if e.producer is not final:
            e.consumer.replace_input_with(e.producer, final)
    if not inplace:
        _later_uses_read_final(g, chain, erase, final)
    for user in done:
        g.erase_node(user)
    _detach_metadata_uses(an, g, erase, aten_level)
    _erase(g, erase)
    return readings


def _detach_metadata_uses(an: Analysis, g: fx.Graph, erase: set, aten_level: bool) -> None:
    """Uses of the loop's values for their shape, dtype or device only (``zeros_like(M)``,
    ``x.expand_as(rows)``) stay: they get an uninitialised tensor of that metadata in
    place of the erased value (compilers drop it; only its metadata is read)."""
    for n in list(erase):
        for u in list(n.users):
            if u in erase or n not in an.fe.metadata_inputs(u):
                continue
            v = meta_value(n)
            if not isinstance(v, torch.Tensor):
                raise RuntimeError(f"sdm rewrite: no metadata of {n.name} for its use by {u.name}")
            em = Emitter(g, u, aten_level)
            if aten_level:
                empty = em._call(aten.empty.memory_format, list(v.shape), dtype=v.dtype, device=v.device)
            else:
                empty = em._call(torch.empty, list(v.shape), dtype=v.dtype, device=v.device)
            empty.meta[an.fe.META] = v
            u.replace_input_with(n, empty)


def _build(em: Emitter, chain: Chain, needs_grad: bool):
    """The op call replacing ``chain``, its inputs in canonical form, nothing rewired yet."""
    roles, dims = _stacked_roles(em, chain)
    roles = canonical_roles(em, roles, dims["P"], chain.length, dims, chain.bank.dtype)
    groups = stream_split(chain, dims["dev"])
    if groups > 1:
        # p-major tokens of streams run one after the other -> [groups, T, *] streams
        Tg = chain.length // groups
        for name, n in dict(k_idx=dims["W"], k_val=dims["W"], v=dims["hd"], g=dims["G"],
                            q_idx=dims["R"], q_val=dims["R"]).items():
            roles[name] = em.reshape(roles[name], (groups, Tg, n))
        roles["beta"] = em.reshape(roles["beta"], (groups, Tg))
    readings, final, inplace = _call_op(em, chain, roles, dims, groups, needs_grad)
    return readings, final, inplace, groups, dims


_INDEX_DTYPES = (torch.int32, torch.int64)


def canonical_roles(em: Emitter, roles: dict, P: int, T: int, dims: dict, dtype) -> dict:
    """Each role in the op's canonical form (``validation.check_call``): indices
    ``[P, T, W|R]`` int32/int64, ``k_val``/``v``/``q_val`` ``[P, T, *]`` in the bank's
    dtype, ``beta`` ``[P, T]`` and ``g`` ``[P, T, 1|W]`` float32. Size-1 dims are dropped
    or added (``[T, 1]`` gates), scalars broadcast, dtypes cast; a role whose live dims
    do not line up is refused (never reshaped across dims)."""
    want = dict(k_idx=([P, T, dims["W"]], None), k_val=([P, T, dims["W"]], dtype),
                v=([P, T, dims["hd"]], dtype), beta=([P, T], torch.float32),
                g=([P, T, dims["G"]], torch.float32), q_idx=([P, T, dims["R"]], None),
                q_val=([P, T, dims["R"]], dtype))
    out = {}
    for name, (shape, dt) in want.items():
        x = roles[name]
        v = meta_value(x)
        if not isinstance(v, torch.Tensor):
            raise Reject(f"role {name} has no metadata")
        have = list(v.shape)
        if have != shape:
            if [d for d in have if d != 1] == [d for d in shape if d != 1]:
                x = em.reshape(x, shape)
            elif _broadcasts(have, shape):
                x = em.expand(x, shape)
            else:
                raise Reject(f"{name} would be {have}, the op takes {shape}")
        if dt is None:
            if v.dtype not in _INDEX_DTYPES:
                if v.dtype.is_floating_point or v.dtype == torch.bool:
                    raise Reject(f"{name} has dtype {v.dtype}, not integer rows")
                x = em.cast(x, torch.int64)
        elif v.dtype != dt:
            x = em.cast(x, dt)
        out[name] = x
    return out


def _broadcasts(have, shape) -> bool:
    if len(have) > len(shape):
        return False
    have = [1] * (len(shape) - len(have)) + list(have)
    return all(a in (1, b) for a, b in zip(have, shape))


def _stacked_roles(em: Emitter, chain: Chain):
    """Each role of every token, stacked into the op's ``[P, T, *]`` layout."""
    root = chain.bank.root
    hd, dtype, dev = chain.bank.shape[-1], chain.bank.dtype, _device(root)
    steps = chain.steps
    W, P = steps[0].write.W, steps[0].write.streams or 1
    reads = [st.read for st in steps]
    R = max([r.R for r in reads if r is not None] or [1])
    gates = [st.write.gate for st in steps]
    G = W if any(st.write.per_write_gate for st in steps) else 1
    # the stream axes, one letter each ([B, H, S, hd] banks: two), flattened to P at the end
    S = tuple(f"s{i}" for i in range(max(len(steps[0].write.stream_shape), 1)))
    sz = dict(zip(S, steps[0].write.stream_shape or (P,))) | {"w": W, "d": hd, "r": R}
    SW, SD, SR, S_ = S + ("w",), S + ("d",), S + ("r",), S
    several = len(S) > 1

    def flat(x, rest):
        return em.reshape(x, (P, *rest)) if several else x

    def role(get, letters, dt, coef=lambda x: 1.0, items=steps):
        target = [sz[lt] for lt in letters]
        rest = [sz[lt] for lt in letters[len(S):]]
        per = [(lambda x=x: flat(_role(em, get(x), letters, sz, coef(x), dt, dev), rest)) for x in items]
        plain = [None if several else _plain(get(x), coef(x), letters, sz, target) for x in items]
        return _stack(em, per, plain, P)

    def index(atoms, n):
        per = [(lambda a=a: em.reshape(_atom_value(em, a), (P, n)) if a is not None else
                em.full((P, n), 0, torch.int64, dev)) for a in atoms]
        plain = [a.node if a is not None and not several and list(a.shape) in ([n], [P, n])
                 and _meta_shape(a.node) == list(a.shape) else None for a in atoms]
        return _stack(em, per, plain, P)

    def gate(w):
        gt, log_a = w.gate, math.log(w.decay_coef)     # (a number on the decay: rows * 0.9)
        if gt is None:
            return em.full((P, G), log_a, torch.float32, dev)
        g = _factor_to(em, RoleFactor(gt.atom.exp_of, gt.labels), SW, sz)
        g = em.log_decay(g, gt.atom.exp_of.decay)
        if log_a != 0.0:
            g = em.add(g, log_a)
        return flat(em.expand(g, [sz[lt] for lt in S] + [G]), (G,))

    roles = dict(
        k_idx=index([st.write.k_idx for st in steps], W),
        k_val=role(lambda st: st.write.k, SW, dtype),
        v=role(lambda st: st.write.v, SD, dtype, coef=lambda st: st.write.v_coef),
        beta=role(lambda st: st.write.beta, S_, torch.float32, coef=lambda st: st.write.coef),
        q_idx=index([r.q_idx if r is not None else None for r in reads], R),
        q_val=role(lambda r: r.q if r is not None else [], SR, dtype,
                   coef=lambda r: r.coef if r is not None else 0.0, items=reads))
    if all(gt is None for gt in gates) and all(st.write.decay_coef == 1.0 for st in steps):
        G = 1
        roles["g"] = em.full((P, len(steps), 1), 0.0, torch.float32, dev)
    else:
        plain = [_plain([RoleFactor(gt.atom.exp_of, gt.labels)], 1.0, SW, sz, [P, G])
                 if gt is not None and gt.atom.exp_of.decay == "exp" and not several
                 and st.write.decay_coef == 1.0 else None
                 for gt, st in zip(gates, steps)]
        roles["g"] = _stack(em, [lambda st=st: gate(st.write) for st in steps], plain, P)
    return roles, dict(P=P, W=W, R=R, G=G, hd=hd, dev=dev)


def _call_op(em: Emitter, chain: Chain, roles, dims, groups: int, needs_grad: bool):
    """The op call: (readings, final bank node, whether the root is advanced in place)."""
    root, P, hd, dev = chain.bank.root, dims["P"], dims["hd"], dims["dev"]
    k_idx, q_idx = roles["k_idx"], roles["q_idx"]
    batched_bank = len(chain.bank.shape) >= 3
    slots = 0
    if batched_bank:
        # [B, (H,) S, hd] bank: the op's flat bank of P private row ranges, global row indices
        slots = chain.bank.shape[-2]
        base = em.reshape(em.mul(em.arange(P, dev), slots), (P, 1, 1))
        k_idx, q_idx = em.add(k_idx, base), em.add(q_idx, base)
    if chain.distinct is None:
        k_idx = em.call(torch.ops.sdm.check_distinct_write_slots.default, k_idx,
                        f"the token loop at {chain.where}")
    # written in place: a graph input, or a view (``M[h]``) whose base sees the writes
    inplace = chain.bank.inplace_root and (root.op in ("placeholder", "get_attr") or _is_view(root))
    # uses of an in-place root after the loop are redirected to the final bank
    redirected = {e.consumer for e in chain.final_escapes} if chain.bank.inplace_root else set()
    bank_in = _unclone(root, set(chain.nodes), redirected) if not inplace else root
    if batched_bank:
        bank_in = em.reshape(bank_in, (P * slots, hd))
    # several streams on a flat bank: the op checks that their rows are disjoint
    shared = (P > 1 or groups > 1) and not batched_bank
    args = (bank_in, k_idx, roles["k_val"], roles["v"], roles["beta"], roles["g"], q_idx, roles["q_val"],
            config.chunk_size, slots, shared)
    if inplace and not needs_grad:
        return em.call(torch.ops.sdm.write_read_.default, *args), root, True
    out = em.call(torch.ops.sdm.write_read.default, *args, "none", False, needs_grad)
    readings, final = em.getitem(out, 0), em.getitem(out, 1)
    if batched_bank:
        final = em.reshape(final, chain.bank.shape)
    if inplace:
        em.call(aten.copy_.default if em.aten else torch.Tensor.copy_, root, final)
    return readings, final, inplace


def remove_dead_code(g: fx.Graph) -> None:
    """Erase unused pure nodes. Not ``Graph.eliminate_dead_code``: Dynamo's graph holds
    in-place methods (``M.mul_(0.5)``) whose results nobody uses but whose effect counts."""
    from .optable import _is_impure
    for n in reversed(list(g.nodes)):
        if n.users or n.op not in ("call_function", "call_method") or _is_impure(n) or n.is_impure():
            continue
        if n.kwargs.get("out") is not None or (n.op == "call_function" and n.target is operator.setitem):
            continue
        g.erase_node(n)


def _later_uses_read_final(g, chain, erase, final):
    """A bank written in place (``M[idx] = ...`` on a clone) is one node for all its
    states: its uses after the loop (a foreign in-place op, the output) must see the
    final state, which now lives in the op's output."""
    targets = {rec.target for rec in chain.bank.writes.values() if rec.inplace}
    if not targets:
        return
    after, seen = set(), False
    for n in g.nodes:
        if n is final:
            seen = True
        elif seen:
            after.add(n)
    for x in targets:
        for u in list(x.users):
            if u in after and u not in erase:
                u.replace_input_with(x, final)


def _is_view(node) -> bool:
    v = meta_value(node)
    return isinstance(v, torch.Tensor) and v._is_view()


def _unclone(root, chain_nodes, redirected):
    """``x`` for a root ``x.clone()`` used only by the loop (and by uses after it, which
    read the op's final bank): the functional op copies the bank itself, so the loop's
    own clone would be a second copy."""
    is_clone = (root.op == "call_method" and root.target == "clone") or root.target in (
        torch.clone, aten.clone.default)
    if (is_clone and not root.kwargs and len(root.args) == 1 and isinstance(root.args[0], fx.Node)
            and all(u in chain_nodes or u in redirected for u in root.users)):
        return root.args[0]
    return root


def stream_split(chain: Chain, device) -> int:
    """Streams run one after the other (``for p: for t:`` over ``x[p, t]``, like
    ``sdm_inductor.nn``'s naive loop): P groups of T tokens, p-major. Run as P streams of
    the op (``shared_bank=True``), which gives the loop's result exactly when no row
    written by one stream is touched by another -- checked by the op at run time (it
    refuses otherwise), so it is done only on request (``config.split_sequential_streams``)
    and while that check is on (``sdm_inductor.ops.CHECK_INDICES``). Returns P (1: keep
    one stream)."""
    from .. import ops
    if (not config.split_sequential_streams or chain.steps[0].write.streams or len(chain.bank.shape) != 2
            or not ops.CHECK_INDICES.get(device.type, True)):
        return 1
    nodes = [st.write.k_idx.node for st in chain.steps]
    base, pairs = None, []
    for n in nodes:
        if not (n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[1], tuple)
                and len(n.args[1]) == 2 and all(isinstance(i, int) for i in n.args[1])):
            return 1
        if base is None:
            base = n.args[0]
        if n.args[0] is not base:
            return 1
        pairs.append(n.args[1])
    shape = _meta_shape(base)
    if shape is None or len(shape) != 3:
        return 1
    P, T = shape[0], shape[1]
    if P < 2 or len(nodes) != P * T or pairs != [(p, t) for p in range(P) for t in range(T)]:
        return 1
    return P


def _stacked_readings(em, g, chain, readings, groups: int = 1) -> set:
    """``torch.stack([reading_1, ..., reading_T])`` becomes ``readings[0]`` (one view, not
    T selects and a copy); returns the stack nodes so replaced."""
    if em.aten:
        return set()
    order = {}
    for ver, lst in chain.reads.items():
        for producer, r in lst:
            if r.coef == chain.steps[ver - 1].read.coef and tuple(r.shape) == (chain.steps[0].write.hd,) \
                    and not chain.steps[0].write.streams:
                order[producer] = ver
    done = set()
    T = chain.length // groups
    for producer in list(order):
        for user in list(producer.users):
            if user in done or user.target is not torch.stack:
                continue
            items = user.args[0]
            dim = user.args[1] if len(user.args) > 1 else user.kwargs.get("dim", 0)
            first = order.get(items[0]) if items else None
            if (dim == 0 and len(items) == T and first is not None and (first - 1) % T == 0
                    and [order.get(x) for x in items] == list(range(first, first + T))):
                user.replace_all_uses_with(em.select0(readings, (first - 1) // T))
                done.add(user)      # erased at the end: the emitter inserts in front of it
    return done


def _reading(em, readings, t, r, ref, hd, P, per_group=0):
    if per_group:
        p, t = divmod(t, per_group)
        x = em.select(readings, p, t)
    else:
        x = em.select(readings, 0, t) if P == 1 else em.select1(readings, t)
    if r.coef != ref.coef:
        x = em.mul(x, r.coef / ref.coef)
    if tuple(r.shape) != ((hd,) if P == 1 else (P, hd)):
        x = em.reshape(x, r.shape)
    return x


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
