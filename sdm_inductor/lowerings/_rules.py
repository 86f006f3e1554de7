"""Shared plumbing for the rules that rewrite sdm ops while AOTAutograd functionalizes.

``torch.library.triton_op`` decomposes itself by registering a torch_dispatch rule for
``FunctionalTensorMode`` (``torch/_library/triton.py``): that mode is active exactly when
AOTDispatcher traces a graph for a backend (torch.compile, AOTInductor), below autograd,
so the rule sees the forward op and, separately, the backward op that autograd emits.
The sdm rules use the same hook; this module holds what they have in common.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch._library.utils import fill_defaults
from torch._subclasses.functional_tensor import FunctionalTensorMode

from ..validation import static_int

Rule = Callable  # (mode, op, types, args, kwargs) -> outputs


def keep_opaque() -> bool:
    """True while torch.export traces: like triton_op, keep the op itself in the
    exported program (high level, serializable); AOTInductor rewrites it later."""
    return not torch._functorch.config.decompose_custom_triton_ops


def bound_args(op: torch._ops.OpOverload, args, kwargs) -> list:
    """All schema arguments in order, defaults filled (dispatch trims trailing defaults);
    the ``chunk_size`` and ``slots_per_stream`` options specialized when symbolic
    (``validation.static_int``: they shape the kernels)."""
    new_args, new_kwargs = fill_defaults(op._schema, args, kwargs)
    names = [a.name for a in op._schema.arguments]
    values = list(new_args) + list(new_kwargs.values())
    return [static_int(v) if n in ("chunk_size", "slots_per_stream") else v
            for n, v in zip(names, values)]


def register(qualname: str, rule: Rule) -> None:
    """Rewrite ``qualname`` with ``rule`` whenever AOTDispatcher functionalizes it."""

    def guarded(mode, op, types, args, kwargs):
        if keep_opaque():
            return mode.__torch_dispatch__(op, types, args, kwargs)
        return rule(mode, op, types, args, kwargs)

    torch.library.register_torch_dispatch(qualname, FunctionalTensorMode, guarded)
