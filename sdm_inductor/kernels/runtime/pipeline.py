"""Phase 1 of the next window of tokens on a side stream while the current stream walks
this one (the eager step walks only).

Phase 1 (``phase1.plan``: sort, groups, Gram matrices, the solve) depends on the indices
and gates alone, never on the bank, so window ``k + 1``'s plan can run while the step
walk of window ``k`` advances the bank. The walk's launches are short and latency-bound
(one wave of small programs, then a dependent launch): the side stream's kernels fill
the SMs they leave idle.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Iterator

import torch
from torch import Tensor

_SIDE: dict = {}


def token_windows(T: int, C: int, tokens: int) -> list[tuple[int, int]]:
    """``[t0, t1)`` windows of about ``tokens`` tokens, whole chunks each (the last may
    end in a partial chunk)."""
    win = max(C, tokens // C * C)
    return [(t0, min(T, t0 + win)) for t0 in range(0, T, win)]


def overlaps(device: torch.device) -> bool:
    """Whether ``ahead`` uses a side stream: on CUDA, outside CUDA-graph capture (a
    captured call keeps one stream, so its graph is one chain of launches)."""
    return device.type == "cuda" and not torch.cuda.is_current_stream_capturing()


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    key = (device.type, device.index if device.index is not None else torch.cuda.current_device())
    if key not in _SIDE:
        _SIDE[key] = torch.cuda.Stream(device)
    return _SIDE[key]


def _tensors(obj) -> Iterator[Tensor]:
    if isinstance(obj, Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name))
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from _tensors(x)


def ahead(items: Iterable, make: Callable, device: torch.device) -> Iterator[tuple]:
    """``(item, make(item))`` for each item in order. With ``overlaps(device)``, ``make``
    runs on a side stream one item ahead: its work for item ``i + 1`` is queued before the
    caller's work for item ``i``, and the current stream waits only for item ``i``'s.

    ``make`` must read only tensors that are ready when this starts (the side stream
    waits for the current stream once, here). Its results were allocated on the side
    stream: they are marked as used by the current stream (``record_stream``), so the
    caching allocator does not hand their memory out before that stream is done.

    One item has nothing to overlap: it runs on the current stream. On the side stream its
    results' memory would be reusable only once the current stream's work has finished,
    so a host that runs calls ahead of the GPU would make the caching allocator take fresh
    blocks for every call."""
    items = list(items)
    if not items:
        return
    if not overlaps(device) or len(items) == 1:
        for it in items:
            yield it, make(it)
        return
    main = torch.cuda.current_stream(device)
    side = _side_stream(device)
    side.wait_stream(main)

    def enqueue(it):
        with torch.cuda.stream(side):
            out = make(it)
            done = torch.cuda.Event()
            done.record(side)
        return out, done

    try:
        pending = enqueue(items[0])
        for i, it in enumerate(items):
            out, done = pending
            if i + 1 < len(items):
                pending = enqueue(items[i + 1])
            main.wait_event(done)
            for t in _tensors(out):
                t.record_stream(main)
            yield it, out
    finally:
        main.wait_stream(side)   # nothing of the call is left running on the side stream
