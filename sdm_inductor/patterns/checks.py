"""Runtime check inserted where distinct write slots are not proven from the graph."""
from __future__ import annotations

import torch
from torch import Tensor

from ..ops import count_repeated_write_slots

__all__ = ["RepeatedWriteSlotError"]


class RepeatedWriteSlotError(RuntimeError):
    """A rewritten token loop met a token that writes one bank slot twice."""


@torch.library.custom_op("sdm::check_distinct_write_slots", mutates_args=())
def check_distinct_write_slots(k_idx: Tensor, where: str) -> Tensor:
    """Pass ``k_idx`` through; raise if a token repeats a write slot.

    The loop gives a repeated slot another meaning than the fused op (the last write
    wins there, the weights add up here), so the rewritten program refuses it."""
    n = int(count_repeated_write_slots(k_idx))
    if n:
        raise RepeatedWriteSlotError(
            f"sdm: {where} was rewritten into torch.ops.sdm.write_read, but {n} write slot(s) "
            "repeat within a token, where the loop and the op differ. Make the slots of a token "
            "distinct (e.g. indices from topk), or compile with sdm_inductor.disable_rewrites() "
            "to keep the loop.")
    return k_idx.clone()


@check_distinct_write_slots.register_fake
def _(k_idx, where):
    return torch.empty_like(k_idx)
