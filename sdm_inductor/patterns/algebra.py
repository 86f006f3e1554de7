"""A small symbolic tensor algebra: the normal form in which token steps are compared.

Every spelling of a contraction (mul + sum, matmul, bmm, einsum, outer, ...) and of a
layout change (unsqueeze, view, permute, expand, ...) maps onto the same few primitives
here, so the recognizer compares *meanings*, not op sequences.

A value is a ``Sym``: a sum of ``Term``s, each a coefficient times a product of
``Factor``s, with index labels in the einsum sense. A factor is either an *atom* (an
opaque tensor that does not depend on the bank: a graph node, indexed by labels) or a
*bank row* ``M_version[idx[row_label], col_label]``. Labels of size-1 dims are ``None``
(they take one value only), so squeeze/unsqueeze/broadcast never change a term. A
term's ``bound`` labels are summed over.

Everything not expressible here (exp of a bank value, a product of two bank rows,
reshapes that merge dims, ...) raises ``NotSymbolic``; callers turn that into an opaque
value, which is how nonlinear or clamped banks end up rejected.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

__all__ = ["NotSymbolic", "Atom", "Factor", "Term", "Sym", "BankVal", "LabelSpace"]


class NotSymbolic(Exception):
    """The operation leaves the algebra (the value becomes opaque)."""


@dataclass(frozen=True)
class Atom:
    """A bank-independent tensor: ``key`` identifies its value (value numbering),
    ``node`` is one graph node that computes it, ``shape`` its static shape, and
    ``exp_of`` the atom whose exponential (or sigmoid) it is: gates are recognised through
    it. On that inner atom, ``decay`` says which: ``"exp"`` (the atom is the log-decay
    ``g``) or ``"sigmoid"`` (the log-decay is ``logsigmoid`` of the atom)."""
    key: object
    node: object = field(compare=False, hash=False)
    shape: tuple = field(compare=False, hash=False)
    exp_of: object = field(default=None, compare=False, hash=False)
    decay: str = field(default="exp", compare=False, hash=False)


@dataclass(frozen=True)
class Factor:
    kind: str            # "atom" or "bank"
    ref: object          # Atom, or (bank_id, version, idx Atom) for a bank row
    # one label (or None) per dim of the atom; (stream labels..., row, col) for a bank row
    labels: tuple

    def relabel(self, sub: dict) -> "Factor":
        return replace(self, labels=tuple(sub.get(lb, lb) for lb in self.labels))


@dataclass(frozen=True)
class Term:
    coef: float
    factors: tuple
    bound: frozenset = frozenset()

    def relabel(self, sub: dict) -> "Term":
        return Term(self.coef, tuple(f.relabel(sub) for f in self.factors),
                    frozenset(sub.get(b, b) for b in self.bound))

    def labels(self) -> set:
        return {lb for f in self.factors for lb in f.labels if lb is not None}

    def bank_factors(self) -> list:
        return [f for f in self.factors if f.kind == "bank"]


class LabelSpace:
    """Fresh labels and their sizes (one space per analysed graph)."""

    def __init__(self):
        self._next = itertools.count()
        self.size: dict[int, int] = {}

    def fresh(self, size: int):
        if size == 1:
            return None
        lb = next(self._next)
        self.size[lb] = size
        return lb


@dataclass
class BankVal:
    """A whole bank state: version ``version`` of bank ``bank_id`` (0 = before the first write)."""
    bank_id: int
    version: int
    shape: tuple


@dataclass
class Sym:
    shape: tuple
    axes: tuple          # label (or None) per dim
    terms: list

    # ---------------------------------------------------------------- constructors
    @staticmethod
    def atom(space: LabelSpace, atom: Atom) -> "Sym":
        axes = tuple(space.fresh(s) for s in atom.shape)
        return Sym(tuple(atom.shape), axes, [Term(1.0, (Factor("atom", atom, axes),))])

    @staticmethod
    def rows(space: LabelSpace, bank: BankVal, idx: "Sym") -> "Sym":
        """``bank[idx]`` for an index that is one atom of rows: ``[W]``, or ``[B, W]`` (one
        row set per stream: a flat bank with per-stream rows, or a ``[B, S, hd]`` bank
        indexed per batch). Result ``idx.shape + (hd,)``; the bank factor is labelled by
        the index's live labels and a column label."""
        atom, live = index_atom(idx)
        col = space.fresh(bank.shape[-1])
        factor = Factor("bank", (bank.bank_id, bank.version, atom), tuple(live) + (col,))
        return Sym(tuple(idx.shape) + (bank.shape[-1],), tuple(idx.axes) + (col,), [Term(1.0, (factor,))])

    @staticmethod
    def scalar(value: float) -> "Sym":
        return Sym((), (), [Term(float(value), ())])

    # ---------------------------------------------------------------- queries
    def depends_on_bank(self) -> bool:
        return any(t.bank_factors() for t in self.terms)

    def bank_refs(self) -> set:
        return {f.ref for t in self.terms for f in t.bank_factors()}

    # ---------------------------------------------------------------- helpers
    def fresh_copy(self, space: LabelSpace) -> "Sym":
        """The same value with every label renamed (so two operands never share one)."""
        labels = {lb for t in self.terms for lb in t.labels() | set(t.bound)}
        labels |= {a for a in self.axes if a is not None}
        sub = {lb: space.fresh(space.size[lb]) for lb in labels}
        return Sym(self.shape, tuple(sub.get(a, a) for a in self.axes),
                   [t.relabel(sub) for t in self.terms])

    def relabel(self, sub: dict) -> "Sym":
        return Sym(self.shape, tuple(sub.get(a, a) for a in self.axes),
                   [t.relabel(sub) for t in self.terms])


def index_atom(idx: Sym):
    """(atom, live labels) when ``idx`` is one tensor of indices (up to size-1 dims), else raise."""
    if len(idx.terms) != 1:
        raise NotSymbolic("index is computed, not a tensor of indices")
    t = idx.terms[0]
    if t.coef != 1.0 or t.bound or len(t.factors) != 1 or t.factors[0].kind != "atom":
        raise NotSymbolic("index is computed, not a tensor of indices")
    f = t.factors[0]
    live = [lb for lb in f.labels if lb is not None]
    if live != [a for a in idx.axes if a is not None] or len(live) > 3:
        raise NotSymbolic("index is a permuted or broadcast tensor of indices")
    return f.ref, tuple(live)


# ---------------------------------------------------------------- primitives

def _check_linear(terms):
    for t in terms:
        if len(t.bank_factors()) > 1:
            raise NotSymbolic("product of two bank values (not linear in the bank)")
    return terms


def _broadcast(space: LabelSpace, a: Sym, b: Sym):
    """Align ``b`` (renamed fresh) with ``a`` under broadcasting; returns (shape, axes,
    b relabelled)."""
    b = b.fresh_copy(space)
    n = max(len(a.shape), len(b.shape))
    ash = (1,) * (n - len(a.shape)) + tuple(a.shape)
    bsh = (1,) * (n - len(b.shape)) + tuple(b.shape)
    aax = (None,) * (n - len(a.axes)) + tuple(a.axes)
    bax = (None,) * (n - len(b.axes)) + tuple(b.axes)
    shape, axes, sub = [], [], {}
    for sa, sb, la, lb in zip(ash, bsh, aax, bax):
        if sa != sb and 1 not in (sa, sb):
            raise NotSymbolic(f"shapes do not broadcast: {a.shape} vs {b.shape}")
        if la is not None and lb is not None:
            sub[lb] = la
            axes.append(la)
        else:
            axes.append(la if la is not None else lb)
        shape.append(max(sa, sb))
    return tuple(shape), tuple(axes), b.relabel(sub)


def mul(space: LabelSpace, a: Sym, b: Sym) -> Sym:
    shape, axes, b = _broadcast(space, a, b)
    terms = [Term(ta.coef * tb.coef, ta.factors + tb.factors, ta.bound | tb.bound)
             for ta in a.terms for tb in b.terms]
    return Sym(shape, axes, _check_linear([t for t in terms if t.coef != 0.0]))


def _signature(t: Term):
    """Terms equal up to the names of their summed labels and the order of factors."""
    ren, n = {}, 0
    out = []
    for f in sorted(t.factors, key=lambda f: (f.kind, repr(f.ref), tuple(lb in t.bound for lb in f.labels))):
        labels = []
        for lb in f.labels:
            if lb in t.bound:
                if lb not in ren:
                    ren[lb] = ("b", n)
                    n += 1
                labels.append(ren[lb])
            else:
                labels.append(lb)
        out.append((f.kind, f.ref, tuple(labels)))
    return tuple(out), len(t.bound)


def _combine(terms):
    """Collect like terms (so ``rows + (dec - rows)`` is ``dec``)."""
    acc: dict = {}
    order = []
    for t in terms:
        try:
            sig = _signature(t)
            hash(sig)
        except TypeError:
            sig = id(t)
        if sig in acc:
            acc[sig] = Term(acc[sig].coef + t.coef, acc[sig].factors, acc[sig].bound)
        else:
            acc[sig] = t
            order.append(sig)
    return [acc[s] for s in order if acc[s].coef != 0.0]


def add(space: LabelSpace, a: Sym, b: Sym, alpha: float = 1.0) -> Sym:
    shape, axes, b = _broadcast(space, a, b)
    # a term constant along a broadcast axis needs no change: labels it lacks are free
    terms = list(a.terms) + [Term(t.coef * alpha, t.factors, t.bound) for t in b.terms]
    return Sym(shape, axes, _combine(terms))


def scale(a: Sym, c: float) -> Sym:
    return Sym(a.shape, a.axes, [Term(t.coef * c, t.factors, t.bound) for t in a.terms if t.coef * c != 0.0])


def reduce_sum(space: LabelSpace, a: Sym, dims, keepdim: bool = False) -> Sym:
    nd = len(a.shape)
    dims = sorted({d % nd for d in dims}) if nd else []
    terms = list(a.terms)
    for d in dims:
        lb = a.axes[d]
        if lb is None:
            continue
        new = []
        for t in terms:
            if lb in t.labels():
                new.append(Term(t.coef, t.factors, t.bound | {lb}))
            else:   # constant along the summed axis
                new.append(Term(t.coef * space.size[lb], t.factors, t.bound))
        terms = new
    axes = [None if (i in dims) else lb for i, lb in enumerate(a.axes) if i not in dims or keepdim]
    shape = [1 if (keepdim and i in dims) else s for i, s in enumerate(a.shape) if i not in dims or keepdim]
    return Sym(tuple(shape), tuple(axes), terms)


def permute(a: Sym, order) -> Sym:
    order = [o % len(a.shape) for o in order]
    return Sym(tuple(a.shape[o] for o in order), tuple(a.axes[o] for o in order), a.terms)


def reshape(space: LabelSpace, a: Sym, shape) -> Sym:
    """A reshape that only inserts or removes size-1 dims (or expands them)."""
    shape = tuple(int(s) for s in shape)
    old = [(s, lb) for s, lb in zip(a.shape, a.axes) if s != 1]
    new = [s for s in shape if s != 1]
    if [s for s, _ in old] != new:
        raise NotSymbolic(f"reshape {a.shape} -> {shape} merges or splits dims")
    it = iter(old)
    axes = tuple(None if s == 1 else next(it)[1] for s in shape)
    return Sym(shape, axes, a.terms)


def split(space: LabelSpace, a: Sym, shape, split_atom) -> Sym:
    """A reshape that splits dims (``rows.view(B, W, hd)`` of ``[B*W, hd]`` rows): each
    split label becomes several, and every factor along it is the same tensor viewed
    with that dim split (``split_atom(atom, dim, sizes)``; for a bank factor, its row
    index). Merges raise (a merged value is ``Merged``, kept whole)."""
    shape = tuple(int(s) for s in shape)
    old = [(s, lb) for s, lb in zip(a.shape, a.axes) if s != 1]
    new = [s for s in shape if s != 1]
    groups, j = [], 0
    for s, _ in old:
        grp, prod = [], 1
        while prod < s and j < len(new):
            grp.append(new[j])
            prod *= new[j]
            j += 1
        if prod != s or not grp:
            raise NotSymbolic(f"reshape {a.shape} -> {shape} merges dims")
        groups.append(grp)
    if j != len(new):
        raise NotSymbolic(f"reshape {a.shape} -> {shape} merges dims")
    terms, seq = list(a.terms), []
    for (s, lb), grp in zip(old, groups):
        if len(grp) == 1:
            seq.append(lb)
            continue
        labels = tuple(space.fresh(x) for x in grp)
        terms = [_split_term(t, lb, labels, tuple(grp), split_atom) for t in terms]
        seq += list(labels)
    it = iter(seq)
    return Sym(shape, tuple(None if s == 1 else next(it) for s in shape), terms)


def _split_term(t: Term, lb, labels, sizes, split_atom) -> Term:
    fs = []
    for f in t.factors:
        if lb not in f.labels:
            fs.append(f)
            continue
        p = f.labels.index(lb)
        if f.labels.count(lb) > 1:
            raise NotSymbolic("split of a diagonal")
        new_labels = f.labels[:p] + labels + f.labels[p + 1:]
        if f.kind == "atom":
            fs.append(Factor("atom", split_atom(f.ref, p, sizes), new_labels))
            continue
        bid, ver, idx = f.ref
        if p == len(f.labels) - 1:
            raise NotSymbolic("split of the bank's columns")
        dims = [i for i, n in enumerate(idx.shape) if n != 1]
        fs.append(Factor("bank", (bid, ver, split_atom(idx, dims[p], sizes)), new_labels))
    return Term(t.coef, tuple(fs), t.bound)


def expand(space: LabelSpace, a: Sym, shape) -> Sym:
    shape = tuple(int(s) for s in shape)
    n = len(shape)
    ash = (1,) * (n - len(a.shape)) + tuple(a.shape)
    aax = (None,) * (n - len(a.axes)) + tuple(a.axes)
    axes = []
    for sa, s, lb in zip(ash, shape, aax):
        if s == -1 or s == sa:
            axes.append(lb)
        elif sa == 1:
            axes.append(space.fresh(s))     # a new axis no term depends on
        else:
            raise NotSymbolic(f"cannot expand {a.shape} to {shape}")
    return Sym(tuple(sa if s == -1 else s for sa, s in zip(ash, shape)), tuple(axes), a.terms)


def contract(space: LabelSpace, operands, out_letters: str) -> Sym:
    """einsum over Syms: ``operands`` is a list of (Sym, letters)."""
    letter_label: dict[str, object] = {}
    letter_size: dict[str, int] = {}
    terms = [Term(1.0, (), frozenset())]
    for sym, letters in operands:
        if len(letters) != len(sym.shape):
            raise NotSymbolic("einsum operand rank mismatch")
        sym = sym.fresh_copy(space)
        sub = {}
        for ch, s, lb in zip(letters, sym.shape, sym.axes):
            if ch in letter_size and letter_size[ch] != s and 1 not in (s, letter_size[ch]):
                raise NotSymbolic("einsum size mismatch")
            letter_size[ch] = max(s, letter_size.get(ch, 1))
            if lb is None:
                continue
            if letter_label.get(ch) is None:
                letter_label[ch] = lb
            else:
                sub[lb] = letter_label[ch]
        sym = sym.relabel(sub)
        terms = [Term(ta.coef * tb.coef, ta.factors + tb.factors, ta.bound | tb.bound)
                 for ta in terms for tb in sym.terms]
    for ch, s in letter_size.items():
        if s > 1 and letter_label.get(ch) is None:
            letter_label[ch] = space.fresh(s)
    summed = [ch for ch in letter_size if ch not in out_letters]
    for ch in summed:
        lb = letter_label.get(ch)
        if lb is None:
            continue
        terms = [Term(t.coef, t.factors, t.bound | {lb}) if lb in t.labels()
                 else Term(t.coef * letter_size[ch], t.factors, t.bound) for t in terms]
    shape = tuple(letter_size[ch] for ch in out_letters)
    axes = tuple(letter_label.get(ch) if letter_size[ch] > 1 else None for ch in out_letters)
    return Sym(shape, axes, _check_linear(terms))


def matmul(space: LabelSpace, a: Sym, b: Sym) -> Sym:
    """torch.matmul semantics, including 1-D promotion and batch broadcasting."""
    na, nb = len(a.shape), len(b.shape)
    if na == 0 or nb == 0:
        raise NotSymbolic("matmul of a scalar")
    letters = "abcdefghijklmnop"
    if na == 1 and nb == 1:
        return contract(space, [(a, "k"), (b, "k")], "")
    if na == 1:
        batch = letters[:nb - 2]
        return contract(space, [(a, "y"), (b, batch + "yz")], batch + "z")
    if nb == 1:
        batch = letters[:na - 2]
        return contract(space, [(a, batch + "xy"), (b, "y")], batch + "x")
    nbatch = max(na, nb) - 2
    batch = letters[:nbatch]
    ba, bb = batch[nbatch - (na - 2):], batch[nbatch - (nb - 2):]
    if a.shape[:-2] != b.shape[:-2] and (na > 2 and nb > 2):
        for sa, sb in zip(a.shape[:-2][::-1], b.shape[:-2][::-1]):
            if sa != sb:
                raise NotSymbolic("matmul with broadcast batch dims")
    return contract(space, [(a, ba + "xy"), (b, bb + "yz")], batch + "xz")
