"""Phase 1 of a token window replayed from a CUDA graph, one graph per window shape and
buffer slot (the eager no-grad step walk's windows, ``host._step_forward``).

A plan (``phase1.plan``) is ~20 launches and torch ops whose host time (~0.8 ms at
config A) is about as long as its kernels (NOTES.md run 15, item 8). Windows whose
Phase 1 runs ahead on a side stream (``pipeline.ahead``) can only hide it behind the walk
of the window before if the host enqueues it far faster than the GPU runs it. A graph
replay is a copy per input and one launch.

The graph's inputs and outputs are static buffers, so a window's plan lives in its slot
until the slot's next replay. Windows alternate between two slots; ``pipeline.ahead``
(``reuse=True``) lets the plan of window ``k + 1`` start only once the walk of window
``k - 1``, which read that slot, has finished. Only calls that keep nothing of their plan
take this path: a training call hands its plan to the backward (``host.Kept``).

The slots are shared by every call of one shape: calls that may run at the same time on
different streams (or threads) must not use this path, which is why it is opt-in
(``host.CONFIG["PLAN_GRAPH"]``). Measured: it cuts a windowed call's host time, not its
wall time, because the plan's kernels and the walk's each fill the GPU (NOTES.md run 16).

The cache key holds everything the captured work depends on: shapes, dtypes, the bank
size, ``C``, the slot, and the values of Phase 1's module constants (the benchmarks set
them between calls). Each key keeps its own memory pool (a graph's temporaries must not
share memory with another slot's outputs); the cache holds at most ``MAX_KEYS`` keys.
"""
from __future__ import annotations

import collections

import torch

from . import phase1, solve

MAX_KEYS = 16
_CACHE: collections.OrderedDict = collections.OrderedDict()
_FAILED: set = set()


def _knobs() -> tuple:
    """Phase 1's and the solve's module constants (they select kernels and launch shapes)."""
    return tuple((m.__name__, k, v) for m in (phase1, solve) for k, v in vars(m).items()
                 if k.isupper() and isinstance(v, (bool, int, float, str)))


def _capture(S: int, args: tuple, C: int, gated: bool):
    """(graph, static inputs, static plan) of ``phase1.plan`` on copies of ``args``."""
    statics = tuple(torch.empty(a.shape, dtype=a.dtype, device=a.device) for a in args)
    for s, a in zip(statics, args):
        s.copy_(a)
    n = 6
    call = lambda: phase1.plan(S, *statics[:n], C, statics[n:] if gated else None)
    call()   # compiles the kernels and initialises the libraries outside the capture
    graph = torch.cuda.CUDAGraph()
    # torch.cuda.graph synchronises the device and captures on a stream of its own; the
    # graph gets a private memory pool
    with torch.cuda.graph(graph):
        pl = call()
    return graph, statics, pl


def plan(S: int, k_idx, k_val, beta, g, q_idx, q_val, C: int, gate_params, slot: int):
    """``phase1.plan`` of these inputs, replayed in buffer slot ``slot`` (see the module
    docstring: the result is overwritten by the slot's next replay). Falls back to the
    eager plan while a CUDA graph is being captured, or if capturing this shape failed."""
    args = (k_idx, k_val, beta, g, q_idx, q_val) + (tuple(gate_params) if gate_params else ())
    if torch.cuda.is_current_stream_capturing():
        return phase1.plan(S, *args[:6], C, gate_params)
    key = (S, C, slot, gate_params is not None, _knobs(),
           tuple((tuple(a.shape), a.dtype, a.device) for a in args))
    entry = _CACHE.get(key)
    if entry is None and key not in _FAILED:
        try:
            entry = _capture(S, args, C, gate_params is not None)
        except RuntimeError:
            _FAILED.add(key)   # e.g. an op that cannot be captured: plan eagerly
        else:
            _CACHE[key] = entry
            if len(_CACHE) > MAX_KEYS:
                # the evicted plan may still be read by queued walks of this call
                torch.cuda.synchronize()
                _CACHE.popitem(last=False)
    if entry is None:
        return phase1.plan(S, *args[:6], C, gate_params)
    _CACHE.move_to_end(key)
    graph, statics, pl = entry
    for s, a in zip(statics, args):
        s.copy_(a)
    graph.replay()
    return pl


def clear():
    """Drop every cached graph (and its memory)."""
    torch.cuda.synchronize()
    _CACHE.clear()
    _FAILED.clear()
