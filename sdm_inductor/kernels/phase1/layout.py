"""What Phase 1 hands to the walks: the ``Plan`` of a call, its write ``Runs`` and the
backward's dB ``Groups``."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class Plan:
    """Phase 1 of a whole call: per-entry ``[B, C, E]`` and per-segment ``[B, C, C]``."""
    P: int
    T: int
    C: int
    NC: int
    W: int
    R: int
    slot: Tensor    # int32, -1: touches nothing (padding, out of range, repeated write)
    val: Tensor     # fp32 dense-key weight (writes) / read weight (reads)
    gate: Tensor    # fp32 log-decay of an active write entry, else 0
    first: Tensor   # [P, Tp, W] int32, first occurrence of the entry's slot in its token
    perm: Tensor    # [B, C*E] int32, entries sorted by (slot, write-before-read, token)
    gs: Tensor      # int32, start of the entry's group in perm
    nw: Tensor      # int32, number of write members of the group
    na: Tensor      # int32, number of members of the group
    gam: Tensor     # fp32 cumulative log-decay of the slot at the entry's token (causal)
    gend: Tensor    # fp32 same at the end of the chunk
    ev: Tensor      # fp32 val * exp(gam): weight of the chunk-start row in r0 / inter
    coef: Tensor    # fp32 k * exp(gend - gam): weight of delta in the chunk-end row
    decay: Tensor   # fp32 exp(gend): decay of the slot over the whole chunk
    beta: Tensor    # [B, C] fp32, 0 on padded tokens
    A: Tensor       # [B, C, C]
    QK: Tensor      # [B, C, C]
    X: Tensor       # [B, C, C] (I + tril(beta A, -1))^-1
    QKX: "Tensor | None"  # [B, C, C] QK @ X (the forward's; None in a plan handed over)
    runs: "Runs | None" = None  # the write pass of the forward, in sorted order

    @property
    def E(self) -> int:
        return self.W + self.R

    @property
    def B(self) -> int:
        return self.P * self.NC

    def backward_tensors(self) -> list[Tensor]:
        """What the backward reads of this plan (all but ``QKX``), for ``from_tensors``: how
        a traced forward hands its plan to the traced backward, as graph values."""
        return ([getattr(self, f) for f in _BACKWARD_FIELDS]
                + [getattr(self.runs, f) for f in _RUNS_FIELDS])

    @staticmethod
    def n_backward_tensors() -> int:
        return len(_BACKWARD_FIELDS) + len(_RUNS_FIELDS)

    @staticmethod
    def from_tensors(P: int, T: int, C: int, W: int, R: int, tensors) -> "Plan":
        """The plan ``backward_tensors`` listed, for a call of ``P`` streams of ``T`` tokens
        in chunks of ``C`` with ``W`` / ``R`` slots per token."""
        n = len(_BACKWARD_FIELDS)
        if len(tensors) != Plan.n_backward_tensors():
            raise ValueError(f"sdm: a handed-over plan has {Plan.n_backward_tensors()} "
                             f"tensors, got {len(tensors)}")
        fields = dict(zip(_BACKWARD_FIELDS, tensors[:n]))
        pl = Plan(P, T, C, -(-T // C), W, R, QKX=None, **fields)
        pl.runs = Runs(*tensors[n:])
        return pl


# the Plan fields the backward reads, and those of its Runs (``Plan.backward_tensors``)
_BACKWARD_FIELDS = ("slot", "val", "gate", "first", "perm", "gs", "nw", "na", "gam", "gend",
                    "ev", "coef", "decay", "beta", "A", "QK", "X")
_RUNS_FIELDS = ("slot", "length", "decay", "tok", "coef")


@dataclass
class Runs:
    """Per segment, the ``C*W`` write entries sorted by slot (``[B, C*W]``): one *run* per
    distinct written slot, its members contiguous and in token order. Only a run's first
    position carries the slot (others -1) and the run length, so a kernel lane that owns
    a run reads its members with contiguous loads and no indirection."""
    slot: Tensor    # int32 slot at a run start, else -1
    length: Tensor  # int32 run length at a run start, else 0
    decay: Tensor   # fp32 exp(gend) of the slot
    tok: Tensor     # int32 token of the entry at this position
    coef: Tensor    # fp32 coef of the entry at this position


    # a run's start position is also its row of the segment's undo log (``quant.UndoLog``)


@dataclass
class Groups:
    """The same for all ``C*E`` entries (``[B, C*E]``, ``perm`` order): one group per
    distinct touched slot, write members first; used by the backward's ``dB`` pass.
    The headers (``slot``, ``length``, ``n_w``, ``decay``, ``pos``, ``tok0``, ``ev0``) are
    indexed by group, split: the segment's groups of several members packed to the front
    of its row and those of one member packed from its end, both in position order (from
    the end: the last column holds the first of them), the empty header -1 / 0 / 0 / 1 /
    -1 / 0 / 0 between. ``tok`` and ``ev`` are by position: group ``i``'s members sit at
    positions ``pos[i]`` to ``pos[i] + length[i] - 1``."""
    slot: Tensor    # int32 slot of the group, else -1
    length: Tensor  # int32 members (na) of the group, else 0
    n_w: Tensor     # int32 write members of the group
    decay: Tensor   # fp32 exp(gend) if the slot is written in the chunk, else 1
    tok: Tensor     # int32 token of the entry at this position
    ev: Tensor      # fp32 ev of the entry at this position
    pos: Tensor     # int32 position of the group's first member, else -1
    tok0: Tensor    # int32 token of the group's first member (a header: tok[pos]), else 0
    ev0: Tensor     # fp32 ev of the group's first member (ev[pos]), else 0
