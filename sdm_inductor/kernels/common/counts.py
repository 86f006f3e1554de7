"""The queue walks' counts (``forward/queue_walk.py``, ``backward/queue_walk.py``): an item
waits until a count of the items it needs reaches its target (``_await_count``), and counts
itself once its stores are done (``_finish``)."""
from __future__ import annotations

import triton
import triton.language as tl

from .tiles import _grid_dependency

# counters sit one 128-byte line apart (``LINE`` int32s): polls of one group's count do
# not contend with the releases of another's
LINE = 32


@triton.jit
def _await_count(cnt_ptr, target):
    """Wait until the count at ``cnt_ptr`` reaches ``target``; then what the items behind
    the count wrote is visible (an acquiring read of the count, which their release wrote).
    Triton has no acquiring load: an acquiring add of 0 whose result is used compiles to
    ``ld.acquire.gpu``; one whose result is unused is dropped by the compiler, and the walk
    then read rows and deltas before their writers' stores were visible."""
    while tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu") < target:
        pass


@triton.jit
def _finish(cnt_ptr):
    """Count an item as done once all of its program's stores are (release)."""
    tl.debug_barrier()
    tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _depend(ON: tl.constexpr, cnt_ptr, target):
    """Where a step kernel waits for the launch before it (``tiles._grid_dependency(ON)``,
    ``cnt_ptr`` None), a queue walk's item waits instead for the count at ``cnt_ptr`` to
    reach ``target`` (none for a target of 0: a later token or tile of an item whose first
    waited). The item then does before its wait what the step kernel does before its own."""
    if cnt_ptr is None:
        _grid_dependency(ON)
    elif ON:
        if target > 0:
            _await_count(cnt_ptr, target)
