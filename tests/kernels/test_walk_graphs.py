"""The keys under which eager step walks are replayed from CUDA graphs (``kernels/runtime/graphs.py``):
a replay is the same launches only if the key changes with every launch argument. On CPU:
no GPU is needed to build the keys (the replays themselves are checked in test_cuda.py)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from sdm_inductor.kernels.forward.step_walk import _step_mix_kernel  # noqa: E402
from sdm_inductor.kernels.runtime import graphs  # noqa: E402
from sdm_inductor.kernels.runtime.launch import Relaunch  # noqa: E402


def _mix(X, QKX, u, i, d, out, T=100, hd=64, NC=2, **meta):
    meta = dict(dict(C=64, MB=32, TB=32, CP=64, PREC="tf32", num_warps=4), **meta)
    return Relaunch(_step_mix_kernel, (4, 2), "c", X, QKX, u, i, d, out, 0, T, hd, NC, **meta)


def test_relaunch_key_names_every_argument():
    bufs = [torch.zeros(16) for _ in range(6)]
    key = _mix(*bufs).key
    assert _mix(*bufs).key == key
    # views of the same memory are the same pointer: the same launches
    assert _mix(*[b[:8] for b in bufs]).key == key
    other = list(bufs)
    other[3] = torch.zeros(16)          # another tensor: another device pointer
    assert _mix(*other).key != key
    assert _mix(*[b.double() for b in bufs]).key != key   # another dtype
    assert _mix(*bufs, T=101).key != key                   # a scalar
    assert _mix(*bufs, TB=16).key != key                   # a launch option
    assert _mix(*bufs, num_warps=8).key != key


def test_cpu_walks_launch_directly():
    calls = []
    before = sum(graphs.stats.values())
    for _ in range(3):
        graphs.run(("forward", 1), lambda: calls.append(1), torch.device("cpu"), True)
    assert calls == [1, 1, 1]
    assert sum(graphs.stats.values()) == before and not graphs.usable(torch.device("cpu"), True)


def test_cpu_phase1_is_made_directly_and_no_room_drops_kept_graphs():
    made = []
    make = lambda: made.append(1) or len(made)
    before = sum(graphs.stats.values())
    assert [graphs.made(("plan", 1), make, torch.device("cpu"), 1) for _ in range(3)] == [1, 2, 3]
    assert sum(graphs.stats.values()) == before
    graphs._made.add(("plan", 0), (None, None))   # a kept graph: room 0 drops it
    assert graphs.made(("plan", 1), make, torch.device("cpu"), 0) == 4
    assert not graphs._made.graphs


def _calls(cache, keys, capacity):
    """The cache's action for each key in turn, recording a stand-in graph when asked."""
    out = []
    for k in keys:
        action, _ = cache.action(k, capacity, 16)
        if action == "record":
            cache.add(k, object())
        out.append(action)
    return out


def test_graph_cache_records_on_the_second_call_then_replays():
    cache = graphs.GraphCache()
    assert _calls(cache, ["a", "a", "a", "b", "a", "b"], 4) == [
        "eager", "record", "replay", "eager", "replay", "record"]


def test_graph_cache_keeps_replaying_when_a_loop_has_more_walks_than_room():
    # six walks per iteration, room for four: the first four recorded stay and replay,
    # the other two run eagerly; no graph is dropped and recorded again
    cache = graphs.GraphCache()
    loop = ["w0", "w1", "w2", "w3", "w4", "w5"]
    _calls(cache, loop * 2, 4)
    for _ in range(5):
        assert _calls(cache, loop, 4) == ["replay"] * 4 + ["eager"] * 2
    assert set(cache.graphs) == {"w0", "w1", "w2", "w3"}


def test_graph_cache_lets_new_walks_replace_graphs_no_longer_used():
    # a loop whose memory moved: its old graphs make way for the new walks' graphs
    cache = graphs.GraphCache()
    _calls(cache, ["a", "b"] * 3, 2)
    assert _calls(cache, ["c", "d", "c", "d", "c", "d"], 2) == [
        "eager", "eager", "record", "record", "replay", "replay"]
    assert set(cache.graphs) == {"c", "d"}
