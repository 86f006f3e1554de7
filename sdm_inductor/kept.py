"""What an eager forward keeps for its own backward, beside the op's saved outputs.

An implementation's forward may offer intermediates (CUDA: Phase 1's plan and ``v - r0``)
that its backward would otherwise recompute (``keep_for_backward``). The op's autograd
context takes the offer of the call that returned it (``take``); the backward reads it
while it runs (``kept_for_backward``). A compiled graph calls the forward and backward
ops with no autograd context between them; there the offer is found by the identity of
the forward's undo log (``register_by_log`` / ``kept_by_log``). Everything here is an
optimisation only: a backward that finds nothing recomputes the same values.

Thread-local: a forward's offer is only ever taken by a context on the same thread.
"""
from __future__ import annotations

import contextlib
import threading
import weakref

from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["keep_for_backward", "kept_for_backward"]


class _Kept(threading.local):
    offered: tuple | None = None   # (weakref to the readings, object) of the last forward
    current: object = None         # what the running backward may use


_KEPT = _Kept()


def keep_for_backward(readings: Tensor, obj) -> None:
    """Offer ``obj`` (what the backward of this forward would otherwise recompute) to the
    autograd context of the eager call that returns ``readings``; a later offer replaces
    an untaken one, so at most one is ever held here. An untaken offer goes with its
    readings: a compiled graph's forward has no context to take it and frees its readings
    early, and what it kept then lives only as long as the undo log that keys it
    (``register_by_log``), not until the next call."""
    ref = weakref.ref(readings)
    _KEPT.offered = (ref, obj)
    weakref.finalize(readings, _drop_offer_of, ref)


def _drop_offer_of(ref) -> None:
    offered = _KEPT.offered   # this thread's: an offer is only ever this thread's
    if offered is not None and offered[0] is ref:
        _KEPT.offered = None


def drop_offer() -> None:
    """Forget an untaken offer (a new call starts: an earlier offer is never held past it)."""
    _KEPT.offered = None


def take(readings: Tensor):
    """The offer of the forward that returned ``readings`` (``setup_context``), once."""
    offered, _KEPT.offered = _KEPT.offered, None
    if offered is None or offered[0]() is not readings:
        return None   # traced (fake outputs), or an offer of another call
    return offered[1]


def kept_for_backward():
    """In an implementation's backward: what its forward kept, or None (recompute)."""
    return _KEPT.current


@contextlib.contextmanager
def backward_with(kept):
    """Make ``kept`` what ``kept_for_backward`` returns while the block runs."""
    _KEPT.current = kept
    try:
        yield
    finally:
        _KEPT.current = None


# What a forward kept, by the identity of its undo log. A compiled graph calls the forward
# and backward ops itself, with no autograd context between them, but hands the backward
# the forward's own log, and its final bank and inputs (the same memory; AOTAutograd may
# pass an alias). An entry lives as long as its log and is used only while the final bank
# and every input are the forward's, unmodified in place since.
_BY_LOG: dict[int, tuple] = {}


def version(t: Tensor):
    """``t._version``, or None for an inference tensor."""
    try:
        return t._version
    except RuntimeError:   # inference tensors have no version counter
        return None


def _signature(t: Tensor | None) -> tuple | None:
    """A tensor's memory (its storage, held weakly: alive and the same object or not),
    view, dtype and version; None for an input not checked."""
    if t is None:
        return None
    return (StorageWeakRef(t.untyped_storage()), t.storage_offset(), tuple(t.shape),
            t.stride(), t.dtype, version(t))


def _same(t: Tensor, sig: tuple | None) -> bool:
    if sig is None:
        return True
    ref = sig[0]
    return (not ref.expired() and StorageWeakRef(t.untyped_storage()) == ref
            and _signature(t)[1:] == sig[1:])


def register_by_log(readings: Tensor, rows: Tensor, final: Tensor, inputs) -> None:
    """Key the forward's untaken offer (``keep_for_backward``) by its log ``rows``.

    ``inputs`` are the backward op's ``(k_idx, k_val, v, beta, g, q_idx, q_val)`` as the
    forward saw them; None where the forward had no such tensor: the gated forward
    computed ``beta`` and ``g`` inside from raw inputs, and its backward formula computes
    them again from those (the same values the offer was made with, as in eager)."""
    offered = _KEPT.offered
    if offered is None or offered[0]() is not readings or rows.numel() == 0:
        return
    key = id(rows)
    _BY_LOG[key] = (weakref.ref(rows), [_signature(t) for t in (final, *inputs)], offered[1])
    weakref.finalize(rows, _BY_LOG.pop, key, None)


def kept_by_log(rows: Tensor, final: Tensor, inputs):
    """What the forward that made the log ``rows`` kept, if this backward's ``final`` and
    inputs are that forward's, unmodified; else None."""
    entry = _BY_LOG.get(id(rows))
    if entry is None or entry[0]() is not rows:
        return None
    tensors = (final, *inputs)
    if len(entry[1]) != len(tensors) or not all(map(_same, tensors, entry[1])):
        return None
    return entry[2]
