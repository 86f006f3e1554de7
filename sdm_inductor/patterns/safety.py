"""A pass never makes a compile or a run fail: replacements are checked on fake tensors
before they are committed, and a graph an exception met half-edited is put back.

``Checked`` gives the nodes an ``Emitter`` creates their metadata (the value the node
computes, on the fake tensors of the graph's own metadata) as they are created, so the
op call of a replacement meets its own argument rules (``validation.check_call``, run
by the op's fake impl) while compiling; a refusal becomes a ``Reject``, and ``undo``
removes what was built. ``Snapshot`` is the last line: a copy of the whole graph taken
before a rewrite, copied back over the graph if anything raised while it was edited.
"""
from __future__ import annotations

import logging

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from .canonical import Reject

__all__ = ["Checked", "Snapshot", "meta_value"]

log = logging.getLogger(__name__)

_KEYS = ("val", "example_value")


def meta_value(n):
    if not isinstance(n, fx.Node):
        return None
    for k in _KEYS:
        if k in n.meta:
            return n.meta[k]
    return None


class Checked:
    """Fake-tensor values for new nodes of ``graph``, computed as they are made."""

    def __init__(self, graph: fx.Graph, key: str):
        self.key = key
        # the mode of the graph's own values (not the ambient tracing context's: a
        # backend may run under another one)
        modes = [v.fake_mode for v in (meta_value(n) for n in graph.nodes) if isinstance(v, FakeTensor)]
        self.mode = modes[0] if modes else None
        self.created: list = []
        self.order: list = list(graph.nodes)

    def _val(self, x):
        if not isinstance(x, fx.Node):
            return x
        v = meta_value(x)
        if v is None and x.op == "call_function" and self.mode is not None:
            # a node made by an earlier step of the rewrite (hoisted inputs): its value too
            args = fx.node.map_aggregate(x.args, self._val)
            kwargs = fx.node.map_aggregate(x.kwargs, self._val)
            try:
                with self.mode:
                    v = x.target(*args, **kwargs)
            except Exception as e:      # noqa: BLE001
                raise Reject(f"no metadata on {x.name} to check the replacement against: {_short(e)}") from e
            x.meta[self.key] = v
        if v is None:
            raise Reject(f"no metadata on {x.name} to check the replacement against")
        return v

    def record(self, node: fx.Node):
        """Compute ``node``'s value from its inputs' metadata; a refusal of the op is a Reject."""
        self.created.append(node)
        if self.mode is None:
            raise Reject("the graph carries no fake-tensor metadata to check the replacement against")
        args = fx.node.map_aggregate(node.args, self._val)
        kwargs = fx.node.map_aggregate(node.kwargs, self._val)
        t = node.target
        if t in (torch.Tensor.copy_, torch.ops.aten.copy_.default):
            node.meta[self.key] = args[0]      # the fake of a graph input is not mutated
            return
        try:
            with self.mode:
                node.meta[self.key] = t(*args, **kwargs)
        except Reject:
            raise
        except Exception as e:      # noqa: BLE001 - the op's own rules refused the call
            raise Reject(f"the replacement would be refused: {_short(e)}") from e

    def undo(self, graph: fx.Graph) -> None:
        """Erase the nodes made and put moved nodes back in their order."""
        for n in reversed(self.created):
            if not n._erased:
                graph.erase_node(n)
        self.created = []
        alive = [n for n in self.order if not n._erased]
        for prev, n in zip(alive, alive[1:]):
            if n.prev is not prev:
                prev.append(n)


def _short(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    return (msg[0] if msg else type(e).__name__)[:300]


class Snapshot:
    """A copy of ``graph`` that ``restore`` copies back over it (node for node, names kept
    where the graph's namespace lets them be reused)."""

    def __init__(self, graph: fx.Graph):
        self.graph = graph
        self.copy = fx.Graph()
        env: dict = {}
        for n in graph.nodes:
            env[n] = self.copy.node_copy(n, lambda x: env[x])

    def restore(self) -> None:
        g = self.graph
        nodes = list(g.nodes)
        for n in nodes:     # drop every edge first: a half-edited graph may be out of order
            n._update_args_kwargs(fx.node.map_arg(n.args, lambda _: None),
                                  fx.node.map_arg(n.kwargs, lambda _: None))
        for n in reversed(nodes):
            g.erase_node(n)
        # the graph holds no node now: its names are free again (the copies keep theirs)
        ns = getattr(g, "_graph_namespace", None)
        for attr in ("_used_names", "_base_count", "_obj_to_name"):
            table = getattr(ns, attr, None)
            if hasattr(table, "clear"):
                table.clear()
        env: dict = {}
        with g.inserting_after(None):     # at the end, in order
            for n in self.copy.nodes:
                env[n] = g.node_copy(n, lambda x: env[x])


def guarded(graph: fx.Graph, what: str, fn, *args):
    """``fn(*args)`` with ``graph`` put back as it was if it raises; returns (result, error)."""
    snap = Snapshot(graph)
    try:
        return fn(*args), None
    except Exception as e:      # noqa: BLE001 - a pass never fails a compile
        try:
            snap.restore()
        except Exception as e2:     # noqa: BLE001
            log.warning("sdm rewrites: could not restore the graph after %s: %r", what, e2)
            raise e from e2
        log.warning("sdm rewrites: %s failed, graph left as written: %r", what, e)
        return None, e
