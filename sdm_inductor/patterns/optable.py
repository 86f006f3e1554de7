"""Op tables: what torch-level (Dynamo) and aten-level ops mean in ``algebra`` terms.

Both front-ends share this module: a table maps an FX node to one of the algebra
primitives (or to a write into bank rows); nodes not in a table are atoms when they do
not depend on the bank and opaque when they do.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from . import algebra as A
from .algebra import BankVal, NotSymbolic, Sym
from .interpret import Merged, Opaque, Scattered, WriteOp, ZeroBuf, _deps, drop_columns

__all__ = ["TorchOps", "AtenOps"]

aten = torch.ops.aten

_RANDOM_WORDS = ("rand", "dropout", "bernoulli", "normal", "uniform", "multinomial", "poisson",
                 "exponential", "cauchy", "geometric", "log_normal")


def _name(target) -> str:
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) or str(target)


def _is_impure(node: fx.Node) -> bool:
    name = _name(node.target).lower()
    if any(w in name for w in _RANDOM_WORDS):
        return True
    if isinstance(node.target, torch._ops.OpOverload):
        return torch.Tag.nondeterministic_seeded in node.target.tags or node.target._schema.is_mutable
    return name.endswith("_") and not name.endswith("__") or node.target is operator.setitem


def _hashable(x, key):
    if isinstance(x, fx.Node):
        return ("n", key(x))
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(y, key) for y in x)
    if isinstance(x, slice):
        return ("slice", _hashable(x.start, key), _hashable(x.stop, key), _hashable(x.step, key))
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v, key)) for k, v in x.items()))
    try:
        hash(x)
        return x
    except TypeError:
        return repr(x)


# ops that use only the metadata (shape, dtype, device) of their first / second input
_META_FIRST = {"zeros_like", "empty_like", "ones_like", "full_like", "new_zeros", "new_empty",
               "new_ones", "new_full", "zeros_like.default", "empty_like.default", "ones_like.default",
               "full_like.default", "new_zeros.default", "new_empty.default", "new_ones.default",
               "new_full.default"}
_META_SECOND = {"expand_as", "view_as", "reshape_as", "type_as"}
_ZEROS = ("zeros_like", "new_zeros", "zeros")


class _Base:
    """Shared parts: shapes and dtypes from meta, value numbering, metadata-only inputs,
    zero buffers."""
    META = "val"

    def shape(self, node: fx.Node):
        v = node.meta.get(self.META)
        if not isinstance(v, torch.Tensor):
            return None
        # symbolic sizes are left alone: int() of a SymInt would not raise but guard
        # (specialize the compiled graph to the traced length)
        if not all(isinstance(s, int) for s in v.shape):
            return None
        return tuple(v.shape)

    def _int_cast_of(self, node: fx.Node):
        """The input of a cast between int32 and int64 (the same row indices), else None."""
        if node.op not in ("call_function", "call_method") or not node.args:
            return None
        name = _name(node.target).split(".")[0]
        if name not in ("long", "int", "to", "_to_copy", "convert_element_type"):
            return None
        x = node.args[0]
        ints = (torch.int32, torch.int64)
        if not isinstance(x, fx.Node) or self.dtype(x) not in ints or self.dtype(node) not in ints:
            return None
        if self.shape(x) is None or self.shape(x) != self.shape(node):
            return None
        return x

    def dtype(self, node: fx.Node):
        v = node.meta.get(self.META)
        return v.dtype if isinstance(v, torch.Tensor) else None

    def requires_grad(self, node: fx.Node) -> bool:
        v = node.meta.get(self.META)
        return isinstance(v, torch.Tensor) and v.requires_grad

    def value_key(self, node: fx.Node, key):
        src = self._int_cast_of(node)
        if src is not None:
            return ("alias", key(src))
        if node.op == "placeholder":
            return ("ph", node.target)
        if node.op == "get_attr":
            return ("attr", node.target)
        if node.op not in ("call_function", "call_method") or _is_impure(node):
            return None
        if node.target is operator.getitem:
            return getitem_key(node.args[0], node.args[1], key)
        return (node.op, _name(node.target), _hashable(node.args, key), _hashable(node.kwargs, key))

    def metadata_inputs(self, node: fx.Node) -> set:
        """Inputs of ``node`` whose shape, dtype and device only are used."""
        if node.op not in ("call_function", "call_method"):
            return set()
        name = _name(node.target)
        if node.op == "call_method" and name in _META_SECOND and len(node.args) > 1:
            return {node.args[1]} if isinstance(node.args[1], fx.Node) else set()
        if name in _META_FIRST and node.args and isinstance(node.args[0], fx.Node):
            return {node.args[0]}
        return set()

    def with_zero_sources(self, targets: set) -> set:
        """Write targets plus the banks that a written zero buffer is added to (``upd =
        zeros_like(M); upd.index_add_(...); M = M + upd``)."""
        out = set(targets)
        for n in targets:
            if not self._zeros(n):
                continue
            if _name(n.target).split(".")[0] in ("zeros_like", "new_zeros") and isinstance(n.args[0], fx.Node):
                out.add(n.args[0])
            for u in self.adds_of_buffer(n) or ():
                out.update(a for a in u.args[:2] if isinstance(a, fx.Node) and a is not n
                           and not (a.args and a.args[0] is n))
        return out

    def _zeros(self, node) -> bool:
        return (isinstance(node, fx.Node) and node.op in ("call_function", "call_method")
                and _name(node.target).split(".")[0] in _ZEROS)

    def adds_of_buffer(self, buf: fx.Node):
        """The adds ``buf`` (after one write into it) reaches, when every use of ``buf``
        is that write or such an add; else None (the zeros are a bank of their own)."""
        writes = [u for u in buf.users if u.args and u.args[0] is buf and self._is_write(u)]
        if len(writes) != 1:
            return None
        adds = []
        for u in list(buf.users) + list(writes[0].users):
            if u is writes[0]:
                continue
            if self.kind(u) != "add" or len(u.args) < 2:
                return None
            adds.append(u)
        return adds or None

    def _is_write(self, node) -> bool:
        return self.kind(node) in _WRITE_KINDS or node.target is operator.setitem

    def zero_buffer(self, an, node: fx.Node):
        """``ZeroBuf`` for zeros that a delta is written into and that are then added to a
        bank: ``zeros_like(M)`` / ``M.new_zeros(M.shape)`` of a bank state, or zeros of
        any spelling used only so."""
        if not self._zeros(node) or not node.args and not node.kwargs:
            return None
        shape = self.shape(node)
        if shape is None or len(shape) not in (2, 3, 4):
            return None
        name = _name(node.target).split(".")[0]
        src = an.value(node.args[0]) if node.args else None
        if name in ("zeros_like", "new_zeros") and isinstance(src, BankVal):
            if shape == tuple(src.shape) and self.dtype(node) == self.dtype(node.args[0]):
                return ZeroBuf(shape)
            return None
        if name in ("zeros_like", "new_zeros") and _deps(src) and self.adds_of_buffer(node) is not None:
            # the delta of a bank whose state went through a foreign op (``M = M * 0.9``)
            why = f"the bank is altered by a foreign op before {self.describe(node)}"
            for bid in _deps(src):
                an._reject_bank(bid, why)
            return Opaque(_deps(src), why)       # not a bank of its own
        if self.adds_of_buffer(node) is not None and not _deps(src):
            return ZeroBuf(shape)
        return None

    def describe(self, node: fx.Node) -> str:
        from .interpret import location
        return f"{_name(node.target)} ({location(node)})"

    # helpers for evaluate
    @staticmethod
    def sym(an, x):
        v = an.value(x)
        if isinstance(v, Sym):
            return v
        raise NotSymbolic(f"operand {x} is not a tensor of the algebra")

    def out_shape(self, node):
        s = self.shape(node)
        if s is None:
            raise NotSymbolic("output shape unknown or dynamic")
        return s


def getitem_key(base, idx, key):
    """Value key of ``base[idx]``: ``x[:, t, :]`` and ``x[:, t]`` are one value."""
    if isinstance(idx, tuple):
        idx = list(idx)
        while idx and idx[-1] == slice(None):
            idx.pop()
        idx = idx[0] if len(idx) == 1 and not isinstance(idx[0], (slice, type(None))) else tuple(idx)
    return ("call_function", "getitem", _hashable(base, key), _hashable(idx, key))


def _selects_size1(idx, shape) -> bool:
    """``x[0]`` / ``x[:, 0]`` / ``x[0, None]``: integers only select dims of size 1 (the
    result holds the same elements, like a squeeze)."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    dim = 0
    for i in idx:
        if i is None:
            continue
        if isinstance(i, bool) or not (isinstance(i, int) or i == slice(None)):
            return False
        if dim >= len(shape):
            return False
        if isinstance(i, int) and (shape[dim] != 1 or i not in (0, -1)):
            return False
        dim += 1
    return any(isinstance(i, int) and not isinstance(i, bool) for i in idx)


def _dim_arg(node, pos, name, default=None):
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


def _is_view_index(idx) -> bool:
    idx = idx if isinstance(idx, tuple) else (idx,)
    return all(i is None or i is Ellipsis or i == slice(None) for i in idx)


# ======================================================================== torch level

_T = {
    "mul": {operator.mul, torch.mul, "mul", operator.imul},
    "add": {operator.add, torch.add, "add", "add_"},
    "sub": {operator.sub, torch.sub, "sub"},
    "neg": {operator.neg, torch.neg, "neg"},
    "div": {operator.truediv, torch.div, "div", torch.true_divide},
    "sum": {torch.sum, "sum"},
    "view": {torch.reshape, "view", "reshape", torch.unsqueeze, "unsqueeze", torch.squeeze,
             "squeeze", torch.flatten, "flatten", "view_as", "reshape_as"},
    "expand": {"expand", "expand_as", torch.broadcast_to, "broadcast_to"},
    "permute": {torch.permute, "permute"},
    "transpose": {torch.transpose, "transpose", torch.swapaxes, "swapaxes"},
    "t": {torch.t, "t"},
    "same": {"contiguous", torch.clone, "clone"},
    "cast": {"to", "float", "bfloat16", "half", "double", "type_as"},
    "matmul": {operator.matmul, torch.matmul, "matmul", torch.mm, "mm", torch.bmm, "bmm",
               torch.mv, "mv", torch.dot, "dot"},
    "outer": {torch.outer, "outer", torch.ger, "ger"},
    "addcmul": {torch.addcmul, "addcmul"},
    "addmm": {torch.addmm, "addmm", torch.addmv, "addmv", torch.baddbmm, "baddbmm"},
    "einsum": {torch.einsum},
    "index_select": {torch.index_select, "index_select"},
    "gather": {torch.gather, "gather"},
    "take_along_dim": {torch.take_along_dim, "take_along_dim"},
    "index_put": {torch.index_put, "index_put", "index_put_"},
    "index_copy": {torch.index_copy, "index_copy", "index_copy_"},
    "index_add": {torch.index_add, "index_add", "index_add_"},
    "scatter": {torch.scatter, "scatter", "scatter_"},
    "scatter_add": {torch.scatter_add, "scatter_add", "scatter_add_"},
}
_TORCH_KIND = {t: k for k, ts in _T.items() for t in ts}
_INPLACE_ARITH = {operator.iadd: "add", operator.isub: "sub", operator.imul: "mul"}
_WRITE_KINDS = ("index_put", "index_copy", "index_add", "scatter", "scatter_add")


class TorchOps(_Base):
    """Dynamo's torch-level graph (``node.meta['example_value']``, not functional)."""
    META = "example_value"

    def kind(self, node):
        t = node.target
        try:
            return _TORCH_KIND.get(t)
        except TypeError:
            return None

    def exp_arg(self, node):
        """``(x, "exp")`` for ``exp(x)``, ``(x, "sigmoid")`` for ``sigmoid(x)`` (a decay
        whose log is ``logsigmoid(x)``), else None."""
        if node.args and isinstance(node.args[0], fx.Node):
            if node.target in (torch.exp, "exp"):
                return node.args[0], "exp"
            if node.target in (torch.sigmoid, "sigmoid", F.sigmoid):
                return node.args[0], "sigmoid"
        return None

    def write_targets(self, graph) -> set:
        out = set()
        for n in graph.nodes:
            if n.op not in ("call_function", "call_method"):
                continue
            if n.target is operator.setitem and self._advanced(n.args[1]) and self._slices_fit(n):
                out.add(n.args[0])
            elif self.kind(n) in _WRITE_KINDS:
                out.add(n.args[0])
        return self.with_zero_sources(out)

    def _advanced(self, idx) -> bool:
        if isinstance(idx, fx.Node):
            return isinstance(idx.meta.get(self.META), torch.Tensor)
        if isinstance(idx, tuple) and 1 <= len(idx) <= 3:
            # full slices in front: one index for every stream (``M[:, idx]``)
            return self._advanced(idx[-1]) and all(_all_streams(i) or self._advanced(i) for i in idx[:-1])
        return False

    def _slices_fit(self, node) -> bool:
        """``M[:, idx] = x`` writes rows of every stream only on a bank with stream dims
        (on a matrix it writes columns: not a bank)."""
        idx, shape = node.args[1], self.shape(node.args[0])
        return not (isinstance(idx, tuple) and any(_all_streams(i) for i in idx)) or (
            shape is not None and len(shape) == len(idx) + 1 >= 3)

    def inplace_target(self, node):
        if node.op == "call_method" and _name(node.target).endswith("_") and node.args:
            return node.args[0] if isinstance(node.args[0], fx.Node) else None
        if node.target is operator.setitem:
            return node.args[0]
        if node.op == "call_function" and node.kwargs.get("out") is not None:
            return node.kwargs["out"]
        return None

    def returns_self(self, node) -> bool:
        return node.target is not operator.setitem

    def evaluate(self, an, node):
        k = self.kind(node)
        t = node.target
        if t is operator.getitem:
            return self._getitem(an, node)
        if t is getattr and node.args[1:] in (("T",), ("mT",)):
            # ``x.T`` reverses every dim, ``x.mT`` swaps the last two (Dynamo keeps both as
            # getattr nodes)
            x = self.sym(an, node.args[0])
            n = len(x.shape)
            if node.args[1] == "T":
                return A.permute(x, list(range(n))[::-1])
            if n < 2:
                raise NotSymbolic("mT of a tensor of fewer than 2 dims")
            return A.permute(x, list(range(n - 2)) + [n - 1, n - 2])
        if t is operator.setitem:
            if not self._advanced(node.args[1]):
                return None
            if not isinstance(an.value(node.args[0]), (BankVal, ZeroBuf)):
                return WriteOp(node.args[0], None, None, False, True)
            return WriteOp(node.args[0], bank_index(an, an.value(node.args[0]), node.args[1]),
                           self._vals(an, node.args[2]), False, True)
        added = _bank_plus_scattered(an, node, k)
        if added is not None:
            return added
        if t in _INPLACE_ARITH:
            return self._inplace_arith(an, node)
        if t is F.embedding:
            return self._embedding(an, node)
        if k is None:
            if t in (torch.exp, "exp"):
                x = an.value(node.args[0])
                if isinstance(x, Sym) and x.depends_on_bank():
                    raise NotSymbolic("exp of a bank value")
            return None
        inplace = node.op == "call_method" and _name(t).endswith("_")
        if k in _WRITE_KINDS:
            return self._write(an, node, k, inplace)
        if inplace:
            return None
        return self._op(an, node, k)

    def _fused_add(self, an, node, k):
        """``addcmul(x, a, b, value=c)`` = ``x + c * a * b``; ``addmm`` / ``addmv`` /
        ``baddbmm(x, a, b, beta=s, alpha=c)`` = ``s * x + c * (a @ b)``."""
        a = node.args
        x, m1, m2 = (self._vals(an, y) for y in a[:3])
        c = _dim_arg(node, 3, "value", 1) if k == "addcmul" else node.kwargs.get("alpha", 1)
        s = 1 if k == "addcmul" else node.kwargs.get("beta", 1)
        if not all(isinstance(y, Sym) for y in (x, m1, m2)) or not all(
                isinstance(n, (int, float)) and not isinstance(n, bool) for n in (c, s)) or s == 0:
            raise NotSymbolic(f"{k} outside the algebra")
        sp = an.space
        prod = A.mul(sp, m1, m2) if k == "addcmul" else A.matmul(sp, m1, m2)
        return A.add(sp, A.scale(x, float(s)) if s != 1 else x, prod, float(c))

    def _vals(self, an, x):
        return an.value(x) if isinstance(x, fx.Node) else Sym.scalar(x)

    def _inplace_arith(self, an, node):
        """``rows += delta`` on a bank-dependent value that nothing reads afterwards (its
        last use, views included): the same value as ``rows + delta``."""
        x = node.args[0]
        xv = an.value(x)
        if not (isinstance(x, fx.Node) and isinstance(xv, Sym) and xv.depends_on_bank()):
            return None
        v = x.meta.get(self.META)
        if not isinstance(v, torch.Tensor) or v._is_view() or not an.last_use(x, node):
            raise NotSymbolic("an in-place update of a value read again later")
        y = self._vals(an, node.args[1])
        if not isinstance(y, Sym):
            raise NotSymbolic("operand outside the algebra")
        if self.out_shape(node) != tuple(xv.shape):
            raise NotSymbolic("an in-place update that broadcasts its target")
        op = _INPLACE_ARITH[node.target]
        if op == "mul":
            return A.mul(an.space, xv, y)
        return A.add(an.space, xv, y, 1.0 if op == "add" else -1.0)

    def _embedding(self, an, node):
        """``F.embedding(idx, M)`` with the defaults: rows ``M[idx]``."""
        bank = an.value(_dim_arg(node, 1, "weight"))
        if not isinstance(bank, BankVal):
            return None
        extra = list(node.args[2:]) + [v for k, v in node.kwargs.items() if k not in ("input", "weight")]
        if any(a not in (None, False, 2.0) for a in extra) or len(bank.shape) != 2:
            raise NotSymbolic("embedding with padding_idx, max_norm or sparse")
        return Sym.rows(an.space, bank, self.sym(an, _dim_arg(node, 0, "input")))

    def _write(self, an, node, k, inplace):
        a = node.args
        kw = node.kwargs
        bank = an.value(a[0])
        if not isinstance(bank, (BankVal, ZeroBuf)):
            return WriteOp(a[0], None, None, False, inplace)     # not a tracked bank: rejected there
        if k == "index_put":
            acc = bool(_dim_arg(node, 3, "accumulate", False))
            return WriteOp(a[0], bank_index(an, bank, tuple(a[1])), self._vals(an, _dim_arg(node, 2, "values")),
                           acc, inplace)
        nd = len(bank.shape)
        dim = _dim_arg(node, 1, "dim")
        if dim not in (nd - 2, -2):
            raise NotSymbolic(f"{k} along dim {dim}")
        src = _dim_arg(node, 3, "source" if k.startswith("index") else "src")
        if kw.get("alpha", 1) != 1 or (k == "index_add" and len(a) > 4 and a[4] != 1):
            raise NotSymbolic("index_add with alpha")
        if kw.get("reduce") is not None:
            raise NotSymbolic("scatter with reduce")
        idx_node = _dim_arg(node, 2, "index")
        idx = self.sym(an, idx_node)
        if k.startswith("scatter"):
            idx = drop_columns(idx)
        elif nd != 2:       # ``M.index_copy(1, idx, src)``: rows idx of every stream
            idx = bank_index(an, bank, (None,) * (nd - 2) + (idx_node,))
        return WriteOp(a[0], idx, self._vals(an, src), k in ("index_add", "scatter_add"), inplace)

    def _getitem(self, an, node):
        base, idx = node.args
        bv = an.value(base)
        if isinstance(bv, BankVal):
            return Sym.rows(an.space, bv, bank_index(an, bv, idx))
        if isinstance(bv, Sym) and _is_view_index(idx):
            return A.reshape(an.space, bv, self.out_shape(node))
        if isinstance(bv, Sym) and not bv.depends_on_bank():
            return self._select_then_view(an, node, base, idx)
        if isinstance(bv, Sym) and bv.depends_on_bank():
            if _selects_size1(idx, bv.shape):
                return A.reshape(an.space, bv, self.out_shape(node))   # ``rows[0]`` of [1, hd] rows
            raise NotSymbolic("basic indexing of a bank-dependent value")
        return None

    def _select_then_view(self, an, node, base, idx):
        """``x[:, t, :, None]`` as the atom ``x[:, t]`` viewed with a new dim, so that it is the
        same value as ``x[:, t]`` written elsewhere (value numbering sees through the view)."""
        if not isinstance(idx, tuple) or None not in idx or any(
                i is Ellipsis or isinstance(i, fx.Node) for i in idx):
            return None
        if not all(i is None or isinstance(i, int) or (isinstance(i, slice) and i == slice(None)) for i in idx):
            return None
        out = self.out_shape(node)
        keep, pos = [], 0
        for i in idx:
            if isinstance(i, int):
                continue
            if i is not None:
                keep.append(pos)
            pos += 1
        keep += list(range(pos, len(out)))
        stripped = tuple(i for i in idx if i is not None)
        key = getitem_key(base, stripped, an.atom_key)
        atom = an.virtual_atom(key, node, tuple(out[d] for d in keep))
        return A.reshape(an.space, atom, out)

    def _op(self, an, node, k):
        a = node.args
        sp = an.space
        if k in ("mul", "add", "sub"):
            x, y = self._vals(an, a[0]), self._vals(an, a[1] if len(a) > 1 else node.kwargs["other"])
            if not isinstance(x, Sym) or not isinstance(y, Sym):
                raise NotSymbolic("operand outside the algebra")
            if k == "mul":
                return A.mul(sp, x, y)
            alpha = node.kwargs.get("alpha", 1)
            return A.add(sp, x, y, alpha if k == "add" else -alpha)
        if k == "neg":
            return A.scale(self.sym(an, a[0]), -1.0)
        if k in ("addcmul", "addmm"):
            return self._fused_add(an, node, k)
        if k == "div":
            if isinstance(a[1], (int, float)) and a[1] != 0 and not node.kwargs.get("rounding_mode"):
                return A.scale(self.sym(an, a[0]), 1.0 / a[1])
            raise NotSymbolic("division by a tensor")
        x = an.value(a[0])
        if k == "same":
            if isinstance(x, (Sym, BankVal)) and not node.kwargs.get("memory_format"):
                return x
            raise NotSymbolic("clone of an opaque value")
        if k == "cast":
            # a float-to-float cast of a bank-dependent value: the same value in the algebra
            # (the op computes in its own precision); of an input, a tensor of its own
            if not (isinstance(x, Sym) and x.depends_on_bank()):
                return None
            dt, src = self.dtype(node), an.fe.dtype(a[0])
            if dt is None or src is None or not (dt.is_floating_point and src.is_floating_point):
                raise NotSymbolic("a cast of a bank value to a non-float dtype")
            if self.out_shape(node) != tuple(x.shape):
                raise NotSymbolic("a cast that changes the shape")
            return x
        if isinstance(x, BankVal):
            nd = len(x.shape)
            if k == "index_select":
                if _dim_arg(node, 1, "dim") not in (nd - 2, -2):
                    raise NotSymbolic("index_select along the columns")
                return Sym.rows(sp, x, bank_index(an, x, (None,) * (nd - 2) + (_dim_arg(node, 2, "index"),)))
            if k == "gather":
                if _dim_arg(node, 1, "dim") not in (nd - 2, -2):
                    raise NotSymbolic("gather along the columns")
                rows = Sym.rows(sp, x, drop_columns(self.sym(an, _dim_arg(node, 2, "index"))))
                return A.expand(sp, rows, self.out_shape(node))
            if k == "take_along_dim":   # gather with the index broadcast over the columns
                if _dim_arg(node, 2, "dim") not in (nd - 2, -2):
                    raise NotSymbolic("take_along_dim along the columns or flattened")
                rows = Sym.rows(sp, x, drop_columns(self.sym(an, _dim_arg(node, 1, "indices"))))
                return A.expand(sp, rows, self.out_shape(node))
            raise NotSymbolic(f"{k} of the whole bank")
        if k in ("index_select", "gather", "take_along_dim"):
            return None
        if k == "sum":
            x = self.sym(an, a[0])
            dims = _dim_arg(node, 1, "dim")
            if dims is None:
                dims = list(range(len(x.shape)))
            dims = [dims] if isinstance(dims, int) else list(dims)
            if node.kwargs.get("dtype") is not None:
                raise NotSymbolic("sum with a dtype")
            return A.reduce_sum(sp, x, dims, bool(_dim_arg(node, 2, "keepdim", False)))
        if k == "view":
            return _reshape(an, self.sym(an, a[0]), self.out_shape(node))
        if k == "expand":
            return A.expand(sp, self.sym(an, a[0]), self.out_shape(node))
        if k == "permute":
            order = a[1:] if len(a) > 2 or isinstance(a[1], int) else a[1]
            return A.permute(self.sym(an, a[0]), list(order))
        if k in ("transpose", "t"):
            x = self.sym(an, a[0])
            n = len(x.shape)
            if n < 2:
                return x
            d0, d1 = (a[1], a[2]) if k == "transpose" else (0, 1)
            order = list(range(n))
            order[d0 % n], order[d1 % n] = order[d1 % n], order[d0 % n]
            return A.permute(x, order)
        if k == "matmul":
            return A.matmul(sp, self.sym(an, a[0]), self.sym(an, a[1]))
        if k == "outer":
            return A.contract(sp, [(self.sym(an, a[0]), "i"), (self.sym(an, a[1]), "j")], "ij")
        if k == "einsum":
            eq = a[0]
            ops = a[1:]
            if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
                ops = ops[0]
            return _einsum(sp, eq, [self.sym(an, o) for o in ops])
        return None


def _reshape(an, x: Sym, shape):
    """Reshape in the algebra: size-1 dims, split dims (``rows.view(B, W, hd)``); a merge
    of a bank-dependent value is kept whole (``Merged``, writable at a flat index)."""
    try:
        return A.reshape(an.space, x, shape)
    except NotSymbolic:
        if not x.depends_on_bank():
            raise
    try:
        return A.split(an.space, x, shape, an.split_atom)
    except NotSymbolic:
        pass
    lead = [n for n in x.shape[:-1]]
    if len(shape) == 2 and shape[-1] == x.shape[-1] and math.prod(lead) == shape[0]:
        return Merged(x, tuple(shape))
    raise NotSymbolic(f"reshape {x.shape} -> {tuple(shape)} merges or splits dims")


def _bank_plus_scattered(an, node, k):
    """``M + upd`` (``M.add_(upd)``, ``upd + M``) for a bank state ``M`` and a zero buffer
    ``upd`` holding rows ``idx`` of values: the write ``M.index_add(idx, vals)``."""
    if k != "add" or len(node.args) < 2 or node.kwargs.get("alpha", 1) != 1:
        return None
    a, b = node.args[0], node.args[1]
    va, vb = an.value(a), an.value(b)
    bank = a if isinstance(va, BankVal) else b
    if isinstance(bank, fx.Node) and an.fe.dtype(node) != an.fe.dtype(bank):
        return None         # the sum promotes the bank to another dtype
    inplace = node.op == "call_method" and _name(node.target).endswith("_")
    if isinstance(va, BankVal) and isinstance(vb, Scattered) and tuple(vb.shape) == tuple(va.shape):
        return WriteOp(a, vb.idx, vb.vals, True, inplace)
    if isinstance(vb, BankVal) and isinstance(va, Scattered) and not inplace and tuple(va.shape) == tuple(vb.shape):
        return WriteOp(b, va.idx, va.vals, True, False)
    return None


def _einsum(sp, eq: str, syms):
    eq = eq.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(syms):
        raise NotSymbolic("einsum operand count")
    ell = ""
    if "..." in eq:
        ins, ell = _ellipsis(ins, syms, eq)
        out = out.replace("...", ell)
    if not arrow:
        letters = "".join(ins)
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
    return A.contract(sp, list(zip(syms, ins)), out)


def _ellipsis(ins, syms, eq):
    """Each operand's ``...`` spelled out in letters the equation does not use, aligned
    from the right as torch broadcasts them (the longest one is the output's)."""
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    counts = []
    for term, x in zip(ins, syms):
        if term.count("...") > 1:
            raise NotSymbolic("einsum with two ellipses in one operand")
        counts.append(len(x.shape) - len(term.replace("...", "")) if "..." in term else 0)
    n = max(counts)
    if min(counts) < 0 or n > len(spare):
        raise NotSymbolic("einsum ellipsis does not fit the operands")
    ell = "".join(spare[:n])
    return [t.replace("...", ell[n - k:]) for t, k in zip(ins, counts)], ell


def bank_index(an, bank, idx) -> Sym:
    """The row index of ``bank[idx]``: one tensor for a flat ``[S, hd]`` bank (``[W]``, or
    ``[B, W]`` for B streams), or ``(arange(B)[:, None], idx [B, W])`` for a
    ``[B, S, hd]`` bank indexed per batch, ``(arange(B)[:, None, None],
    arange(H)[None, :, None], idx [B, H, W])`` for a ``[B, H, S, hd]`` one. Returns the
    index as a Sym of the rows' leading shape."""
    if not isinstance(bank, (BankVal, ZeroBuf)):
        raise NotSymbolic("not a bank")
    idx = tuple(idx) if isinstance(idx, (tuple, list)) else (idx,)
    nb = len(bank.shape) - 2
    if nb >= 1 and len(idx) == nb + 1 and all(_all_streams(i) for i in idx[:-1]):
        return _shared_rows(an, bank, idx[-1])
    if not all(isinstance(i, fx.Node) and isinstance(an.value(i), Sym) for i in idx):
        raise NotSymbolic("bank indexed by something else than tensors of rows")
    syms = [an.value(i) for i in idx]
    if len(bank.shape) == 2 and len(idx) == 1:
        return syms[0]
    if nb >= 1 and len(idx) == nb + 1:
        *batches, aligned = syms
        for b in batches:       # rows, on the broadcast axes
            aligned = A.add(an.space, A.scale(b, 0.0), aligned)
        # [B.., W] rows, or [B..] (one row per stream: ``M[arange(B), idx[:, t]]``)
        if len(aligned.shape) not in (nb, nb + 1) or tuple(aligned.shape[:nb]) != tuple(bank.shape[:nb]):
            raise NotSymbolic("a batched bank indexed by other than [B, W] or [B] rows")
        for axis, (node, b) in enumerate(zip(idx, batches)):
            if not _is_arange(an, node, b, aligned, bank.shape[axis], axis):
                raise NotSymbolic("the batch index of a batched bank is not arange(B) along its own axis")
        if len(syms[-1].shape) == 1 and len(aligned.shape) == nb + 1:
            return _shared_rows(an, bank, idx[-1])     # ``M[arange(B)[:, None], idx]``, idx [W]
        if nb > 1 and tuple(A.index_atom(aligned)[0].shape) != tuple(aligned.shape):
            # the op's index tensor is this atom reshaped to [B*H, W]: no broadcast rows
            raise NotSymbolic("rows of a bank with several stream dims broadcast over a stream dim")
        return aligned
    raise NotSymbolic("bank indexed along several dims")


def _all_streams(i) -> bool:
    """A full slice (``M[:, idx]``; ``None`` in aten's index lists)."""
    return i is None or i == slice(None)


def _shared_rows(an, bank, node) -> Sym:
    """``M[:, idx]`` of a ``[B, (H,) S, hd]`` bank, ``idx`` one tensor of rows ``[W]``: the
    rows ``idx`` of every stream, an index ``[B, (H,) W]`` that does not vary along the
    streams (an atom of ``idx`` broadcast over them)."""
    rows = an.value(node) if isinstance(node, fx.Node) else None
    if not isinstance(rows, Sym):
        raise NotSymbolic("bank indexed by something else than tensors of rows")
    atom, live = A.index_atom(rows)
    if len(rows.shape) != 1 or len(live) != 1:
        raise NotSymbolic("rows shared by the streams of a batched bank are not one [W] tensor")
    lead = tuple(bank.shape[:-2])
    wide = an.expand_atom(atom, lead)
    labels = tuple(an.space.fresh(n) for n in lead) + (live[0],)
    return Sym(wide.shape, labels, [A.Term(1.0, (A.Factor("atom", wide, labels),))])


def _is_arange(an, node, batch: Sym, aligned: Sym, B: int, axis: int = 0) -> bool:
    """``batch`` is arange(B) along axis ``axis`` of ``aligned``."""
    if len(batch.terms) != 1 or len(batch.terms[0].factors) != 1 or batch.terms[0].coef != 1.0:
        return False
    f = batch.terms[0].factors[0]
    n = f.ref.node
    name = _name(n.target) if n.op in ("call_function", "call_method") else ""
    if "iota" in name:      # aten graphs: prims.iota(B, start=0, step=1)
        if n.args[:1] != (B,) or n.kwargs.get("start", 0) != 0 or n.kwargs.get("step", 1) != 1:
            return False
    elif "arange" not in name or [a for a in n.args if isinstance(a, int)] not in ([B], [0, B]):
        return False
    live = [lb for lb in f.labels if lb is not None]
    nb = len(aligned.shape)
    pad = (None,) * (nb - len(batch.axes)) + tuple(batch.axes)
    # (other axes may be broadcast: ``arange(B)[:, None].expand(B, W)`` is the same index)
    return len(live) == 1 and pad[axis] == live[0]


# ======================================================================== aten level

_ATEN = {
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.add.Tensor: "add", aten.add.Scalar: "add",
    aten.sub.Tensor: "sub", aten.sub.Scalar: "sub", aten.neg.default: "neg",
    aten.div.Scalar: "div", aten.div.Tensor: "div",
    aten.sum.dim_IntList: "sum", aten.sum.default: "sum",
    aten.view.default: "view", aten.reshape.default: "view", aten._unsafe_view.default: "view",
    aten.unsqueeze.default: "view", aten.squeeze.dim: "view", aten.squeeze.dims: "view",
    aten.squeeze.default: "view", aten.flatten.using_ints: "view",
    aten.expand.default: "expand", aten.permute.default: "permute", aten.transpose.int: "transpose",
    aten.t.default: "t", aten.clone.default: "same", aten.alias.default: "same",
    aten._to_copy.default: "cast", torch.ops.prims.convert_element_type.default: "cast",
    aten.mm.default: "matmul", aten.bmm.default: "matmul", aten.matmul.default: "matmul",
    aten.mv.default: "matmul", aten.dot.default: "matmul", aten.outer.default: "outer",
    aten.einsum.default: "einsum", aten.addcmul.default: "addcmul", aten.addmm.default: "addmm",
    aten.addmv.default: "addmm", aten.baddbmm.default: "addmm",
    aten.index_select.default: "index_select", aten.gather.default: "gather",
    aten.index_put.default: "index_put", aten.index_put_.default: "index_put",
    aten._unsafe_index_put.default: "index_put",
    aten.index_copy.default: "index_copy", aten.index_copy_.default: "index_copy",
    aten.index_add.default: "index_add", aten.index_add_.default: "index_add",
    aten.scatter.src: "scatter", aten.scatter_.src: "scatter",
    aten.scatter_add.default: "scatter_add", aten.scatter_add_.default: "scatter_add",
}


class AtenOps(TorchOps):
    """Aten-level graphs (post-grad, exported programs: functional, ``meta['val']``)."""
    META = "val"

    def kind(self, node):
        return _ATEN.get(node.target)

    def exp_arg(self, node):
        if node.target is aten.exp.default:
            return node.args[0], "exp"
        if node.target is aten.sigmoid.default:
            return node.args[0], "sigmoid"
        return None

    def write_targets(self, graph) -> set:
        return self.with_zero_sources(
            {n.args[0] for n in graph.nodes if n.op == "call_function" and self.kind(n) in _WRITE_KINDS})

    def inplace_target(self, node):
        if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
            for i, a in enumerate(node.target._schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write and i < len(node.args):
                    return node.args[i]
        return None

    def returns_self(self, node) -> bool:
        return True

    def evaluate(self, an, node):
        t = node.target
        k = self.kind(node)
        if t in (aten.index.Tensor, aten._unsafe_index.Tensor):
            base = an.value(node.args[0])
            idx = node.args[1]
            if isinstance(base, BankVal):
                return Sym.rows(an.space, base, bank_index(an, base, tuple(idx)))
            if isinstance(base, Sym) and base.depends_on_bank():
                raise NotSymbolic("indexing a bank-dependent value")
            return None
        if t is aten.select.int:
            x = an.value(node.args[0])
            if isinstance(x, Sym) and x.depends_on_bank():
                dim = node.args[1] % max(len(x.shape), 1)
                if len(x.shape) and x.shape[dim] == 1 and node.args[2] in (0, -1):
                    return A.reshape(an.space, x, self.out_shape(node))   # a size-1 dim dropped
                raise NotSymbolic("select of a bank-dependent value")
            return None
        if t is aten.exp.default:
            x = an.value(node.args[0])
            if isinstance(x, Sym) and x.depends_on_bank():
                raise NotSymbolic("exp of a bank value")
            return None
        if k is None:
            return None
        inplace = _name(t).split(".")[-2].endswith("_") if "." in _name(t) else False
        inplace = isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable
        added = _bank_plus_scattered(an, node, k)
        if added is not None:
            return added
        if k in _WRITE_KINDS:
            if not isinstance(an.value(node.args[0]), (BankVal, ZeroBuf)):
                return WriteOp(node.args[0], None, None, False, inplace)
            if k == "index_put":
                acc = bool(_dim_arg(node, 3, "accumulate", False))
                return WriteOp(node.args[0], bank_index(an, an.value(node.args[0]), tuple(node.args[1])),
                               self._vals(an, node.args[2]), acc, inplace)
            return self._write(an, node, k, inplace)
        if k == "div":
            y = node.args[1]
            if isinstance(y, (int, float)) and y != 0 and not node.kwargs.get("rounding_mode"):
                return A.scale(self.sym(an, node.args[0]), 1.0 / y)
            raise NotSymbolic("division by a tensor")
        if k in ("mul", "add", "sub") and len(node.args) > 2:
            raise NotSymbolic("alpha")
        return self._op(an, node, k)
