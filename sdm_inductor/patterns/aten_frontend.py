"""Aten-level front-end: post-grad graphs and exported programs (functional aten IR).

The same recognizer as the torch-level front-end with the aten op table; new nodes get
``meta['val']`` by fake-tensor propagation, as Inductor and ExportedProgram expect.
"""
from __future__ import annotations

import copy

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode

from .driver import rewrite_graph
from .optable import AtenOps
from .rewrite import remove_dead_code
from .report import RejectedChain, Report
from .safety import guarded
from .scan import rewrite_scans

__all__ = ["rewrite_aten_graph", "rewrite_exported"]


def _fill_meta(graph: fx.Graph) -> None:
    """``meta['val']`` for nodes that lack it, computed on the fake values of their inputs."""
    vals = [n.meta["val"] for n in graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    mode = detect_fake_mode(vals)
    if mode is None:
        return

    def val(x):
        return x.meta.get("val") if isinstance(x, fx.Node) else x

    with mode:
        for n in graph.nodes:
            if n.op != "call_function" or "val" in n.meta:
                continue
            args = fx.node.map_aggregate(n.args, val)
            kwargs = fx.node.map_aggregate(n.kwargs, val)
            n.meta["val"] = n.target(*args, **kwargs)


def _rewrite(graph: fx.Graph) -> Report:
    report = rewrite_scans(graph, AtenOps(), "aten")
    report.extend(rewrite_graph(graph, AtenOps(), "aten"))
    if report.rewritten:
        _fill_meta(graph)
    return report


def rewrite_aten_graph(graph: fx.Graph) -> Report:
    """Rewrite ``graph`` in place; on any error it is put back as it was."""
    report, err = guarded(graph, "the aten-level rewrite pass", _rewrite, graph)
    if err is not None:
        report = Report(rejected=[RejectedChain("graph", 0, f"rewrite pass error, graph left as "
                                                             f"written: {err!r}")])
    report.graphs = 1
    return report


def rewrite_exported(ep: "torch.export.ExportedProgram", report: Report | None = None):
    """An ExportedProgram with each recognised token loop replaced by ``sdm.write_read``.

    ``ep`` is left unchanged. Pass a ``Report`` to learn what was rewritten and why
    candidates were left alone."""
    if not isinstance(ep, torch.export.ExportedProgram):
        raise TypeError(f"sdm: argument 'ep' of rewrite_exported: expected a "
                        f"torch.export.ExportedProgram, got {type(ep).__name__}")
    gm = copy.deepcopy(ep.graph_module)
    rep = rewrite_aten_graph(gm.graph)
    if report is not None:
        report.extend(rep)
    if not rep.rewritten:
        return ep
    remove_dead_code(gm.graph)
    gm.recompile()
    return ep._update(gm, _signature_for(gm, ep.graph_signature))


def _signature_for(gm, sig):
    """The signature with output names following the rewritten output node."""
    from torch.export.graph_signature import TensorArgument
    sig = copy.deepcopy(sig)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    for spec, arg in zip(sig.output_specs, out.args[0]):
        if isinstance(spec.arg, TensorArgument) and isinstance(arg, fx.Node):
            spec.arg = TensorArgument(name=arg.name)
    return sig
