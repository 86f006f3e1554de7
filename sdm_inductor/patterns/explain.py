"""``sdm_inductor.explain(fn, *args, **kwargs)``: which token loops would be rewritten, and why not."""
from __future__ import annotations

import torch

from .report import Report
from .torch_frontend import rewrite_dynamo_graph

__all__ = ["explain"]


def explain(fn, *args, **kwargs) -> Report:
    """Trace ``fn(*args, **kwargs)`` with Dynamo, run the torch-level recognizer on every
    graph, execute the rewritten graphs eagerly, and return the ``Report``:
    ``.rewritten`` (each chain: tokens, form, where), ``.rejected`` (each candidate left
    alone, with the reason), ``str(report)`` for reading. Like ``torch._dynamo.explain``
    it resets Dynamo's caches before and after (functions compiled earlier recompile on
    their next call)."""
    report = Report()

    def backend(gm, example_inputs):
        report.extend(rewrite_dynamo_graph(gm.graph))
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=backend)(*args, **kwargs)
    finally:
        torch._dynamo.reset()
    return report
