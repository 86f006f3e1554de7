"""Abstract interpretation of an FX graph into ``algebra`` values, and chain linking.

One pass over the nodes in order (so in-place writes on the Dynamo IR are seen in
program order): bank-independent nodes become atoms, bank rows and linear
combinations of them become ``Sym``s, writes into rows of a bank advance its version,
and anything else that touches the bank becomes ``Opaque``. Where a bank-dependent value
meets an op outside the algebra it *escapes*; afterwards every bank is checked: its
writes must be canonical token steps, its escapes readings or its final state, and it
must not be derived from another bank through foreign ops. Front-ends (torch-level and
aten-level) supply only the op table (``optable.TorchOps`` / ``optable.AtenOps``).
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

import torch.fx as fx

from . import algebra as A
from .algebra import Atom, BankVal, NotSymbolic, Sym
from .canonical import ReadRoles, Reject, WriteRoles, match_read, match_write

__all__ = ["Opaque", "WriteOp", "ZeroBuf", "Scattered", "Analysis", "Chain", "Rejected"]


@dataclass
class Opaque:
    """A value that depends on banks ``deps`` in a way outside the algebra."""
    deps: frozenset
    why: str = ""


@dataclass
class ZeroBuf:
    """A zero tensor made from a bank's metadata (``zeros_like(M)``, ``M.new_zeros(...)``):
    a buffer that a delta is scattered into before it is added to the bank."""
    shape: tuple


@dataclass
class Scattered:
    """A ``ZeroBuf`` with ``vals`` written (or added) at rows ``idx``: ``M + upd`` is then
    the write ``M.index_add(rows idx, vals)``."""
    shape: tuple
    idx: object
    vals: object


@dataclass
class Merged:
    """A bank-dependent value with leading dims merged (``new.reshape(-1, hd)`` of
    ``[B, W, hd]`` rows): kept whole, it may only be written at rows whose index splits
    the same way (``M.index_put((idx_flat,), new.reshape(-1, hd))``)."""
    inner: Sym
    shape: tuple


@dataclass
class WriteOp:
    """What a front-end returns for a write into bank rows."""
    target: object          # fx node written (in place) or read (functional)
    idx: Sym
    vals: Sym
    accumulate: bool
    inplace: bool


@dataclass
class WriteRec:
    node: fx.Node
    version: int            # the state written from
    idx: Atom
    vals: Sym
    inplace: bool
    target: fx.Node


@dataclass
class Bank:
    id: int
    root: fx.Node
    shape: tuple
    dtype: object
    writes: dict = field(default_factory=dict)      # version -> WriteRec
    reject: str | None = None
    derived_from: frozenset = frozenset()
    inplace_root: bool = False                       # writes mutate the root node itself
    attempts: int = 0                                # writes seen (also the rejected ones)


@dataclass
class Escape:
    consumer: fx.Node
    producer: fx.Node
    value: object


@dataclass
class Step:
    write: WriteRoles
    read: ReadRoles | None
    node: fx.Node


@dataclass
class Chain:
    bank: Bank
    steps: list
    reads: dict                  # step (1-based) -> list of (producer node, ReadRoles)
    final_escapes: list          # Escapes of the final state
    nodes: list                  # every node whose value depends on this bank (erased on rewrite)
    distinct: str | None = None  # how distinct write slots are known (None: runtime check)
    where: str = ""

    @property
    def length(self) -> int:
        return len(self.steps)


@dataclass
class Rejected:
    where: str
    tokens: int
    reason: str
    root: object = None      # the bank's root node (identifies the candidate across rounds)


def _deps(v) -> frozenset:
    if isinstance(v, BankVal):
        return frozenset({v.bank_id})
    if isinstance(v, Opaque):
        return v.deps
    if isinstance(v, Sym):
        return frozenset(r[0] for r in v.bank_refs())
    if isinstance(v, Scattered):
        return _deps(v.vals)
    if isinstance(v, Merged):
        return _deps(v.inner)
    if isinstance(v, (list, tuple)):
        out = frozenset()
        for x in v:
            out |= _deps(x)
        return out
    return frozenset()


def location(node: fx.Node) -> str:
    """``file:line`` of the user code behind ``node`` (the last frame of its stack trace)."""
    st = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in st.splitlines() if ln.strip().startswith("File ")]
    if not lines:
        return f"node {node.name}"
    last = lines[-1]
    try:
        path = last.split('"')[1].rsplit("/", 1)[-1]
        line = last.split("line ")[1].split(",")[0]
        return f"{path}:{line}"
    except IndexError:
        return last


class Analysis:
    def __init__(self, graph: fx.Graph, frontend):
        self.graph = graph
        self.fe = frontend
        self.space = A.LabelSpace()
        self.env: dict = {}
        self.banks: dict[int, Bank] = {}
        self.escapes: list[Escape] = []
        self.node_banks: dict = {}         # node -> bank ids its value depends on
        self.volatile: set = set()         # leaf nodes mutated by foreign in-place ops
        self.kept: set = set()             # bank-dependent nodes recomputed from readings (kept)
        self.roots = frontend.write_targets(graph)
        self._keys: dict = {}
        self._intern: dict = {}
        self._storages: dict = {}
        self._by_storage: dict = {}
        self._indexed = 0

    # ---------------------------------------------------------------- values
    def atom_key(self, node: fx.Node):
        key = self._keys.get(node)
        if key is None:
            raw = self.fe.value_key(node, self.atom_key)
            if isinstance(raw, tuple) and len(raw) == 2 and raw[0] == "alias":
                key = raw[1]        # the same values (an index cast between int32 and int64)
            else:
                key = self._intern.setdefault(raw, len(self._intern)) if raw is not None else ("unique", node.name)
            self._keys[node] = key
        return key

    def virtual_atom(self, raw_key, node: fx.Node, shape) -> Sym:
        """An atom for the value ``raw_key`` computes, of ``shape``, materialised by
        reshaping ``node`` (same elements, other size-1 dims)."""
        key = self._intern.setdefault(raw_key, len(self._intern))
        return Sym.atom(self.space, Atom(key, node, tuple(shape)))

    def split_atom(self, atom: Atom, dim: int, sizes) -> Atom:
        """``atom`` viewed with dim ``dim`` split into ``sizes`` (same elements, same node)."""
        shape = tuple(atom.shape[:dim]) + tuple(sizes) + tuple(atom.shape[dim + 1:])
        key = self._intern.setdefault(("split", atom.key, dim, tuple(sizes)), len(self._intern))
        exp_of = self.split_atom(atom.exp_of, dim, sizes) if atom.exp_of is not None else None
        return Atom(key, atom.node, shape, exp_of, atom.decay)

    def expand_atom(self, atom: Atom, lead) -> Atom:
        """``atom`` broadcast over new leading dims ``lead`` (one index for every stream of
        a batched bank: ``M[:, idx]``); its node is the unexpanded tensor."""
        key = self._intern.setdefault(("expand", atom.key, tuple(lead)), len(self._intern))
        return Atom(key, atom.node, tuple(lead) + tuple(atom.shape))

    def unmerge(self, op: "WriteOp") -> "WriteOp":
        """A write of ``Merged`` values at a flat index: the same write with the index
        split like the values' leading dims (``[B*W]`` rows -> ``[B, W]``)."""
        vals = op.vals
        if not isinstance(vals, Merged):
            return op
        inner = vals.inner
        if (not isinstance(op.idx, Sym) or len(vals.shape) != 2 or len(inner.shape) < 2
                or vals.shape[-1] != inner.shape[-1] or tuple(op.idx.shape) != tuple(vals.shape[:1])):
            raise NotSymbolic("the written rows are merged from other dims than the index's")
        idx = A.split(self.space, op.idx, tuple(inner.shape[:-1]), self.split_atom)
        return WriteOp(op.target, idx, inner, op.accumulate, op.inplace)

    def leaf(self, node: fx.Node) -> Sym | None:
        shape = self.fe.shape(node)
        if shape is None:
            return None
        exp_arg, decay = self.fe.exp_arg(node) or (None, "exp")
        exp_of = None
        if exp_arg is not None and isinstance(self.env.get(exp_arg), Sym):
            exp_of = Atom(self.atom_key(exp_arg), exp_arg, shape, decay=decay)
        return Sym.atom(self.space, Atom(self.atom_key(node), node, shape, exp_of))

    def value(self, x):
        if isinstance(x, fx.Node):
            return self.env.get(x)
        if isinstance(x, bool) or x is None:
            return x
        if isinstance(x, (int, float)):
            return Sym.scalar(x)
        if isinstance(x, (list, tuple)):
            return type(x)(self.value(y) for y in x)
        return x

    # ---------------------------------------------------------------- the pass
    def run(self) -> "Analysis":
        self.position = {n: i for i, n in enumerate(self.graph.nodes)}
        for node in self.graph.nodes:
            self.visit(node)
        return self

    def last_use(self, x: fx.Node, node: fx.Node) -> bool:
        """``node`` is the last use of ``x`` and of every tensor sharing its memory (an
        in-place op there changes nothing seen later)."""
        pos = self.position
        for n in self._aliases(x):
            if any(u is not node and pos.get(u, -1) > pos[node] for u in n.users):
                return False
        return True

    def _inputs(self, node):
        """The inputs whose values ``node`` uses (not those it takes only the shape,
        dtype or device of: ``zeros_like(M)``, ``x.expand_as(rows)``, ``M.new_empty(...)``)."""
        meta = self.fe.metadata_inputs(node)
        return [n for n in node.all_input_nodes if n not in meta]

    def visit(self, node: fx.Node):
        ins = self._inputs(node)
        dep = frozenset()
        for n in ins:
            dep |= _deps(self.env.get(n))
        if node.op == "output":
            self._escape(node, ins)
            return
        zero = self.fe.zero_buffer(self, node)
        if zero is not None:
            self.env[node] = zero
            return
        if node in self.roots and not dep and node.op != "output":
            shape = self.fe.shape(node)
            if shape is not None and len(shape) in (2, 3, 4):
                bid = len(self.banks)
                self.banks[bid] = Bank(bid, node, shape, self.fe.dtype(node))
                self.env[node] = BankVal(bid, 0, shape)
                self.node_banks[node] = {bid}
                return
        try:
            out = self.fe.evaluate(self, node) if node.op == "call_function" or node.op == "call_method" else None
        except NotSymbolic as e:
            out = Opaque(dep, str(e)) if dep else None
            if dep:
                self._escape(node, ins)
                self._foreign_inplace(node, dep)
                self._set(node, out)
                return
        if isinstance(out, WriteOp):
            self._write(node, out, dep)
            return
        if len(dep) > 1:
            # values of two banks meet: each leaves its own loop here (a later round may
            # rewrite the second loop once the first one's readings are the op's outputs)
            self._escape(node, ins)
            self._foreign_inplace(node, dep)
            self._set(node, Opaque(dep, f"values of two banks meet in {self.fe.describe(node)}"))
            return
        if out is None and node.op in ("call_function", "call_method"):
            if dep:
                self._escape(node, ins)
                self._foreign_inplace(node, dep)
                self._set(node, Opaque(dep, f"{self.fe.describe(node)}"))
                return
            self._foreign_inplace(node, dep)
        if dep and isinstance(out, Sym) and not _deps(out):
            # the bank's values cancel in the algebra (``0 * x``, ``x - x``) but not in floats
            # (inf, NaN): a use of the bank's state that is not the loop's
            self._escape(node, ins)
            self._set(node, Opaque(dep, f"{self.fe.describe(node)} (the bank's values cancel)"))
            return
        if not dep and isinstance(out, Sym) and (len(out.terms) != 1 or out.terms[0].bound):
            out = None      # sums and contractions of inputs stay whole: one atom (e.g. x @ Wv)
        if out is None:
            out = self.leaf(node) if not dep else Opaque(dep)
        self._set(node, out)

    def _set(self, node, out):
        self.env[node] = out
        d = _deps(out)
        if d and not isinstance(out, Opaque):   # opaque values are not the loop's: never erased
            self.node_banks[node] = set(d)

    def _escape(self, node, ins):
        for n in ins:
            v = self.env.get(n)
            if _deps(v):
                self.escapes.append(Escape(node, n, v))

    def _foreign_inplace(self, node, dep):
        target = self.fe.inplace_target(node)
        if target is None:
            return
        tv = self.env.get(target)
        if _deps(tv) or dep:
            self.env[target] = Opaque(_deps(tv) | dep, f"changed in place by {self.fe.describe(node)}")
            return
        # a tensor that does not depend on the bank changes (and every view of its memory):
        # later uses see a value of its own, and none of them is hoisted or stacked (volatile)
        why = f"changed in place by {self.fe.describe(node)}"
        self.volatile.add(node)
        for n in self._aliases(target):
            self.volatile.add(n)
            v = self.env.get(n)
            if _deps(v):
                self.env[n] = Opaque(_deps(v), why)
            elif isinstance(v, Sym):
                shape = self.fe.shape(n)
                self.env[n] = (self.virtual_atom(("changed in place", n.name, node.name), n, shape)
                               if shape is not None else None)

    def _storage(self, node):
        if node not in self._storages:
            v = node.meta.get(self.fe.META) if isinstance(node, fx.Node) else None
            try:
                from torch.multiprocessing.reductions import StorageWeakRef
                self._storages[node] = StorageWeakRef(v.untyped_storage()) if v is not None else None
            except Exception:       # noqa: BLE001 - no storage to compare: the node alone
                self._storages[node] = None
        return self._storages[node]

    def _aliases(self, target) -> list:
        """``target`` and the nodes seen so far whose values share its memory (views of
        it, or the tensor it is a view of), by the storages of their example values."""
        st = self._storage(target)
        if st is None:
            return [target]
        for n in itertools.islice(self.env, self._indexed, None):     # index the nodes seen since
            other = self._storage(n) if isinstance(n, fx.Node) else None   # the last query
            if other is not None:
                self._by_storage.setdefault(other.cdata, []).append(n)
        self._indexed = len(self.env)
        return [target] + [n for n in self._by_storage.get(st.cdata, []) if n is not target]

    def _scatter_into_zeros(self, node, op: WriteOp, tv: ZeroBuf, dep):
        """``upd.index_add_(0, idx, delta)`` on a zero buffer: ``upd`` is the rows ``idx``
        holding ``delta`` (zero elsewhere). Values that do not depend on the bank are rows
        of values too: added to a bank state, the write is then refused by the chain's
        checks with its reason (no delta)."""
        if isinstance(op.vals, Sym) and isinstance(op.idx, Sym):
            out = Scattered(tv.shape, op.idx, op.vals)
        else:
            why = "a zero buffer written by something else than rows of values"
            if dep:
                # the delta of a bank state (``M = M + upd``) whose rows are not linear in
                # it: that bank's loop is refused here, as a direct write would be
                why = f"the written rows are not linear in the bank ({self.fe.describe(node)})"
                if isinstance(op.vals, Opaque) and op.vals.why:
                    why += f": {op.vals.why}"
                for bid in dep & self._banks_added_to(op.target):
                    self._reject_bank(bid, why)
            out = Opaque(dep, why)
            self._escape(node, self._inputs(node))
        if op.inplace:
            self.env[op.target] = out
        self._set(node, out if not op.inplace or self.fe.returns_self(node) else None)

    def _banks_added_to(self, buf) -> frozenset:
        """The banks whose tracked states (seen so far) the zero buffer ``buf`` is added to
        (not states a foreign op made: that bank's loop ends before them)."""
        out = set()
        for u in self.fe.adds_of_buffer(buf) or ():
            for a in u.args[:2]:
                v = self.env.get(a) if isinstance(a, fx.Node) else None
                if isinstance(v, BankVal):
                    out.add(v.bank_id)
        return frozenset(out)

    def _write(self, node, op: WriteOp, dep):
        tv = self.env.get(op.target)
        if isinstance(op.vals, Merged):
            try:
                op = self.unmerge(op)
            except NotSymbolic:
                pass        # rejected below (not linear / not rows of values)
        if isinstance(tv, ZeroBuf):
            return self._scatter_into_zeros(node, op, tv, dep)
        if not isinstance(tv, BankVal):
            # a write into something that is not a tracked bank state
            if _deps(tv):
                why = f" ({tv.why})" if isinstance(tv, Opaque) and tv.why else ""
                for bid in _deps(tv):
                    self._reject_bank(bid, f"the bank is altered by a foreign op before "
                                           f"{self.fe.describe(node)}{why}")
            self._escape(node, self._inputs(node))
            out = Opaque(dep)
            if op.inplace:
                self.env[op.target] = out
                if not dep:
                    self.volatile.add(op.target)
            self._set(node, out if not op.inplace or self.fe.returns_self(node) else None)
            return
        bank = self.banks[tv.bank_id]
        bank.attempts += 1
        try:
            if not isinstance(op.vals, Sym) or not isinstance(op.idx, Sym):
                raise Reject(f"the written rows are not linear in the bank ({self.fe.describe(node)})")
            atom, _ = A.index_atom(op.idx)
            rows = Sym.rows(self.space, tv, op.idx)
            vals = A.expand(self.space, op.vals, rows.shape)
            # written values aligned with the rows' axes (the index decides the row axes)
            vals = A.add(self.space, A.scale(rows, 0.0), vals) if not op.accumulate else A.add(self.space, rows, vals)
            if tv.version in bank.writes:
                raise Reject("one bank state is written twice (the chain branches)")
            if op.inplace and op.target is bank.root:
                bank.inplace_root = True
            bank.writes[tv.version] = WriteRec(node, tv.version, atom, vals, op.inplace, op.target)
        except (Reject, NotSymbolic) as e:
            self._reject_bank(bank.id, f"token {tv.version + 1}: {e}")
        new = BankVal(bank.id, tv.version + 1, tv.shape)
        if op.inplace:
            self.env[op.target] = new
        self._set(node, new if (not op.inplace or self.fe.returns_self(node)) else None)
        self.node_banks.setdefault(node, set()).add(bank.id)
        # values of other banks written into this one leave their own loops here
        if dep - {bank.id}:
            self._escape(node, [n for n in self._inputs(node) if _deps(self.env.get(n)) - {bank.id}])
            self._reject_bank(bank.id, "the written rows depend on another bank's state")

    def _reject_bank(self, bid, why):
        b = self.banks[bid]
        if b.reject is None:
            b.reject = why

    # ---------------------------------------------------------------- chains
    def chains(self):
        """(chains that may be rewritten, rejected candidates with reasons). A bank whose
        state passes through a foreign op between tokens was rejected at the write that
        met it (``_write``)."""
        ok, rejected = [], []
        for b in self.banks.values():
            if not b.writes and b.reject is None:
                continue
            where = location(b.writes[min(b.writes)].node) if b.writes else location(b.root)
            if b.reject is not None:
                rejected.append(Rejected(where, max(b.attempts, len(b.writes)), b.reject, b.root))
                continue
            try:
                ok.append(self._chain(b, where))
            except Reject as e:
                rejected.append(Rejected(where, len(b.writes), str(e), b.root))
        return ok, rejected

    def _readings_behind(self, e: Escape, bank_id: int):
        """The readings an escaping value is computed from. A reading itself, or e.g.
        ``W_o @ reading`` / ``reading_1 + reading_2``: walking back from the escape, every
        path to the bank must pass a reading; the nodes after the readings stay in the
        graph (recomputed from the op's readings), the rest of the loop goes."""
        try:
            return [(e.producer, match_read(e.value, bank_id))]
        except Reject as first:
            why = first
        found, kept, stack = [], set(), [e.producer]
        while stack:
            n = stack.pop()
            if n in kept:
                continue
            v = self.env.get(n)
            if n is not e.producer and isinstance(v, Sym):
                try:
                    found.append((n, match_read(v, bank_id)))
                    continue
                except Reject:
                    pass
            inputs = [m for m in n.all_input_nodes if bank_id in _deps(self.env.get(m))]
            if not isinstance(v, Sym) or not inputs or any(isinstance(self.env.get(m), BankVal) for m in inputs):
                raise why
            kept.add(n)
            stack.extend(inputs)
        self.kept |= kept
        return found

    def _chain(self, b: Bank, where: str) -> Chain:
        V = len(b.writes)
        if sorted(b.writes) != list(range(V)):
            raise Reject("the writes do not form one chain of bank states")
        steps = []
        for ver in range(V):
            rec = b.writes[ver]
            steps.append(Step(match_write(rec.vals, b.id, ver, rec.idx, stream_dims=tuple(b.shape[:-2])),
                              None, rec.node))
        reads: dict = {}
        finals = []
        for e in self.escapes:
            if b.id not in _deps(e.value):
                continue
            v = e.value
            if isinstance(v, Opaque):
                continue        # downstream of an escape already checked (or of a foreign op)
            if isinstance(v, BankVal):
                if v.version == V:
                    finals.append(e)
                elif v.version == 0 and not b.inplace_root:
                    continue
                elif v.version == 0:
                    raise Reject(f"the bank is used by {self.fe.describe(e.consumer)} before the loop "
                                 "in a way that needs its old state")
                else:
                    raise Reject(f"the bank state after token {v.version} is used by "
                                 f"{self.fe.describe(e.consumer)} (outside the loop)")
                continue
            if not isinstance(v, Sym):
                raise Reject(f"a bank-dependent value reaches {self.fe.describe(e.consumer)}")
            if _deps(v) != {b.id}:
                raise Reject("a value read from two banks leaves the loop")
            for producer, r in self._readings_behind(e, b.id):
                reads.setdefault(r.version, []).append((producer, r))
        for ver, lst in reads.items():
            first = lst[0][1]
            if any(r.stream_shape != steps[ver - 1].write.stream_shape for _, r in lst):
                raise Reject(f"a reading after token {ver} runs over other streams than the writes "
                             "(a value that leaves the loop is not one reading per stream)")
            for _, r in lst[1:]:
                if r.q_idx.key != first.q_idx.key or _multiset(r.q) != _multiset(first.q):
                    raise Reject(f"two different readings after token {ver}")
            steps[ver - 1].read = first
        nodes = [n for n, ids in self.node_banks.items() if b.id in ids and n not in self.kept]
        chain = Chain(b, steps, reads, finals, nodes, where=where)
        return chain


def _multiset(factors) -> Counter:
    return Counter(rf.sig() for rf in factors)


def drop_columns(idx: Sym) -> Sym:
    """The index of ``gather``/``scatter`` along rows has the values' shape; it must not
    vary along the last (column) dim, which is dropped here."""
    last = idx.axes[-1] if idx.axes else None
    if not idx.shape:
        raise NotSymbolic("scalar index")
    if last is not None and any(last in t.labels() for t in idx.terms):
        raise NotSymbolic("the row index varies along the columns")
    return Sym(tuple(idx.shape[:-1]), tuple(idx.axes[:-1]), idx.terms)
