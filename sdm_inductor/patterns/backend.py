"""``torch.compile(model, backend="sdm")``: the rewrites, then Inductor.

Registered through the ``torch_dynamo_backends`` entry point (pyproject). Useful where
the rewrites are switched off globally but wanted for one model.
"""
from __future__ import annotations

from .passes import _record, rewrites
from .torch_frontend import rewrite_dynamo_graph

__all__ = ["sdm_backend"]


def sdm_backend(gm, example_inputs, **kwargs):
    from torch._inductor.compile_fx import compile_fx
    _record(rewrite_dynamo_graph(gm.graph))
    # the loops are gone; Inductor needs not look again, whatever the global switch says
    with rewrites(False):
        return compile_fx(gm, example_inputs, **kwargs)
