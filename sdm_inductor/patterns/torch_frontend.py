"""Torch-level front-end: Dynamo's graph, before AOTAutograd (Inductor's pre-grad pass).

Rewriting here is where compile time is won: AOTAutograd and Inductor then trace and
lower one op instead of T copies of the token step.
"""
from __future__ import annotations

import torch.fx as fx

from .driver import rewrite_graph
from .optable import TorchOps
from .report import Report
from .scan import rewrite_scans

__all__ = ["rewrite_dynamo_graph"]


def rewrite_dynamo_graph(graph: fx.Graph) -> Report:
    report = rewrite_scans(graph, TorchOps(), "torch")
    report.extend(rewrite_graph(graph, TorchOps(), "torch"))
    report.graphs = 1
    return report
