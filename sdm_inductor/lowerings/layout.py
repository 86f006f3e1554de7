"""The layout helpers (``sdm::split_heads``, ``sdm::merge_heads``, ``sdm::expand_bank``)
as plain view/copy graph ops under compile.

Eagerly each helper is an opaque op that makes a copy. Decomposed (see ``_rules``), the
copy becomes an Inductor pointwise node that fuses with its neighbours: the head split
of a projection with the gate math that follows it, the head merge with the output
gate, the expansion of a learned bank with the copy the SDM op makes of it. Autograd
still runs the helpers' own backward formulas (the rule sits below autograd), and
those are decomposed the same way.
"""
from __future__ import annotations

import torch

from . import _rules


def _fresh(x: torch.Tensor) -> torch.Tensor:
    # A functional op's output must not alias its input, even where a reshape could
    # (one head, one token): always a new buffer, which Inductor turns into a fused copy.
    return torch.clone(x, memory_format=torch.contiguous_format)


def _split_heads_rule(mode, op, types, args, kwargs):
    x, num_heads = _rules.bound_args(op, args, kwargs)
    with mode:
        B, T, HK = x.shape
        K = HK // num_heads
        return _fresh(x.view(B, T, num_heads, K).permute(0, 2, 1, 3)).view(B * num_heads, T, K)


def _merge_heads_rule(mode, op, types, args, kwargs):
    x, num_heads = _rules.bound_args(op, args, kwargs)
    with mode:
        BH, T, K = x.shape
        B = BH // num_heads
        return _fresh(x.view(B, num_heads, T, K).permute(0, 2, 1, 3)).view(B, T, num_heads * K)


def _expand_bank_rule(mode, op, types, args, kwargs):
    bank, batch = _rules.bound_args(op, args, kwargs)
    with mode:
        S, hd = bank.shape
        return _fresh(bank.unsqueeze(0).expand(batch, S, hd)).view(batch * S, hd)


_rules.register("sdm::split_heads", _split_heads_rule)
_rules.register("sdm::merge_heads", _merge_heads_rule)
_rules.register("sdm::expand_bank", _expand_bank_rule)
