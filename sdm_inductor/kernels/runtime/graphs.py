"""Eager step walks replayed from CUDA graphs when the very same launches repeat.

An eager step walk makes three launches per chunk forward and four to six backward: ~200
and ~450 at config A, C=128. Their host time is about as long as their GPU
time, so an eager call's speed follows the host's.

A CUDA graph records launches with their arguments: device pointers and scalars. Replaying
it makes the same launches as making them again exactly when every argument is the same,
so a walk is keyed on its launches (``Relaunch.key``: kernel, grid, every argument, a
tensor by its device pointer and dtype, the launch options) and its loop. A key seen for
the first time runs eagerly (and compiles what it needs); the second time it is captured,
then replayed from then on. A steady loop (a benchmark, a training loop whose allocator
hands out the same blocks) replays; a call whose tensors live elsewhere makes its launches
as before. How soon a loop replays depends on the caching allocator: in a process whose
cache earlier work had fragmented, a training loop's backward walks can take more than
six calls to repeat their pointers. Nothing is allocated
while recording (the walks' buffers are made before), so a graph holds no memory of its own.
At most ``MAX_GRAPHS`` graphs are kept (``GraphCache``: a graph still being replayed is
not dropped for a new walk, so a loop of more walks than that replays as many as fit).

Phase 1 of a no-grad call is replayed the same way (``made``): its ~20 launches take longer
to make on the host (0.8-0.95 ms at config A on an H100's host) than to run (0.6 ms), and
a lone call's GPU waits for them. Its graph allocates what it makes (the plan) in a memory
pool of its own, kept with the graph, and a replay rewrites those very tensors; so only a
call that hands nothing it made past itself may take it (no-grad: nothing is kept for a
backward), a graph is keyed on the stream too (a call on another stream never rewrites a
plan that a walk there still reads), and at most ``CONFIG["PLAN_GRAPHS"]`` are kept.

Not used while a CUDA graph records the call (the launches go into that graph), when the
launches go through ``wrap_triton`` (not the eager implementation), under the interpreter,
with Triton launch hooks set (a profiler: replays would bypass them), or when
``CONFIG["WALK_GRAPHS"]`` is 0 for walks (environment ``SDM_INDUCTOR_WALK_GRAPHS=0``) and
``CONFIG["PLAN_GRAPHS"]`` for Phase 1 (``SDM_INDUCTOR_PLAN_GRAPHS=0``).
"""
from __future__ import annotations

import collections
import os
from typing import Callable, Hashable, TypeVar

import torch
from triton import knobs

from .launch import _idle, _wrap_triton_enabled

# walks kept as graphs at most (GraphCache), and keys remembered as seen
MAX_GRAPHS = 64
_MAX_SEEN = 256
T = TypeVar("T")
_streams: dict = {}
# counters for tests and benchmarks: "eager", "captured", "replayed" by the key's first
# item (the walk: "forward", "reverse"; Phase 1: "plan"), e.g. stats["replayed", "forward"]
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


class GraphCache:
    """Which walks run eagerly, are recorded, or are replayed. A key's first call runs
    eagerly, its next one is recorded, later ones replay. At most ``capacity`` graphs are
    kept (given with each call: ``MAX_GRAPHS`` as it is then). When full, a key due to be
    recorded takes the place of the least recently replayed graph only if that graph has
    not been replayed since the key's last call.
    So a loop whose walks outnumber the capacity (a model of many SDM layers) keeps
    replaying the graphs it has and runs the rest eagerly, instead of dropping each graph
    just before its next use and recording it again every other call, while graphs that a
    loop stopped using (its memory moved) still make way for the new walks."""

    def __init__(self):
        self.graphs: collections.OrderedDict = collections.OrderedDict()  # key -> [graph, last]
        self.seen: collections.OrderedDict = collections.OrderedDict()    # key -> last call
        self.clock = 0

    def action(self, key, capacity: int, seen_limit: int) -> tuple:
        """``("replay", graph)``, ``("record", None)`` or ``("eager", None)`` for a call of
        the walk ``key`` (then ``add`` the graph of a recorded call), keeping at most
        ``capacity`` graphs and ``seen_limit`` keys not recorded."""
        self.clock += 1
        entry = self.graphs.get(key)
        if entry is not None:
            entry[1] = self.clock
            self.graphs.move_to_end(key)
            return "replay", entry[0]
        last = self.seen.pop(key, None)
        if last is not None and self._make_room(last, capacity):
            return "record", None
        self.seen[key] = self.clock
        while len(self.seen) > seen_limit:
            self.seen.popitem(last=False)
        return "eager", None

    def _make_room(self, last_call: int, capacity: int) -> bool:
        while len(self.graphs) > capacity:   # the capacity was lowered since
            self.graphs.popitem(last=False)
        if len(self.graphs) < capacity:
            return True
        oldest = next(iter(self.graphs))
        if self.graphs[oldest][1] > last_call:   # replayed since: still in use
            return False
        del self.graphs[oldest]
        return True

    def add(self, key, graph) -> None:
        self.graphs[key] = [graph, self.clock]

    def clear(self) -> None:
        self.graphs.clear()
        self.seen.clear()


_cache = GraphCache()
_made = GraphCache()   # graphs that allocate what they make (``made``)


def _record(body: Callable[[], object], device: torch.device, pool=None):
    """``body``'s launches as a graph, recorded on a side stream (a capture may not start
    on the default stream), and what ``body`` returned; nothing runs while recording.
    ``pool``: the memory pool of what ``body`` allocates (None: it allocates nothing)."""
    graph = torch.cuda.CUDAGraph()
    side = _stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        # thread_local: other threads' CUDA calls are not restricted while this records
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            out = body()
        finally:
            graph.capture_end()
    return graph, out


def run(key: Hashable, body: Callable[[], None], device: torch.device, enabled: bool) -> None:
    """Make ``body``'s launches on the current stream: eagerly, or by replaying the graph
    of an earlier call with the same ``key`` (a tuple that must name every argument of
    every launch ``body`` makes, and its loop; its first item names the walk)."""
    if not usable(device, enabled):
        body()
        return
    recent[key[:3]].append(key)
    action, graph = _cache.action(key, MAX_GRAPHS, _MAX_SEEN)
    if action == "eager":   # first time (compiles the kernels too), or no room for a graph
        stats["eager", key[0]] += 1
        body()
        return
    if action == "record":
        graph, _ = _record(body, device)
        _cache.add(key, graph)
        stats["captured", key[0]] += 1
    stats["replayed", key[0]] += 1
    graph.replay()


def made(key: Hashable, make: Callable[[], T], device: torch.device, capacity: int) -> T:
    """``make()``: made eagerly, or by replaying the graph of an earlier call with the same
    ``key`` (a tuple naming everything ``make`` reads, its first item what it makes), which
    rewrites what that call's recording made and returns it. What ``make`` returns must not
    be used past the next call with the same key: only a call that hands none of it past
    itself may come here. ``capacity``: the graphs kept at most (0: none, and those kept
    are dropped, with the memory they hold)."""
    if capacity <= 0:
        _made.clear()
        return make()
    if not usable(device, True):
        return make()
    key = (key[0], torch.cuda.current_stream(device).cuda_stream, *key[1:])
    action, entry = _made.action(key, capacity, _MAX_SEEN)
    if action == "eager":
        stats["eager", key[0]] += 1
        return make()
    if action == "record":
        # a pool of its own: the allocator never hands a private pool's memory to other
        # work (a dropped graph's pool is given back with cudaFree, which waits for the
        # device), so no walk still reading a dropped plan sees it overwritten
        entry = _record(make, device, torch.cuda.graph_pool_handle())
        _made.add(key, entry)
        stats["captured", key[0]] += 1
    stats["replayed", key[0]] += 1
    graph, out = entry
    graph.replay()
    return out


def clear() -> None:
    """Forget every graph and seen key."""
    _cache.clear()
    _made.clear()
    recent.clear()


def differences(a, b, path=()) -> list:
    """Where two keys differ (index paths into the nested tuples, with both values)."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, path + (i,))]
    return [] if a == b else [(path, a, b)]
