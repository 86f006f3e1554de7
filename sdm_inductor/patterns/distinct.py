"""Proofs, from the graph, that one token's write slots are distinct.

The loop and the op agree on a token whose write slots are distinct; for a repeated
slot they differ (spec section 1). So a rewrite needs either a proof (indices from
``topk``, ``sort``/``argsort``, ``unique``, ``randperm``, ``arange``, product keys) or the
user's word (``assume_distinct_write_slots``), or it inserts a runtime check.

``proof(node)`` returns a short name of the proof that the last dim of ``node`` holds
distinct values, or None. ``bound(node)`` is an exclusive upper bound of the values
where one is known (for product keys), else None.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

__all__ = ["proof"]


def _name(t) -> str:
    if isinstance(t, str):
        return t
    if isinstance(t, torch._ops.OpOverload):
        return t._schema.name.split("::")[-1]
    return getattr(t, "__name__", str(t))


def _meta(n):
    v = n.meta.get("val", n.meta.get("example_value"))
    return v if isinstance(v, torch.Tensor) else None


def _ndim(n):
    v = _meta(n)
    return v.dim() if v is not None else None


_CASTS = {"long", "int", "to", "_to_copy", "convert_element_type", "type", "clone", "contiguous",
          "alias", "detach"}
_PERM_SOURCES = {"randperm": "randperm", "arange": "arange"}


def _last_dim(n, dim) -> bool:
    nd = _ndim(n)
    return dim is None or nd is None or dim in (-1, nd - 1)


def _tuple_item(n: fx.Node):
    """(producer, index) for ``getitem(producer, i)`` / ``producer.indices``."""
    if n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[1], int):
        return n.args[0], n.args[1]
    if n.op == "call_function" and n.target is getattr and n.args[1] == "indices":
        return n.args[0], 1
    return None, None


def proof(n, depth: int = 0) -> str | None:
    if not isinstance(n, fx.Node) or depth > 32:
        return None
    name = _name(n.target) if n.op in ("call_function", "call_method") else ""
    base = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
    prod, i = _tuple_item(n)
    if prod is not None and isinstance(prod, fx.Node):
        pname = _name(prod.target)
        dim = prod.kwargs.get("dim", prod.args[2] if pname == "topk" and len(prod.args) > 2 else
                              (prod.args[1] if pname == "sort" and len(prod.args) > 1 else -1))
        if pname == "topk" and i == 1 and _last_dim(prod, dim):
            return "topk"
        if pname == "sort" and i == 1 and _last_dim(prod, dim):
            return "sort"
        if pname in ("unique", "_unique2", "_unique") and i == 0:
            return "unique"
        return None
    if name in _PERM_SOURCES:
        return _PERM_SOURCES[name]
    if name == "argsort":
        dim = n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else -1)
        return "argsort" if _last_dim(base, dim) else None
    if name in ("unique",) and not n.kwargs.get("return_inverse") and not n.kwargs.get("return_counts"):
        return "unique"
    if base is None:
        return None
    if name in _CASTS:
        return proof(base, depth + 1)
    if name in ("getitem", "select", "slice") or n.target is operator.getitem:
        return proof(base, depth + 1) if _keeps_last_dim(n) else None
    if name in ("view", "reshape", "_unsafe_view", "squeeze", "unsqueeze", "flatten"):
        if _same_last(n, base):
            return proof(base, depth + 1)
        if _name(base.target) == "add" and _ndim(base) == 2 and _ndim(n) == 1:
            return _product_keys(base, depth)   # the 2-D key grid flattened
        return None
    if name in ("add", "sub") and len(n.args) > 1:
        other = n.args[1]
        if isinstance(other, int) or (isinstance(other, fx.Node) and _const_last(other)):
            return proof(base, depth + 1)
        if name == "add":
            return _pair_keys(n, depth)
        return None
    if name in ("transpose", "swapaxes", "permute") and _same_last(n, base) and _keeps_last_axis(n):
        return proof(base, depth + 1)
    return None


def _keeps_last_axis(n) -> bool:
    nd = _ndim(n)
    if nd is None:
        return False
    if _name(n.target) == "permute":
        order = n.args[1:] if len(n.args) > 2 or isinstance(n.args[1], int) else n.args[1]
        return order[-1] % nd == nd - 1
    dims = [d % nd for d in n.args[1:3]]
    return nd - 1 not in dims


def _gather_last(n):
    """(source, index) of ``source.gather(-1, index)``."""
    if isinstance(n, fx.Node) and _name(n.target) == "gather" and len(n.args) >= 3:
        dim = n.args[1]
        if _last_dim(n.args[0], dim):
            return n.args[0], n.args[2]
    return None, None


def _pair_keys(n, depth):
    """``a.gather(-1, p // K) * N + b.gather(-1, p % K)``: pairs (p // K, p % K) of distinct p
    are distinct, a and b are distinct, and 0 <= b < N, so the keys are distinct (the
    product-key top-k of sdm_inductor.nn)."""
    x, y = n.args[0], n.args[1]
    for hi, lo in ((x, y), (y, x)):
        if not (isinstance(hi, fx.Node) and isinstance(lo, fx.Node)) or _name(hi.target) != "mul":
            continue
        if len(hi.args) < 2 or not isinstance(hi.args[1], int):
            continue
        N = hi.args[1]
        a, ia = _gather_last(hi.args[0])
        b, ib = _gather_last(lo)
        if a is None or b is None or not isinstance(ia, fx.Node) or not isinstance(ib, fx.Node):
            continue
        if _name(ia.target) not in ("floordiv", "floor_divide") or _name(ib.target) not in ("mod", "remainder"):
            continue
        if ia.args[0] is not ib.args[0] or ia.args[1] != ib.args[1] or not isinstance(ia.args[1], int):
            continue
        bb = bound(b)
        if bb is not None and bb <= N and proof(ia.args[0], depth + 1) and proof(a, depth + 1) \
                and proof(b, depth + 1):
            return "product keys"
    return None


def _strip_views(n):
    """The tensor under ``x[:, None]`` / ``x.unsqueeze(d)`` views."""
    while isinstance(n, fx.Node) and n.op in ("call_function", "call_method") and n.args:
        name = _name(n.target)
        if name == "unsqueeze" or (n.target is operator.getitem and _view_index(n.args[1])):
            n = n.args[0]
        else:
            break
    return n


def _view_index(idx) -> bool:
    idx = idx if isinstance(idx, tuple) else (idx,)
    return all(i is None or i == slice(None) for i in idx)


def _same_last(n, base) -> bool:
    a, b = _meta(n), _meta(base)
    return a is not None and b is not None and a.dim() >= 1 and b.dim() >= 1 and a.shape[-1] == b.shape[-1] \
        and a.numel() == b.numel()


def _const_last(n) -> bool:
    v = _meta(n)
    return v is not None and (v.dim() == 0 or v.shape[-1] == 1)


def _keeps_last_dim(n) -> bool:
    """Basic indexing that selects along leading dims (or slices the last dim)."""
    src, out = _meta(n.args[0]), _meta(n)
    if src is None or out is None or out.dim() == 0:
        return False
    name = _name(n.target)
    if name == "select":
        dim = n.args[1]
        return dim % src.dim() != src.dim() - 1
    if name == "slice":
        return True
    idx = n.args[1]
    idx = idx if isinstance(idx, tuple) else (idx,)
    if any(isinstance(i, fx.Node) or i is Ellipsis or i is None for i in idx):
        return False
    return len(idx) < src.dim() or isinstance(idx[-1], slice)


def bound(n, depth: int = 0):
    """Exclusive upper bound of non-negative values in ``n`` (indices into a dim of that size)."""
    if not isinstance(n, fx.Node) or depth > 16:
        return None
    prod, i = _tuple_item(n)
    if prod is not None and _name(prod.target) in ("topk", "sort") and i == 1:
        src = _meta(prod.args[0])
        return src.shape[-1] if src is not None else None
    name = _name(n.target) if n.op in ("call_function", "call_method") else ""
    if name == "randperm":
        return n.args[0] if isinstance(n.args[0], int) else None
    if name == "arange" and len(n.args) == 1 and isinstance(n.args[0], int):
        return n.args[0]
    if n.args and isinstance(n.args[0], fx.Node) and (name in _CASTS or name in ("getitem", "select", "slice", "view",
                                                                                 "reshape", "unsqueeze")):
        return bound(n.args[0], depth + 1)
    return None


def _product_keys(n, depth):
    """``a[..., :, None] * K + b[..., None, :]`` (flattened) with a, b distinct and 0 <= b < K."""
    x, y = n.args[0], n.args[1]
    for hi, lo in ((x, y), (y, x)):
        if not isinstance(hi, fx.Node) or not isinstance(lo, fx.Node):
            continue
        if _name(hi.target) != "mul" or len(hi.args) < 2 or not isinstance(hi.args[1], int):
            continue
        K = hi.args[1]
        a, b_ = _strip_views(hi.args[0]), _strip_views(lo)
        b = bound(b_)
        if b is not None and b <= K and proof(a, depth + 1) and proof(b_, depth + 1):
            return "product keys"
    return None
