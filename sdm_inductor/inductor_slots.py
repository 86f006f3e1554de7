"""Adding our passes to Inductor's custom-pass slots beside anyone else's.

A slot (``pre_grad_custom_pass``, ``post_grad_custom_pre_pass``, ...) holds a list of
passes on Inductors that take lists, one callable on older ones; there our pass is
composed after the one already set. Removing takes out only ours.
"""
from __future__ import annotations

import torch._inductor.config as inductor_config
from torch._inductor import custom_graph_pass as cgp
from torch._inductor.custom_graph_pass import CustomGraphPass

__all__ = ["add", "remove", "has"]

_LISTS = hasattr(cgp, "get_custom_graph_passes")   # Inductor takes lists of passes


class _Composed(CustomGraphPass):
    """Another pass followed by ours, for Inductors that take one callable per slot."""

    def __init__(self, first, ours):
        self.first, self.ours = first, ours

    def __call__(self, graph):
        self.first(graph)
        self.ours(graph)

    def uuid(self):
        u = self.first.uuid() if isinstance(self.first, CustomGraphPass) else None
        return None if u is None else (u, self.ours.uuid())


def _current(slot):
    cur = getattr(inductor_config, slot)
    if cur is None:
        return []
    return list(cur) if isinstance(cur, (list, tuple)) else [cur]


def has(slot, ours) -> bool:
    return any(p == ours or (isinstance(p, _Composed) and p.ours == ours) for p in _current(slot))


def add(slot, ours) -> None:
    """Put ``ours`` in ``slot``, after the passes already there (once)."""
    if has(slot, ours):
        return
    others = _current(slot)
    if not others:
        setattr(inductor_config, slot, ours)
    elif _LISTS:
        setattr(inductor_config, slot, others + [ours])
    else:
        setattr(inductor_config, slot, _Composed(others[0], ours))


def remove(slot, ours) -> None:
    """Take ``ours`` out of ``slot``, leaving the others as they were."""
    rest = []
    for p in _current(slot):
        if isinstance(p, _Composed) and p.ours == ours:
            rest.append(p.first)
        elif p != ours:
            rest.append(p)
    setattr(inductor_config, slot, None if not rest else (rest[0] if len(rest) == 1 else rest))
