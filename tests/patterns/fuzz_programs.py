"""Token-loop programs generated from a grammar of spellings, for differential checks of
the rewrites against eager.

A ``Spec`` picks one spelling per part of a token step (how rows are read and written,
how contractions are spelled, the layout of gates and beta, streams, dtypes, unrolled or
``scan``); ``source(spec)`` writes the program as Python source, as a user would, and
``build(spec)`` execs it. A spec with a ``mutation`` changes the step's meaning (read
before write, other retrieval weights, clamps, feedback, ...): those programs must be
left alone. Everything is drawn from ``random.Random(seed)``: a seed reproduces the
program.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import torch

S, HD, T, B, H = 16, 8, 4, 2, 3

MUTATIONS = ("read_before_write", "other_retrieval_weights", "undecayed_retrieval", "clamp",
             "feedback", "whole_bank_decay", "gate_on_delta", "no_delta", "beta_on_v_only",
             "tanh_bank", "state_kept", "other_write_rows", "value_in_bank")


@dataclass
class Spec:
    seed: int
    layout: str         # one | batched | heads ([B, H, S, hd] bank) | flat | flat_global
    W: int
    R: int
    bank_dtype: str     # float32 | bfloat16
    idx_dtype: str      # int32 | int64
    gate: str           # none | T | T1 | TW (per write)
    gate_dtype: str     # float32 | bank
    beta: str           # none | T | T1 | scalar
    read: str           # index | index_select | gather | embedding | take_along_dim
    write: str          # index_put | setitem | index_copy | scatter | index_add | scatter_add |
    #                     zeros_add (a delta scattered into zeros, added) | setitem_add (M[idx] += delta)
    contract: str       # mulsum | matmul | einsum | bmm | tmatmul (rows.T @ w)
    outer: str          # mul | outer | einsum | addcmul (new = addcmul(dec, k, delta))
    form: str           # unrolled | scan
    meta_use: bool      # the bank's metadata used before the loop (new_empty, .shape, ...)
    mutation: str | None = None
    scale: str = "none"     # none | value (beta * (0.5 v - r)) | retrieval (beta * (v - 2 r))
    decay: str = "exp"      # exp | sigmoid (the rows decay by exp(g) or sigmoid(g))
    root: str = "input"     # input | view (the bank is block 1 of a stacked input: mem[1])
    shared: bool = False    # batched / heads: one [T, W] index for every stream (mem[:, idx])
    number: bool = False    # a constant decay on top of the gate, if any: rows * 0.9

    def short(self):
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())


_WRITES = {"one": ("index_put", "setitem", "index_copy", "scatter", "index_add", "scatter_add", "zeros_add",
                   "setitem_add"),
           "batched": ("index_put", "setitem", "scatter", "scatter_add", "zeros_add"),
           "flat": ("index_put", "setitem", "setitem_add"),
           "flat_global": ("index_put", "setitem", "index_copy", "index_add", "zeros_add")}
_READS = {"one": ("index", "index_select", "gather", "embedding", "take_along_dim"),
          "batched": ("index", "gather", "take_along_dim"),
          "flat": ("index",), "flat_global": ("index", "index_select")}


def draw(seed: int, mutation: str | None = None) -> Spec:
    r = random.Random(seed)
    layout = r.choice(("one", "one", "one", "batched", "flat", "flat_global"))
    form = "scan" if layout == "one" and r.random() < 0.2 else "unrolled"
    gate = r.choice(("none", "T", "T1", "TW"))
    spec = Spec(seed=seed, layout=layout, W=r.choice((1, 2, 3)), R=r.choice((1, 2)),
                bank_dtype=r.choice(("float32", "float32", "bfloat16")),
                idx_dtype=r.choice(("int32", "int64")), gate=gate,
                gate_dtype=r.choice(("float32", "bank")), beta=r.choice(("none", "T", "T1", "scalar")),
                read=r.choice(_READS[layout]), write=r.choice(_WRITES[layout]),
                contract=r.choice(("mulsum", "matmul", "einsum", "bmm", "tmatmul")),
                outer=r.choice(("mul", "outer", "einsum", "addcmul")), form=form,
                meta_use=r.random() < 0.3, mutation=mutation,
                scale=r.choice(("none", "none", "value", "retrieval")),
                decay=r.choice(("exp", "exp", "sigmoid")))
    if form == "scan" and spec.write in ("setitem", "zeros_add", "setitem_add"):
        spec.write = "index_put"
    if spec.layout.startswith("flat") and spec.W == 1:
        spec.W = 2      # one slot per stream of a flat bank: left alone by design (see the corpus)
    if mutation in ("undecayed_retrieval", "gate_on_delta"):
        # a per-token gate there is a canonical step in disguise (beta * a, k / a)
        spec.gate, spec.W = "TW", max(spec.W, 2)
    if mutation == "beta_on_v_only" and spec.beta == "none":
        spec.beta = "T"
    if mutation is not None and form == "scan" and mutation in (
            "feedback", "state_kept", "whole_bank_decay", "value_in_bank"):
        spec.form = "unrolled"
    if mutation == "value_in_bank":     # v: rows of the bank that the loop writes in place
        spec.write = "setitem"
    spec.root = "view" if r.random() < 0.25 and mutation != "value_in_bank" else "input"
    if spec.layout == "batched" and r.random() < 0.5:
        spec.layout = "heads"           # streams along two dims: M[bi, hi, idx]
        if spec.contract == "bmm":      # bmm takes one batch dim
            spec.contract = "matmul"
    if spec.layout in ("batched", "heads") and r.random() < 0.3:
        spec.shared = True              # (one slot shared: left alone, see README)
        spec.W, spec.R = max(spec.W, 2), max(spec.R, 2)
        heads = spec.layout == "heads"
        spec.read = "index" if heads else r.choice(("index", "index_select"))
        spec.write = "setitem" if heads or mutation == "value_in_bank" else r.choice(
            ("setitem", "index_copy", "index_add", "zeros_add"))
    # (an undecayed retrieval under a number is a step in disguise: v * 0.9, beta / 0.9)
    spec.number = r.random() < 0.2 and mutation != "undecayed_retrieval"
    return spec


# ---------------------------------------------------------------- inputs

def inputs(spec: Spec, seed: int | None = None) -> dict:
    gen = torch.Generator().manual_seed(spec.seed if seed is None else seed)
    bdt = getattr(torch, spec.bank_dtype)
    gdt = bdt if spec.gate_dtype == "bank" else torch.float32
    idt = getattr(torch, spec.idx_dtype)
    W, R = spec.W, spec.R
    lead = {"one": (), "heads": (B, H)}.get(spec.layout, (B,))

    def slots(n, distinct):
        def one():
            return torch.randperm(S, generator=gen)[:n] if distinct else torch.randint(0, S, (n,), generator=gen)
        def block(dims):
            if not dims:
                return torch.stack([one() for _ in range(T)])
            return torch.stack([block(dims[1:]) for _ in range(dims[0])])
        return block(lead)

    if spec.shared:
        lead, full = (), lead
    k_idx, q_idx = slots(W, True), slots(R, False)
    if spec.shared:
        lead = full
    if spec.layout == "flat_global":       # global row ids of stream b's private range
        off = (torch.arange(B) * S)[:, None, None]
        k_idx, q_idx = k_idx + off, q_idx + off
    bank_shape = {"one": (S, HD), "batched": (B, S, HD), "heads": (B, H, S, HD), "flat": (B * S, HD),
                  "flat_global": (B * S, HD)}
    mem = torch.randn(bank_shape[spec.layout], generator=gen).to(bdt)
    if spec.root == "view":             # other rows before the bank: a view at an offset
        mem = torch.stack([torch.randn(mem.shape, generator=gen).to(bdt), mem])
    d = dict(mem=mem,
             k_idx=k_idx.to(idt),
             k_val=(torch.randn(*lead, T, W, generator=gen) * 0.5).to(bdt),
             v=torch.randn(*lead, T, HD, generator=gen).to(bdt),
             q_idx=q_idx.to(idt),
             q_val=torch.randn(*lead, T, R, generator=gen).to(bdt))
    bshape = {"T": (*lead, T), "T1": (*lead, T, 1), "scalar": ()}
    if spec.beta != "none":
        d["beta"] = (torch.rand(bshape[spec.beta], generator=gen) * 0.8 + 0.1).to(bdt)
    gshape = {"T": (*lead, T), "T1": (*lead, T, 1), "TW": (*lead, T, W)}
    if spec.gate != "none":
        d["g"] = (-torch.rand(gshape[spec.gate], generator=gen) * 0.5).to(gdt)
    return d


def copies(spec: Spec, d: dict) -> dict:
    """Fresh copies of the inputs ``d`` for one run; the ``value_in_bank`` mutation's
    ``v`` stays a view of the ``mem`` of its run (odd seeds)."""
    out = {k: t.clone() for k, t in d.items()}
    if spec.mutation == "value_in_bank" and spec.seed % 2:
        out["v"] = eval(_rows_as_values(spec.layout, "out['mem']", "out['v']"))
    return out


def _rows_as_values(layout: str, mem: str, v: str) -> str:
    """The first rows of the bank ``mem``, viewed as the values ``v`` (same shape)."""
    if layout == "one":
        return f"{mem}[:{v}.shape[0]]"
    if layout == "batched":
        return f"{mem}[:, :{v}.shape[1]]"
    if layout == "heads":
        return f"{mem}[:, :, :{v}.shape[2]]"
    return f"{mem}[:{v}.shape[0] * {v}.shape[1]].view({v}.shape)"


# ---------------------------------------------------------------- source

class _Code:
    def __init__(self):
        self.lines = []

    def __call__(self, line, depth=1):
        self.lines.append("    " * depth + line)


def _tok(spec: Spec, name: str) -> str:
    if spec.shared and name in ("k_idx", "q_idx"):
        return f"{name}[t]"
    """Token t of a per-token input, in the program's layout."""
    return {"one": f"{name}[t]", "heads": f"{name}[:, :, t]"}.get(spec.layout, f"{name}[:, t]")


def source(spec: Spec) -> str:
    if spec.form == "scan":
        return _scan_source(spec)
    args = ["mem", "k_idx", "k_val", "v"] + (["beta"] if spec.beta != "none" else []) + \
        (["g"] if spec.gate != "none" else []) + ["q_idx", "q_val"]
    c = _Code()
    c(f"def prog({', '.join(args)}):", 0)
    if spec.root == "view":
        c("mem = mem[1]")
    layout = spec.layout
    if spec.meta_use:
        c("n_tok = k_idx.shape[-2]")
        c("outs_buf = mem.new_empty(n_tok, mem.shape[-1]) if mem.dim() == 2 else None")
        c("dt, dev = mem.dtype, mem.device")
        c("zero = torch.zeros((), dtype=dt, device=dev)")
    if layout == "batched":
        c("bi = torch.arange(mem.shape[0])[:, None]")
    if layout == "heads":
        c("bi = torch.arange(mem.shape[0])[:, None, None]")
        c("hi = torch.arange(mem.shape[1])[None, :, None]")
    if layout == "flat":
        c("off = (torch.arange(k_idx.shape[0]) * (mem.shape[0] // k_idx.shape[0]))[:, None]")
    if spec.mutation == "value_in_bank":
        if spec.seed % 2:   # v given as a view of the bank (``copies``), written in place
            pass
        else:               # v taken from the bank's rows inside the program
            c("mem = mem.clone()")
            c(f"v = {_rows_as_values(layout, 'mem', 'v')}")
    elif spec.write in ("setitem", "setitem_add") and not (spec.root == "view" and spec.seed % 2):
        c("mem = mem.clone()")      # (odd seeds of root=view write the caller's block 1 in place)
    c("outs = []")
    if spec.mutation == "feedback":
        c(f"prev = torch.zeros_like({_tok(spec, 'v').replace('t]', '0]')})")
    tdim = {"one": 0, "heads": 2}.get(layout, 1)
    c(f"for t in range(k_idx.shape[{0 if spec.shared else tdim}]):")
    _step(spec, c, 2, ki=_tok(spec, "k_idx"), kv=_tok(spec, "k_val"), vt=_tok(spec, "v"),
          b=_tok(spec, "beta") if spec.beta in ("T", "T1") else ("beta" if spec.beta == "scalar" else None),
          gg=_tok(spec, "g") if spec.gate != "none" else None, qi=_tok(spec, "q_idx"), qv=_tok(spec, "q_val"))
    c("outs.append(r)", 2)
    if spec.mutation == "feedback":
        c("prev = r", 2)
    c(f"return torch.stack(outs, {tdim}), mem")
    return "\n".join(c.lines) + "\n"


def _scan_source(spec: Spec) -> str:
    xs = ["k_idx", "k_val", "v"] + (["beta"] if spec.beta in ("T", "T1") else []) + \
        (["g"] if spec.gate != "none" else []) + ["q_idx", "q_val"]
    args = ["mem", "k_idx", "k_val", "v"] + (["beta"] if spec.beta != "none" else []) + \
        (["g"] if spec.gate != "none" else []) + ["q_idx", "q_val"]
    c = _Code()
    c(f"def prog({', '.join(args)}):", 0)
    if spec.root == "view":
        c("mem = mem[1]")
    c("from torch._higher_order_ops.scan import scan")
    c("def body(mem, x):")
    names = {"k_idx": "ki", "k_val": "kv", "v": "vt", "beta": "b", "g": "gg", "q_idx": "qi", "q_val": "qv"}
    c(", ".join(names[x] for x in xs) + " = x", 2)
    _step(spec, c, 2, ki="ki", kv="kv", vt="vt",
          b="b" if spec.beta in ("T", "T1") else ("beta" if spec.beta == "scalar" else None),
          gg="gg" if spec.gate != "none" else None, qi="qi", qv="qv")
    c("return mem, r", 2)
    c(f"mem, outs = scan(body, mem, ({', '.join(xs)},))")
    c("return outs, mem")
    return "\n".join(c.lines) + "\n"


def _step(spec: Spec, c: _Code, d: int, ki, kv, vt, b, gg, qi, qv):
    lay, W, R, mut = spec.layout, spec.W, spec.R, spec.mutation
    bat = lay != "one"
    long_ = ".long()" if spec.idx_dtype == "int32" else ""
    # row index of the token's writes and reads
    if lay == "flat":
        c(f"idx = {ki} + off", d)
        c(f"qidx = {qi} + off", d)
    elif lay == "flat_global":
        c(f"idx = {ki}.reshape(-1)", d)
        c(f"qidx = {qi}.reshape(-1)", d)
    else:
        c(f"idx = {ki}", d)
        c(f"qidx = {qi}", d)
    if mut == "whole_bank_decay":
        # each row at its own rate (a uniform one is an SDM step on the bank rescaled by
        # 0.9^t, with values rescaled likewise: the rewrite may take that one)
        c("mem = mem * torch.linspace(0.8, 1.0, mem.shape[-2], dtype=mem.dtype)[:, None]", d)
    c(f"rows = {_read(spec, 'idx', W)}", d)
    # decay
    if gg is None:
        c("dec = rows", d)
    else:
        fn = spec.decay
        a = {"T": f"{gg}.{fn}()", "T1": f"torch.{fn}({gg})", "TW": f"{gg}.{fn}()"}[spec.gate]
        if spec.gate == "T":
            a = a if not bat else f"{a}[..., None, None]"
        elif spec.gate == "T1":
            a = a if not bat else f"{a}[..., None]"
        else:
            a = f"{a}[..., None]"
        c(f"a = {a}", d)
        mixed = spec.bank_dtype == "bfloat16" and spec.gate_dtype == "float32"
        c("dec = (rows * a).to(rows.dtype)" if mixed else "dec = rows * a", d)
    if spec.number:
        c("dec = dec * 0.9", d)
    src = "rows" if mut == "undecayed_retrieval" else "dec"
    kr = f"{kv}.sin()" if mut == "other_retrieval_weights" else kv
    c(f"ret = {_contract(spec, kr, src, 'w')}", d)
    if spec.scale == "retrieval":
        c("ret = 2.0 * ret", d)
    vv = f"({vt} + 0.5 * prev)" if mut == "feedback" else vt
    if spec.scale == "value":
        vv = f"(0.5 * {vv})"
    if mut == "no_delta":
        c(f"delta = {vv}", d)
    elif b is None:
        c(f"delta = {vv} - ret", d)
    else:
        bb = b
        if bat and spec.beta == "T":
            bb = f"{b}[..., None]"
        if mut == "beta_on_v_only":
            c(f"delta = {bb} * {vv} - ret", d)
        else:
            c(f"delta = {bb} * ({vv} - ret)", d)
    term = _outer(spec, kv, "delta")
    if mut == "gate_on_delta":
        term = f"a * {term}"
    if spec.outer == "addcmul" and mut != "gate_on_delta":
        c(f"new = torch.addcmul(dec, {kv}[..., None], delta[..., None, :])", d)
    else:
        c(f"new = dec + {term}", d)
    if mut == "clamp":
        c("new = new.clamp(-0.5, 0.5)", d)
    if mut == "tanh_bank":
        c("new = torch.tanh(new)", d)
    if mut == "gate_on_delta" and spec.bank_dtype == "bfloat16":
        c("new = new.to(mem.dtype)", d)
    widx = "idx"
    if mut == "other_write_rows":
        widx = "qidx" if R == W else ("idx.flip(-1)" if W > 1 else "idx")
        if widx == "idx":           # one slot: write the row of the next slot of the bank
            widx = f"((idx + 1) % {S if lay in ('one', 'batched', 'heads') else B * S})"
    _write(spec, c, d, widx, long_)
    c(f"rd = {_read(spec, 'qidx', R, bank='mem_before' if mut == 'read_before_write' else 'mem')}", d)
    c(f"r = {_contract(spec, qv, 'rd', 'r')}", d)
    if mut == "state_kept":
        c("r = r + mem.sum() * 0.0 + mem.mean()", d)


def _read(spec, idx, n, bank="mem"):
    lay = spec.layout
    if spec.shared:     # M[:, idx] (odd seeds: M[bi, idx], the aranges broadcast over idx)
        if spec.read == "index_select":
            return f"{bank}.index_select(1, {idx})"
        at = ("bi, hi" if lay == "heads" else "bi") if spec.seed % 2 else (":, :" if lay == "heads" else ":")
        return f"{bank}[{at}, {idx}]"
    if lay == "one":
        if spec.read == "index_select":
            return f"{bank}.index_select(0, {idx})" if spec.seed % 2 else f"torch.index_select({bank}, 0, {idx})"
        if spec.read == "embedding":
            return f"torch.nn.functional.embedding({idx}, {bank})"
        if spec.read == "gather":
            return f"{bank}.gather(0, {idx}{'.long()' if spec.idx_dtype == 'int32' else ''}[:, None].expand(-1, {bank}.shape[-1]))"
        if spec.read == "take_along_dim":
            long_ = ".long()" if spec.idx_dtype == "int32" else ""
            return f"torch.take_along_dim({bank}, {idx}{long_}[:, None], dim=0)"
        return f"{bank}[{idx}]"
    if lay == "batched":
        if spec.read == "gather":
            return f"{bank}.gather(1, {idx}{'.long()' if spec.idx_dtype == 'int32' else ''}[..., None].expand(-1, -1, {bank}.shape[-1]))"
        if spec.read == "take_along_dim":
            long_ = ".long()" if spec.idx_dtype == "int32" else ""
            return f"{bank}.take_along_dim({idx}{long_}[..., None], dim=1)"
        return f"{bank}[bi, {idx}]"
    if lay == "heads":
        long_ = ".long()" if spec.idx_dtype == "int32" else ""
        if spec.read == "gather":
            return f"{bank}.gather(2, {idx}{long_}[..., None].expand(-1, -1, -1, {bank}.shape[-1]))"
        if spec.read == "take_along_dim":
            return f"torch.take_along_dim({bank}, {idx}{long_}[..., None], dim=2)"
        return f"{bank}[bi, hi, {idx}]"
    if lay == "flat":
        return f"{bank}[{idx}]"
    inner = f"{bank}.index_select(0, {idx})" if spec.read == "index_select" else f"{bank}[{idx}]"
    return f"{inner}.view({B}, {n}, {HD})"


def _contract(spec, w, rows, letter):
    """sum_w w[w] * rows[w, :] per stream."""
    bat = spec.layout != "one"
    k = spec.contract
    if not bat:
        if k == "mulsum":
            return f"({w}[:, None] * {rows}).sum(0)"
        if k == "matmul":
            return f"{w} @ {rows}"
        if k == "einsum":   # (seeds divisible by 3: with an ellipsis)
            eq = f"{letter},{letter}...->..." if spec.seed % 3 == 0 else f"{letter},{letter}d->d"
            return f"torch.einsum('{eq}', {w}, {rows})"
        if k == "tmatmul":
            return f"{rows}.T @ {w}"
        return f"torch.bmm({w}[None, None, :], {rows}[None]).reshape({HD})"
    if k == "mulsum":
        return f"({w}[..., None] * {rows}).sum(-2)"
    if k == "matmul":
        return f"({w}[..., None, :] @ {rows}).squeeze(-2)"
    if k == "einsum":
        s = "..." if spec.seed % 3 == 0 else "bh" if spec.layout == "heads" else "b"
        return f"torch.einsum('{s}{letter},{s}{letter}d->{s}d', {w}, {rows})"
    if k == "tmatmul":
        return f"({rows}.mT @ {w}[..., None]).squeeze(-1)"
    return f"torch.bmm({w}.unsqueeze(1), {rows}).squeeze(1)"


def _outer(spec, k, delta):
    bat = spec.layout != "one"
    o = spec.outer
    if not bat:
        if o == "outer":
            return f"torch.outer({k}, {delta})"
        if o == "einsum":
            eq = "w,...->w..." if spec.seed % 3 == 0 else "w,d->wd"
            return f"torch.einsum('{eq}', {k}, {delta})"
        return f"{k}[:, None] * {delta}[None, :]"
    if o == "einsum" or o == "outer":
        s = "..." if spec.seed % 3 == 0 else "bh" if spec.layout == "heads" else "b"
        return f"torch.einsum('{s}w,{s}d->{s}wd', {k}, {delta})"
    return f"{k}[..., None] * {delta}[..., None, :]"


def _write(spec, c, d, idx, long_):
    lay, w = spec.layout, spec.write
    if spec.mutation == "read_before_write":
        c("mem_before = mem.clone()" if w in ("setitem", "setitem_add") else "mem_before = mem", d)
    if lay == "flat_global":
        flat = f"new.reshape(-1, {HD})"
        delta = f"(new - rows).reshape(-1, {HD})"
        if w == "index_put":
            c(f"mem = mem.index_put(({idx},), {flat})", d)
        elif w == "setitem":
            c(f"mem[{idx}] = {flat}", d)
        elif w == "index_copy":
            c(f"mem = mem.index_copy(0, {idx}{long_}, {flat})", d)
        elif w == "index_add":
            c(f"mem = mem.index_add(0, {idx}, {delta})", d)
        else:
            c("upd = torch.zeros_like(mem)", d)
            c(f"upd.index_add_(0, {idx}, {delta})", d)
            c("mem = mem + upd", d)
        return
    if w == "setitem_add":
        c(f"mem[{idx}] += new - rows", d)
        return
    zeros = "torch.zeros_like(mem)" if spec.seed % 3 else "torch.zeros(mem.shape, dtype=mem.dtype)"
    if spec.shared:
        at = ("bi, hi" if lay == "heads" else "bi") if spec.seed % 2 else (":, :" if lay == "heads" else ":")
        at = f"{at}, {idx}"
        if w == "setitem":
            c(f"mem[{at}] = new", d)
        elif w == "index_copy":
            c(f"mem = mem.index_copy(1, {idx}{long_}, new)", d)
        elif w == "index_add":
            c(f"mem = mem.index_add(1, {idx}, new - rows)", d)
        else:
            c(f"upd = {zeros}", d)
            c(f"upd.index_add_(1, {idx}, new - rows)", d)
            c("mem = mem + upd", d)
        return
    if lay in ("batched", "heads"):
        heads = lay == "heads"
        ex = f"{idx}{long_}[..., None].expand({'-1, ' * (3 if heads else 2)}{HD})"
        at = "bi, hi" if heads else "bi"
        dim = 2 if heads else 1
        if w == "index_put":
            c(f"mem = mem.index_put(({at}, {idx}), new)", d)
        elif w == "setitem":
            c(f"mem[{at}, {idx}] = new", d)
        elif w == "scatter":
            c(f"mem = mem.scatter({dim}, {ex}, new)", d)
        elif w == "scatter_add":
            c(f"mem = mem.scatter_add({dim}, {ex}, new - rows)", d)
        else:
            c(f"upd = {zeros}", d)
            c(f"upd.scatter_add_({dim}, {ex}, new - rows)", d)
            c("mem = mem + upd", d)
        return
    if w == "index_put":
        c(f"mem = mem.index_put(({idx},), new)", d)
    elif w == "setitem":
        c(f"mem[{idx}] = new", d)
    elif w == "index_copy":
        c(f"mem = mem.index_copy(0, {idx}{long_}, new)", d)
    elif w == "scatter":
        c(f"mem = mem.scatter(0, {idx}{long_}[:, None].expand(-1, {HD}), new)", d)
    elif w == "index_add":
        c(f"mem = mem.index_add(0, {idx}, new - rows)", d)
    elif w == "scatter_add":
        c(f"mem = mem.scatter_add(0, {idx}{long_}.unsqueeze(-1).expand_as(rows), new - rows)", d)
    else:
        c(f"upd = {zeros}", d)
        c(f"upd.scatter_add_(0, {idx}{long_}.unsqueeze(-1).expand_as(rows), new - rows)", d)
        c("mem = mem + upd", d)


def build(spec: Spec):
    """The program as a function, exec'd from its source (a file name per seed, so that
    Dynamo's code cache and tracebacks tell programs apart)."""
    src = source(spec)
    name = f"<sdm-fuzz seed={spec.seed} mutation={spec.mutation}>"
    ns = {"torch": torch}
    exec(compile(src, name, "exec"), ns)
    fn = ns["prog"]
    fn.__sdm_source__ = src
    return fn


def programs(n: int, seed: int = 0, mutant_share: float = 0.3):
    """``n`` specs: about ``mutant_share`` of them mutants, each mutation in turn."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        s = r.randrange(1 << 30)
        mut = MUTATIONS[i % len(MUTATIONS)] if r.random() < mutant_share else None
        out.append(draw(s, mut))
    return out
