"""A post-grad pass that puts back the copy of a bank that is a view at a storage offset
(``bank[1].clone()``, ``banks.unbind(0)[2]`` handed to the functional op, a row slice)
before the in-place op writes it.

Under compile ``sdm::write_read_`` is functionalized as ``auto_functionalized_v2``, whose
node records its inputs as the eager call saw them (``eager_input_vals``); the functional
``write_read`` that saves nothing for a backward reaches it as ``clone(bank)`` +
``write_read_`` (see ``write_read``).
Inductor's ``remove_noop_ops`` drops a clone whose size and strides equal its source's
without comparing storage offsets (pytorch/pytorch#197489; torch 2.13 does), so the op's
base becomes the view while the recorded input stays the clone (offset 0). Where the view
may not be written in place (a graph input, a tensor used again later), Inductor copies
it from the recorded layout, an ``as_strided`` from offset 0 of the view's storage: the
rows of another bank, or memory past a realized view's end. The op then computes on
them, without an error.

Where the kernels are emitted (``EMIT_KERNELS``, AOTInductor), the triton_ops' bodies
clone the bank (``final``) and hand the clone to their kernels as
``triton_kernel_wrapper_functional`` nodes, which record their inputs the same way: the
same drop makes the kernels start from other rows.

This pass runs after ``remove_noop_ops`` and before that copy is planned: where an input
of an sdm op's node, or of an sdm kernel's, has the recorded size and strides but another
storage offset, it puts the dropped clone back. The input is then a fresh buffer that
Inductor writes in place, and the clone itself is an ordinary copy kernel that reads the
view as it is.
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

from .. import inductor_slots
from .cache_key import lowering_state

__all__ = ["RestoreViewClones", "restore_view_clones"]

_HOPS = (torch.ops.higher_order.auto_functionalized, torch.ops.higher_order.auto_functionalized_v2)
_KERNEL_HOP = torch.ops.higher_order.triton_kernel_wrapper_functional


def _same(a, b) -> bool:
    # symbolic sizes: equal only where provably so (no guards after AOTAutograd)
    return statically_known_true(sym_eq(a, b))


def _clone_dropped(arg, recorded) -> bool:
    """``arg`` is a view that stands where the recorded call had a clone of it."""
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return (isinstance(val, torch.Tensor) and isinstance(recorded, torch.Tensor)
            and _same(val.shape, recorded.shape) and _same(val.stride(), recorded.stride())
            and not _same(val.storage_offset(), recorded.storage_offset()))


def _restored(graph, node, arg, recorded):
    if isinstance(arg, (list, tuple)) and isinstance(recorded, (list, tuple)) and len(arg) == len(recorded):
        return type(arg)(_restored(graph, node, a, r) for a, r in zip(arg, recorded))
    if not _clone_dropped(arg, recorded):
        return arg
    with graph.inserting_before(node):
        clone = graph.call_function(torch.ops.aten.clone.default, (arg,))
    clone.meta.update(arg.meta)
    clone.meta["val"] = recorded
    return clone


def restore_view_clones(graph: fx.Graph) -> None:
    for hop in _HOPS:
        for node in graph.find_nodes(op="call_function", target=hop):
            recorded = node.meta.get("eager_input_vals")
            op = node.args[0] if node.args else None
            if recorded is None or not (isinstance(op, torch._ops.OpOverload) and op.namespace == "sdm"):
                continue
            for name, rec in recorded[1].items():
                arg = node.kwargs.get(name)
                new = _restored(graph, node, arg, rec)
                if new is not arg:
                    node.update_kwarg(name, new)
    for node in graph.find_nodes(op="call_function", target=_KERNEL_HOP):
        recorded = node.meta.get("eager_input_vals")
        if recorded is None or not _sdm_kernel(node.kwargs["kernel_idx"]):
            continue
        tensors = dict(node.kwargs["kwargs"])
        for name, rec in recorded[1].get("kwargs", {}).items():
            if name in tensors:
                tensors[name] = _restored(graph, node, tensors[name], rec)
        if any(tensors[k] is not v for k, v in node.kwargs["kwargs"].items()):
            node.update_kwarg("kwargs", tensors)


def _sdm_kernel(kernel_idx: int) -> bool:
    """Whether the kernel of a ``triton_kernel_wrapper_functional`` is one of this
    package's (other kernels' graphs are left as the user's program made them)."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    fn = kernel_side_table.get_kernel(kernel_idx)
    while hasattr(fn, "fn"):   # autotuner -> JITFunction -> the Python function
        fn = fn.fn
    return getattr(fn, "__module__", "").startswith(__package__.split(".")[0] + ".")


class RestoreViewClones(CustomGraphPass):
    def __call__(self, graph: fx.Graph) -> None:
        restore_view_clones(graph)

    def uuid(self):
        # installed whether the rewrites are on or off: the caches key on the package's
        # sources and EMIT_KERNELS through this pass
        return lowering_state()

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))


inductor_slots.add("post_grad_custom_post_pass", RestoreViewClones())
