"""The canonical token step (docs/spec.md section 1) in the normal form of ``algebra``.

A write of rows ``idx`` of bank state ``v`` with values ``V[w, d]`` is a token step iff

    V[w, d] =   a[w] * M_v[idx[w], d]                                   (D: decay)
              + c * beta * k[w] * v[d]                                  (B: value)
              - c * beta * k[w] * sum_u k[u] * a[u] * M_v[idx[u], d]    (C: retrieval)

with ``a = exp(g)`` (per write slot, per token, or absent), ``k``, ``beta``, ``v``
products of bank-independent atoms and ``c`` a number. A reading is
``sum_r q[r] * M_v'[q_idx[r], d]`` of a state ``v' >= 1``. Everything else (a missing
decay in the retrieval, other weights in the retrieval than in the write, a gate on
the delta, no delta at all, ...) fails one of the checks below with a reason.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from .algebra import Atom, Sym

__all__ = ["Reject", "WriteRoles", "ReadRoles", "match_write", "match_read", "RoleFactor"]


class Reject(Exception):
    """A candidate is not a canonical token step; the message says why."""


@dataclass(frozen=True)
class RoleFactor:
    """An atom seen along one role axis: ``labels`` per atom dim, as 'w'/'u'/'d'/'r', a
    stream axis 's0', 's1', ... or None."""
    atom: Atom
    labels: tuple

    def sig(self):
        return (self.atom.key, self.labels)


@dataclass
class WriteRoles:
    k_idx: Atom
    k: list            # RoleFactors along 'w'
    gate: RoleFactor | None   # the exp atom; per write slot when it has a 'w' label
    beta: list         # scalar RoleFactors
    coef: float        # c: the strength's number (beta = c * prod(beta factors))
    v: list            # RoleFactors along 'd'
    W: int
    hd: int
    streams: int = 0   # the streams of a step (B, or B*H for a [B, H, S, hd] bank), 0: one
    v_coef: float = 1.0   # the value's number: beta * (2 v - r) is beta' = beta, v' = 2 v
    stream_shape: tuple = ()   # the stream axes' sizes ((B,), or (B, H) for a [B, H, S, hd] bank)
    decay_coef: float = 1.0    # a number on the decay (``rows * 0.9``): log-decay += log of it

    @property
    def per_write_gate(self) -> bool:
        return self.gate is not None and "w" in self.gate.labels


@dataclass
class ReadRoles:
    q_idx: Atom
    q: list            # RoleFactors along 'r' (and scalars)
    coef: float
    R: int
    version: int
    shape: tuple = field(default=())
    streams: int = 0
    stream_shape: tuple = ()


def _split(t, names: dict):
    """Non-bank factors of a term as RoleFactors, labels renamed through ``names``."""
    out = []
    for f in t.factors:
        if f.kind != "atom":
            continue
        labels = tuple(names.get(lb, "?") if lb is not None else None for lb in f.labels)
        out.append(RoleFactor(f.ref, labels))
    return out


def _live(rf: RoleFactor) -> set:
    return {lb for lb in rf.labels if lb is not None}


def _by_axis(factors, where: str):
    """Factors grouped by the step axis they run along ('w', 'd', 'u', 'r' or '' for a
    scalar); the stream axes 's0', 's1', ... may come with any of them."""
    parts = {"w": [], "d": [], "": [], "u": [], "r": []}
    for rf in factors:
        live = _live(rf)
        if "?" in live:
            raise Reject(f"{where}: a tensor runs along an axis foreign to the step ({rf.atom.node})")
        axis = {a for a in live if not a.startswith("s")}
        if len(axis) > 1:
            raise Reject(f"{where}: a tensor mixes two axes of the step ({rf.atom.node})")
        if len(live) != sum(lb is not None for lb in rf.labels):
            raise Reject(f"{where}: a diagonal of a tensor ({rf.atom.node})")
        parts["".join(axis)].append(rf)
    return parts


def _ms(factors) -> Counter:
    return Counter(rf.sig() for rf in factors)


def _relabel(factors, old: str, new: str):
    return [RoleFactor(rf.atom, tuple(new if lb == old else lb for lb in rf.labels)) for rf in factors]


def _streams(live, ls) -> dict:
    """Role names of the stream labels ``ls`` and (product, sizes) of those axes."""
    size = {lb: n for n, lb in live}
    shape = tuple(size[lb] for lb in ls)
    return {lb: f"s{i}" for i, lb in enumerate(ls)}, (math.prod(shape) if ls else 0), shape


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def match_write(vals: Sym, bank_id: int, version: int, idx: Atom, stream_dims: tuple = ()) -> WriteRoles:
    """Roles of a canonical write of ``vals`` (``[W, hd]``, or ``[B, W, hd]`` for B
    streams) into rows ``idx`` of state ``version``. ``stream_dims`` are the leading dims
    of a bank indexed per stream (``(B,)`` for ``[B, S, hd]``, ``(B, H)`` for
    ``[B, H, S, hd]``: its rows run along those axes), ``()`` for a flat bank. One write
    slot per token (W = 1: ``[1, hd]`` / ``[hd]`` rows, ``[B, hd]`` for a batched bank)
    is matched by ``_match_one_slot``."""
    live = [(n, lb) for n, lb in zip(vals.shape, vals.axes) if lb is not None]
    ns = sum(n > 1 for n in stream_dims)
    if len(live) == 1 or (ns and len(live) == ns + 1):
        return _match_one_slot(vals, bank_id, version, idx, live)
    if len(live) not in ((2, 3) if ns < 2 else (ns + 2,)):
        raise Reject(f"written rows have shape {list(vals.shape)}, expected [W, hd] or [B, W, hd]")
    *lead, ld = [lb for _, lb in live]
    ls, lw = tuple(lead[:-1]), lead[-1]
    hd = live[-1][0]
    W = live[-2][0]
    D, B, C = [], [], []
    for t in vals.terms:
        bank = t.bank_factors()
        if not bank:
            B.append(t)
            continue
        *rlead, _ = _bank_term(t, bank_id, version, idx, ld).labels
        if tuple(rlead) == tuple(lead) and not (set(rlead) & t.bound):
            D.append(t)
        elif len(rlead) == len(lead) and rlead[-1] in t.bound and tuple(rlead[:-1]) == tuple(lead[:-1]):
            C.append(t)
        else:
            raise Reject("bank rows enter the write along an unexpected axis (rows of another stream?)")
    if len(D) == 2 and not C:
        raise Reject("each written row retrieves from itself only, not from all the token's write "
                     "slots (or one write slot per stream on a flat bank: not recognised, "
                     "a [B, S, hd] bank indexed per batch is)")
    if len(D) != 1:
        raise Reject("the written rows do not keep the old row once (decay term: "
                     f"{len(D)} terms): not a delta-rule update")
    if len(C) != 1:
        raise Reject("no retrieval from the decayed rows subtracted from the value "
                     "(plain outer-product write, no delta)" if not C else
                     "more than one retrieval term in the written rows")
    if len(B) != 1:
        raise Reject("the written rows hold no single value term beta * k * v")
    d, b, c = D[0], B[0], C[0]
    u = c.bank_factors()[0].labels[-2]
    if d.bound or b.bound or c.bound != {u}:
        raise Reject("the old row is summed in the decay term")
    a = _decay_number(d.coef)
    snames, streams, sshape = _streams(live, ls)
    names = {lw: "w", ld: "d", u: "u"} | snames
    dparts = _by_axis(_split(d, names), "decay term")
    gate = _exp_gate(dparts, dparts["w"] + dparts[""])
    bparts = _by_axis(_split(b, names), "value term")
    k, v, beta = bparts["w"], bparts["d"], bparts[""]
    if not v:
        raise Reject("the value term has no value vector v[d]")
    cparts = _by_axis(_split(c, names), "retrieval term")
    if cparts["d"]:
        raise Reject("the retrieval is scaled along the value dim")
    if _ms(cparts["w"]) != _ms(k):
        raise Reject("the delta is spread over the written rows with other weights than in the value term")
    per_write = gate is not None and "w" in gate.labels
    want_u = _relabel(k, "w", "u") + (_relabel([gate], "w", "u") if per_write else [])
    want_s = list(beta) + ([gate] if gate is not None and not per_write else [])
    if _ms(cparts["u"]) != _ms(want_u) or _ms(cparts[""]) != _ms(want_s):
        if per_write and _ms(cparts["u"]) == _ms(_relabel(k, "w", "u")):
            raise Reject("the retrieval reads the rows before their decay (spec: retrieve from decayed rows)")
        raise Reject("the retrieval uses other weights or gates than the write")
    # the retrieval's number is the strength's times the decay's (it reads the decayed
    # rows); where the value's differs (beta * (2 v - r)) the ratio goes to the value
    strength = -c.coef / a
    return WriteRoles(idx, k, gate, beta, strength, v, W, hd, streams=streams,
                      v_coef=_ratio(b.coef, strength), stream_shape=sshape, decay_coef=a)


def _bank_term(t, bank_id: int, version: int, idx: Atom, ld):
    """The bank factor of a term of the written rows, checked: this bank's state
    ``version``, rows read at the written slots, columns not mixed."""
    (f,) = t.bank_factors()
    bid, ver, atom = f.ref
    if bid != bank_id or ver != version:
        raise Reject("the written rows use another bank state than the one written "
                     "(a reading fed back into a later token?)")
    if atom.key != idx.key:
        raise Reject("the written rows combine bank rows read at other slots than the ones written")
    if f.labels[-1] != ld:
        raise Reject("bank columns are mixed (the step is not separable by column)")
    return f


def _match_one_slot(vals: Sym, bank_id: int, version: int, idx: Atom, live) -> WriteRoles:
    """W = 1: the written row (``[hd]``, or ``[B, hd]`` for B streams, size-1 dims aside) is

        a * M[idx] + c * X * v - c * X * k * a * M[idx]

    with X = beta * k. Along the step every role but v is a scalar, so k and beta are told
    apart only by k appearing twice in the retrieval term: k is what the retrieval term
    has beyond X and the gate, and must be a part of X (beta = X / k is then a product of
    atoms, never a division). The two bank terms (decay, retrieval) are told apart by
    their structure; exactly one assignment may pass."""
    hd, ld = live[-1]
    ls = lead = tuple(lb for _, lb in live[:-1])
    bank_terms, B = [], []
    for t in vals.terms:
        if not t.bank_factors():
            B.append(t)
            continue
        f = _bank_term(t, bank_id, version, idx, ld)
        if tuple(f.labels[:-1]) != lead or t.bound:
            raise Reject("bank rows enter the write along an unexpected axis (rows of another "
                         "stream, or a sum over rows)")
        bank_terms.append(t)
    if len(B) != 1:
        raise Reject("the written rows hold no single value term beta * k * v")
    if not bank_terms:
        raise Reject("the written rows do not keep the old row (decay term: 0 terms): "
                     "not a delta-rule update")
    if len(bank_terms) == 1:
        raise Reject("no retrieval from the decayed rows subtracted from the value "
                     "(plain outer-product write, no delta)" if _close(bank_terms[0].coef, 1.0) else
                     "the old row is scaled by a number (no separate retrieval term)")
    if len(bank_terms) > 2:
        raise Reject("more than one retrieval term in the written rows")
    snames, streams, sshape = _streams(live, ls)
    names = {ld: "d"} | snames
    b = B[0]
    if b.bound:
        raise Reject("the value term is summed over an axis of the step")
    bparts = _by_axis(_split(b, names), "value term")
    v, X = bparts["d"], bparts[""]
    if not v:
        raise Reject("the value term has no value vector v[d]")
    # the decay term is the one with fewer factors first: its reason is the one reported
    bank_terms.sort(key=lambda t: len(t.factors))
    found, errors = [], []
    for d, c in (bank_terms, bank_terms[::-1]):
        try:
            found.append(_one_slot_roles(d, c, b, X, names))
        except Reject as e:
            errors.append(e)
    if not found:
        raise errors[0]
    if len(found) > 1:
        raise Reject("the decay and retrieval terms of a one-slot write cannot be told apart")
    k, gate, beta, strength, a = found[0]
    return WriteRoles(idx, k, gate, beta, strength, v, 1, hd, streams=streams,
                      v_coef=_ratio(b.coef, strength), stream_shape=sshape, decay_coef=a)


def _decay_number(coef: float) -> float:
    """The decay term's number (``rows * 0.9``): a constant decay ``exp(log 0.9)``,
    exactly 1 where it is 1 to rounding. A number <= 0 (or not finite) is no decay."""
    if _close(coef, 1.0):
        return 1.0
    if not (0.0 < coef < float("inf")):
        raise Reject(f"the old row is scaled by {coef:g}, which is not a decay exp(g)")
    return coef


def _ratio(a: float, b: float) -> float:
    """``a / b``, exactly 1 where the two agree to rounding (no multiply emitted then)."""
    return 1.0 if _close(a, b) else a / b


def _exp_gate(dparts, a_f):
    """The decay term's single ``exp(g)`` (or ``sigmoid(x)``) factor (per slot or per
    token) among the factors ``a_f``, or None (no decay); anything else is rejected."""
    if dparts["d"] or len(a_f) > 1:
        raise Reject("the decay of the written rows is not a single exp(g) per slot or per token")
    gate = a_f[0] if a_f else None
    if gate is not None and gate.atom.exp_of is None:
        raise Reject(f"the written rows are scaled by {gate.atom.node}, "
                     "not by exp(g) or sigmoid(x)")
    return gate


def _one_slot_roles(d, c, b, X, names):
    """(k, gate, beta, strength, decay number a) when ``d`` is the decay term and ``c`` the
    retrieval term (the strength: the retrieval's number, as in ``match_write``)."""
    if d.bound or c.bound:
        raise Reject("the old row is summed in the decay term")
    a = _decay_number(d.coef)
    dparts = _by_axis(_split(d, names), "decay term")
    gate = _exp_gate(dparts, dparts[""])
    cparts = _by_axis(_split(c, names), "retrieval term")
    if cparts["d"]:
        raise Reject("the retrieval is scaled along the value dim")
    have = _ms(cparts[""])
    gates = _ms([gate] if gate is not None else [])
    if not (_ms(X) + gates <= have):
        if gate is not None and _ms(X) <= have and not gates <= have:
            raise Reject("the retrieval reads the rows before their decay (spec: retrieve from decayed rows)")
        raise Reject("the retrieval uses other weights or gates than the write")
    extra = have - _ms(X) - gates
    if not extra <= _ms(X):
        raise Reject("the delta is spread over the written row with other weights than in the value term")
    k, beta, left = [], [], Counter(extra)
    for rf in X:
        if left[rf.sig()] > 0:
            left[rf.sig()] -= 1
            k.append(rf)
        else:
            beta.append(rf)
    return k, gate, beta, -c.coef / a, a


def match_read(val: Sym, bank_id: int) -> ReadRoles:
    """Roles of a canonical reading (a weighted sum of rows of one bank state), ``[hd]``
    or ``[B, hd]`` / ``[B, H, hd]`` for streams (size-1 dims aside)."""
    live = [lb for lb in val.axes if lb is not None]
    if not live or len(val.terms) != 1:
        raise Reject(f"a bank-dependent value of shape {list(val.shape)} leaves the loop and "
                     "is not a reading (sum_r q[r] * M[q_idx[r]])")
    (t,) = val.terms
    bank = t.bank_factors()
    if len(bank) != 1:
        raise Reject("a value that leaves the loop does not read the bank linearly")
    f = bank[0]
    bid, ver, atom = f.ref
    if bid != bank_id:
        raise Reject("a reading mixes two banks")
    *rlead, col = f.labels
    ld, ls = live[-1], tuple(live[:-1])
    if col != ld:
        raise Reject("a reading mixes bank columns")
    row = rlead[-1] if rlead else None
    if ls:
        if tuple(rlead) == ls:
            row = None          # one read slot per stream (R = 1)
        elif len(rlead) != len(ls) + 1 or tuple(rlead[:-1]) != ls:
            raise Reject("a reading of several streams mixes their rows")
    elif len(rlead) > 1:
        raise Reject("a reading sums over streams")
    if t.bound != ({row} if row is not None else set()):
        raise Reject("a reading sums over other axes than the read slots")
    if ver == 0:
        raise Reject("the bank is read before the first token's write (read before write)")
    snames, streams, sshape = _streams(list(zip(val.shape, val.axes)), ls)
    names = {ld: "d"} | ({row: "r"} if row is not None else {}) | snames
    parts = _by_axis(_split(t, names), "reading")
    if parts["d"] or parts["w"] or parts["u"]:
        raise Reject("a reading is scaled along the value dim")
    R = 1 if row is None else [n for n in atom.shape if n != 1][-1]
    return ReadRoles(atom, parts["r"] + parts[""], t.coef, R, ver, tuple(val.shape),
                     streams=streams, stream_shape=sshape)
