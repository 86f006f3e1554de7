"""Torch-level front-end: Dynamo's graph, before AOTAutograd (Inductor's pre-grad pass).

Rewriting here is where compile time is won: AOTAutograd and Inductor then trace and
lower one op instead of T copies of the token step.
"""
from __future__ import annotations

import torch.fx as fx

from .driver import rewrite_graph
from .optable import TorchOps
from .report import RejectedChain, Report
from .safety import guarded
from .scan import rewrite_scans

__all__ = ["rewrite_dynamo_graph"]


def _rewrite(graph: fx.Graph) -> Report:
    report = rewrite_scans(graph, TorchOps(), "torch")
    report.extend(rewrite_graph(graph, TorchOps(), "torch"))
    return report


def rewrite_dynamo_graph(graph: fx.Graph) -> Report:
    """Rewrite ``graph`` in place; on any error it is put back as it was (the reason is
    in the report and the log), so a compile never fails because of the rewrites."""
    report, err = guarded(graph, "the torch-level rewrite pass", _rewrite, graph)
    if err is not None:
        report = Report(rejected=[RejectedChain("graph", 0, f"rewrite pass error, graph left as "
                                                             f"written: {err!r}")])
    report.graphs = 1
    return report
