"""Where the time of one eager call goes, by stream: host enqueue time against wall time,
and from torch.profiler each stream's kernels (count, busy time, span) and the idle gaps
of the stream that runs the walk. For questions such as "is a windowed call bound by the
host's Phase 1 launches or by its kernels sharing the SMs" (NOTES.md run 15):

    python benchmarks/timeline.py A 128 fwd "WINDOW_TOKENS=8192" "WINDOW_TOKENS=4096" ...

Each quoted argument is one variant (space-separated ``KEY=INT`` of ``host.CONFIG``);
``fwd`` is the no-grad forward, ``train`` the training forward.
"""
from __future__ import annotations

import collections
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench_cuda import CONFIGS, bench, make_inputs
from sdm_inductor.kernels import host


def host_and_wall(fn, reps=5):
    """Median host enqueue time and wall time (enqueue + drain) of one call, in ms."""
    hs, ws = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        hs.append((t1 - t0) * 1e3)
        ws.append((t2 - t0) * 1e3)
    return statistics.median(hs), statistics.median(ws)


def streams(fn):
    """Per stream: (kernels, busy us, first start, last end, gaps > 2 us summed), and the
    time of the first step-walk kernel, all relative to the call's first kernel."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ks = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
          and "Memcpy" not in e.name and "Memset" not in e.name]
    t0 = min(e.time_range.start for e in ks)
    by = collections.defaultdict(list)
    for e in ks:
        by[e.device_resource_id].append((e.time_range.start - t0, e.time_range.end - t0, e.name))
    out = {}
    for sid, ev in by.items():
        ev.sort()
        gaps = sum(max(0.0, b[0] - a[1]) for a, b in zip(ev, ev[1:]) if b[0] - a[1] > 2)
        busy = sum(e - s for s, e, _ in ev)
        walk0 = next((s for s, _, n in ev if n.startswith("_step_")), None)
        out[sid] = (len(ev), busy, ev[0][0], max(e for _, e, _ in ev), gaps, walk0)
    return out


def main():
    cfg, C, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    variants = sys.argv[4:] or [""]
    bank, *rest = make_inputs(**CONFIGS[cfg])
    keep = dict(host.CONFIG)

    def fn():
        return host.forward(bank, *rest, C, "none", what == "train")

    for var in variants:
        host.CONFIG.clear()
        host.CONFIG.update(keep, **{k: int(v) for k, v in (kv.split("=") for kv in var.split())})
        ms = bench(fn, rep=100)
        h, w = host_and_wall(fn)
        print(f"== {cfg} C={C} {what} [{var}]: do_bench {ms:.2f} ms; one call: host "
              f"{h:.2f} ms, wall {w:.2f} ms")
        print("| stream | kernels | busy ms | first start ms | last end ms | gaps > 2 us ms "
              "| first step kernel ms |\n| --- | --- | --- | --- | --- | --- | --- |")
        for sid, (n, busy, s, e, gaps, w0) in sorted(streams(fn).items()):
            w0s = "" if w0 is None else f"{w0 / 1e3:.3f}"
            print(f"| {sid} | {n} | {busy / 1e3:.3f} | {s / 1e3:.3f} | {e / 1e3:.3f} | "
                  f"{gaps / 1e3:.3f} | {w0s} |", flush=True)
    host.CONFIG.clear()
    host.CONFIG.update(keep)


if __name__ == "__main__":
    main()
