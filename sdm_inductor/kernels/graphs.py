"""Eager step walks replayed from CUDA graphs when the very same launches repeat.

An eager step walk makes two or three launches per chunk forward and six or seven
backward: ~200 and ~450 at config A, C=128. Their host time is about as long as their GPU
time (benchmarks/NOTES.md run 17), so an eager call's speed follows the host's.

A CUDA graph records launches with their arguments: device pointers and scalars. Replaying
it makes the same launches as making them again exactly when every argument is the same,
so a walk is keyed on its launches (``Relaunch.key``: kernel, grid, every argument, a
tensor by its device pointer and dtype, the launch options) and its loop. A key seen for
the first time runs eagerly (and compiles what it needs); the second time it is captured,
then replayed from then on. A steady loop (a benchmark, a training loop whose allocator
hands out the same blocks) replays; a call whose tensors live elsewhere makes its launches
as before. How soon a loop replays depends on the caching allocator: in a process whose
cache earlier work had fragmented, a training loop's backward walks once took more than
six calls to repeat their pointers (benchmarks/NOTES.md run 18). Nothing is allocated
while recording (the walks' buffers are made before), so a graph holds no memory of its own.

Not used while a CUDA graph records the call (the launches go into that graph), when the
launches go through ``wrap_triton`` (not the eager implementation), under the interpreter,
with Triton launch hooks set (a profiler: replays would bypass them), or when
``CONFIG["WALK_GRAPHS"]`` is 0 (environment ``SDM_INDUCTOR_WALK_GRAPHS=0``).
"""
from __future__ import annotations

import collections
import os
from typing import Callable, Hashable

import torch
from triton import knobs

from .launch import _idle, _wrap_triton_enabled

# graphs kept (least recently used dropped first) and keys remembered as seen once
MAX_GRAPHS = 16
_MAX_SEEN = 256
_graphs: collections.OrderedDict = collections.OrderedDict()
_seen: collections.OrderedDict = collections.OrderedDict()
_streams: dict = {}
# counters for tests and benchmarks: "eager", "captured", "replayed" by the key's first
# item (the walk: "forward", "reverse"), e.g. stats["replayed", "forward"]
stats = collections.Counter()
# the last two keys of each walk and loop (the key's first three items; tests: what changed
# between two calls that did not replay)
recent: dict = collections.defaultdict(lambda: collections.deque(maxlen=2))


def usable(device: torch.device, enabled: bool) -> bool:
    """Whether a walk on ``device`` may be recorded and replayed."""
    if not enabled or device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if torch.cuda.is_current_stream_capturing() or _wrap_triton_enabled():
        return False   # recorded into another graph, or launches through the traceable op
    rt = knobs.runtime
    return _idle(rt.launch_enter_hook) and _idle(rt.launch_exit_hook)


def _stream(device: torch.device) -> torch.cuda.Stream:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _streams:
        _streams[idx] = torch.cuda.Stream(device)
    return _streams[idx]


def _remember(table: collections.OrderedDict, key, value, limit: int):
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)


def _record(body: Callable[[], None], device: torch.device) -> torch.cuda.CUDAGraph:
    """``body``'s launches as a graph, recorded on a side stream (a capture may not start
    on the default stream); nothing runs while recording."""
    graph = torch.cuda.CUDAGraph()
    side = _stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        # thread_local: other threads' CUDA calls are not restricted while this records
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            body()
        finally:
            graph.capture_end()
    return graph


def run(key: Hashable, body: Callable[[], None], device: torch.device, enabled: bool) -> None:
    """Make ``body``'s launches on the current stream: eagerly, or by replaying the graph
    of an earlier call with the same ``key`` (a tuple that must name every argument of
    every launch ``body`` makes, and its loop; its first item names the walk)."""
    if not usable(device, enabled):
        body()
        return
    recent[key[:3]].append(key)
    graph = _graphs.get(key)
    if graph is None:
        if key not in _seen:   # first time: run eagerly (compiles the kernels too)
            _remember(_seen, key, True, _MAX_SEEN)
            stats["eager", key[0]] += 1
            body()
            return
        del _seen[key]
        graph = _record(body, device)
        stats["captured", key[0]] += 1
    _remember(_graphs, key, graph, MAX_GRAPHS)
    stats["replayed", key[0]] += 1
    graph.replay()


def clear() -> None:
    """Forget every graph and seen key."""
    _graphs.clear()
    _seen.clear()
    recent.clear()


def differences(a, b, path=()) -> list:
    """Where two keys differ (index paths into the nested tuples, with both values)."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, path + (i,))]
    return [] if a == b else [(path, a, b)]
