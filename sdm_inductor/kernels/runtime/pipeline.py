"""Phase 1 of the next window of tokens on a side stream while the current stream walks
this one (the eager step walks only).

Phase 1 (``phase1.plan``: sort, groups, Gram matrices, the solve) depends on the indices
and gates alone, never on the bank, so window ``k + 1``'s plan can run while the step
walk of window ``k`` advances the bank. The walk's launches are short and latency-bound
(one wave of small programs, then a dependent launch): the side stream's kernels fill
the SMs they leave idle.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import torch

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


def _side_stream(main: torch.cuda.Stream) -> torch.cuda.Stream:
    """The side stream of ``main`` (one per stream: its freed blocks go only to calls on
    ``main``, whose side stream waits for ``main``)."""
    key = (main.device_index, main.cuda_stream)
    if key not in _SIDE:
        _SIDE[key] = torch.cuda.Stream(main.device)
    return _SIDE[key]


def ahead(items: Iterable, make: Callable, device: torch.device) -> Iterator[tuple]:
    """``(item, make(item))`` for each item in order. With ``overlaps(device)``, ``make``
    runs on a side stream one item ahead: its work for item ``i + 1`` is queued before the
    caller's work for item ``i``, and the current stream waits only for item ``i``'s.

    ``make`` must read only tensors that are ready when it is called. Its results are
    allocated on the side stream and used on the current one. They are not marked with
    ``record_stream``: the side stream waits for the current stream before each ``make``,
    so whatever the side stream writes into memory freed since comes after every use the
    current stream was given before that memory was freed (a freed block is handed only
    to allocations on its own stream). Marking every plan tensor with ``record_stream``
    instead cost the host enough to make a public no-grad call over several windows ~1.7 %
    slower (docs/performance.md, Variants measured). The side stream belongs to the
    current stream (``_side_stream``), so a call on another stream never takes memory that
    this stream may still read.

    One item has nothing to overlap: it runs on the current stream."""
    items = list(items)
    if not items:
        return
    if not overlaps(device) or len(items) == 1:
        for it in items:
            yield it, make(it)
        return
    main = torch.cuda.current_stream(device)
    side = _side_stream(main)

    def enqueue(it):
        side.wait_stream(main)   # (item i + 1 thus waits for the caller's work of i - 1)
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
            yield it, out
    finally:
        main.wait_stream(side)   # nothing of the call is left running on the side stream
