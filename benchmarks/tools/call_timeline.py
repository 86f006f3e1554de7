"""Where a lone call's time goes: ``sdm_inductor.write_read`` (no grad) called once and then
synchronized, eager against ``torch.compile(fullgraph=True)``, as ``bench_compile.py
--cases op`` times it. Prints the medians of both (interleaved rounds), then profiles one
call of each and prints its summary: wall time, when the host issued its last launch,
when the GPU started and ended, how long the GPU was busy in between and its longest idle
stretches, and its kernels' summed times (the largest by name). The whole timeline of each
profiled call (host ops with their nesting depth, launches, GPU kernels; microseconds from
the call's start) goes to ``OUT/call_timeline_<config>.txt``. The profiler roughly doubles
the host's time; the medians are taken without it.

``--emitted`` adds the eager call through the queue walk (``WALK="queue"``) and the
compiled call with the SDM kernels in the output code (``EMIT_KERNELS="always"``): the two
that launch the same walk kernel, so their kernel sums say whether the emitted call's
extra time is on the GPU or on the host.

    python benchmarks/tools/call_timeline.py [--configs A,B] [--emitted] [--out DIR]
    python benchmarks/tools/call_timeline.py --device cpu --configs small   # a smoke run
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench_compile
import bench_compile as bc  # noqa: E402
from bench_user import emitting  # noqa: E402
from sdm_inductor.kernels.config import CONFIG  # noqa: E402


def _queue_walk(fn):
    """``fn`` called with the eager op forced onto the queue walk."""
    def call():
        with mock.patch.dict(CONFIG, WALK="queue"):
            return fn()
    return call


def _events_of(events, mark):
    """The events that start inside the host range ``mark`` (and up to 100 us after it:
    the GPU's last kernels), as (offset us, duration us, device, host depth, name)."""
    t0, t1 = mark.time_range.start, mark.time_range.end
    rows = []
    for e in events:
        start = e.time_range.start
        if e.name == mark.name or not t0 <= start <= t1 + 100:
            continue   # the mark itself and its copy on the GPU's timeline (an annotation)
        depth, parent = 0, e.cpu_parent
        while parent is not None and parent is not mark:
            depth, parent = depth + 1, parent.cpu_parent
        on_gpu = e.device_type.name != "CPU"
        rows.append((start - t0, e.time_range.end - start, "GPU" if on_gpu else "CPU",
                     -1 if on_gpu else depth, e.name))
    return sorted(rows), t1 - t0


def _gpu_span(rows):
    """The GPU's first start, last end and the stretches between in which it ran nothing,
    as (length, start, name of the kernel that ended it)."""
    gaps, first, end = [], None, None
    for off, dur, dev, _, name in rows:   # rows are in start order
        if dev != "GPU":
            continue
        if end is None:
            first = off
        elif off > end:
            gaps.append((off - end, end, name))
        end = off + dur if end is None else max(end, off + dur)
    return first, end, gaps


def _summary(rows, wall):
    """Wall time, the host's last launch, the GPU's first start / last end, its busy time
    and its five longest idle stretches (in a lone call: where the GPU waited for the
    host)."""
    launches = [off for off, _, dev, _, name in rows
                if dev == "CPU" and ("LaunchKernel" in name or "GraphLaunch" in name)]
    first, end, gaps = _gpu_span(rows)
    first, end = first or 0.0, end or 0.0
    busy = end - first - sum(g for g, _, _ in gaps)
    idle = "; ".join(f"{g:.0f} us at {at:.0f} before {name[:40]}"
                     for g, at, name in sorted(gaps, reverse=True)[:5])
    return (f"wall {wall:8.1f} us, last launch issued at {max(launches, default=0):8.1f}, "
            f"GPU {first:8.1f} .. {end:8.1f}, busy {busy:8.1f}", idle)


def _kernel_sums(rows, top: int = 6) -> str:
    """The GPU's kernels summed: their count and total time, and the ``top`` largest names
    with their summed times (a name launched several times counts once)."""
    kernels = [(name, dur) for _, dur, dev, _, name in rows if dev == "GPU"]
    by_name: dict[str, float] = {}
    for name, dur in kernels:
        by_name[name] = by_name.get(name, 0.0) + dur
    largest = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return (f"{len(kernels)} kernels, {sum(by_name.values()):.1f} us; "
            + "; ".join(f"{t:.1f} {n[:48]}" for n, t in largest))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="A,B")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--emitted", action="store_true",
                    help="also the eager queue walk and the compiled call with the kernels emitted")
    args = ap.parse_args()
    device = torch.device(args.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    for name in args.configs.split(","):
        cfg = bc.CONFIGS[name]
        kw = bc.prepared(bc.op_inputs(**cfg, device=device))
        opts = dict(C=cfg["C"], sph=cfg["sph"])
        compiled = torch.compile(lambda **k: bc.explicit_op(**k, **opts), fullgraph=True)
        eager = lambda: bc.explicit_op(**kw, **opts)  # noqa: E731
        calls = {"eager": eager, "compiled": lambda: compiled(**kw)}
        if args.emitted:
            # a code object of its own: Dynamo caches compiled code per code object
            emitted = torch.compile(lambda **k: bc.explicit_op(**k, **opts), fullgraph=True)
            calls["queue"] = _queue_walk(eager)
            calls["emitted"] = emitting(lambda: emitted(**kw))
        with torch.no_grad():
            times = {mode: [] for mode in calls}
            for _ in range(args.rounds):
                for mode, fn in calls.items():
                    times[mode].append(bc.timed(fn, device, 10) * 1e3)
            med = {mode: statistics.median(ts) for mode, ts in times.items()}
            print(f"config {name}: " + ", ".join(f"{m} {t:.3f} ms" for m, t in med.items())
                  + f" (compiled / eager {med['compiled'] / med['eager']:.3f}; medians of "
                  f"{args.rounds} rounds of 10 lone calls)", flush=True)
            with profile(activities=activities) as prof:
                for i in range(2):   # the second call of each is the one laid out
                    for mode, fn in calls.items():
                        bc.sync(device)
                        with record_function(f"call {mode} {i}"):
                            fn()
                            bc.sync(device)
        events = prof.events()
        path = os.path.join(args.out, f"call_timeline_{name}.txt")
        with open(path, "w") as fh:
            for mode in calls:
                mark = next(e for e in events if e.name == f"call {mode} 1")
                rows, wall = _events_of(events, mark)
                line, gaps = _summary(rows, wall)
                sums = _kernel_sums(rows)
                print(f"  {mode:<8} {line}\n           GPU idle: {gaps}\n"
                      f"           GPU kernels: {sums}", flush=True)
                fh.write(f"=== {mode}: {line}\n  GPU idle: {gaps}\n  GPU kernels: {sums}\n"
                         "  offset us   dur us dev depth name\n")
                for off, dur, dev, depth, ev in rows:
                    fh.write(f"{off:11.1f} {dur:8.1f} {dev} {depth:5d} {ev[:100]}\n")
        print(f"  timelines: {path}", flush=True)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
