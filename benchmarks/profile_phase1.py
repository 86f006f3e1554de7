"""Phase 1 (``phase1.plan``) per kernel, over the whole sequence and over one window of
tokens, and the host time of the eager calls (config A of SDM_SPEC section 5, or
``--config=B``):

    python benchmarks/profile_phase1.py [C ...] [--whole] [--plan-only] [--config=B] [KEY=INT ...]

(``--whole``: the whole sequence only, no windows; ``KEY=INT`` overrides
``kernels.host.CONFIG``, e.g. ``PDL=0``: with programmatic dependent launch a kernel's
profiled time includes its wait for the kernel before it, so per-kernel tables need
``PDL=0``; ``module.NAME=INT`` a kernels module's constant, ``bench_cuda.set_knob``;
``--plan-only``: no whole calls.)

Prints, for each C: ``plan`` (whole sequence / 1024 tokens) timed by do_bench, its host
time of enqueueing against its wall time, the CUDA time of each kernel in one call of each
(torch.profiler), and the host time of enqueueing a no-grad forward and a forward +
backward (no synchronisation) against their wall time.
"""
from __future__ import annotations

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench_cuda import CONFIGS, bench, eager_plan, make_inputs, set_knob
from sdm_inductor.kernels import host


def kernel_table(fn, title, top=14):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            name = ev.name[:70]
            t, n = rows.get(name, (0.0, 0))
            rows[name] = (t + ev.device_time, n + 1)
    total = sum(t for t, _ in rows.values())
    print(f"\n{title}: {total / 1e3:.3f} ms of kernel time")
    print("| kernel | ms | launches |\n| --- | --- | --- |")
    for name, (t, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name} | {t / 1e3:.3f} | {n} |")


def host_time(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    hs, ws = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        hs.append(t1 - t0)
        ws.append(t2 - t0)
    return 1e3 * min(hs), 1e3 * min(ws)


def main():
    chunks = [int(a) for a in sys.argv[1:] if a.isdigit()] or [64, 128]
    whole = "--whole" in sys.argv
    name = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--config=")), "A")
    for kv in (a for a in sys.argv[1:] if "=" in a and not a.startswith("--")):
        set_knob(kv)
    print("config", host.CONFIG)
    cfg = CONFIGS[name]
    bank, k_idx, k_val, v, beta, g, q_idx, q_val = make_inputs(**cfg)
    S = bank.shape[0]
    dy = torch.randn_like(v)
    dM = torch.randn_like(bank)
    for C in chunks:
        print(f"\n## {name}, C={C}")
        for name, T1 in (("whole", k_idx.shape[1]),) + ((("1024 tokens", 1024),) if not whole else ()):
            args = [x[:, :T1].contiguous() for x in (k_idx, k_val, beta, g, q_idx, q_val)]

            def run():
                return eager_plan(S, *args, C)
            print(f"plan {name}: {bench(run, rep=100):.3f} ms")
            # host time of enqueueing the plan (no sync) against its wall time: near
            # equal means the plan is bound by its launches, not its kernels
            h, w = host_time(run)
            print(f"plan {name}: host {h:.2f} ms, wall {w:.2f} ms")
            kernel_table(run, f"plan {name}")

        if "--plan-only" in sys.argv:
            continue
        for win in (1 << 20,) + (() if whole else (1024,)):
            host.CONFIG["WINDOW_TOKENS"] = win

            def fwd():
                return host.forward(bank, k_idx, k_val, v, beta, g, q_idx, q_val, C, "none", False)

            def fb():
                _, rows, sc = host.forward(bank, k_idx, k_val, v, beta, g, q_idx, q_val, C,
                                           "none", True)
                return host.backward(dy, dM, bank, rows, sc, k_idx, k_val, v, beta, g, q_idx,
                                     q_val, C, "none", False)
            for label, fn in (("no-grad fwd", fwd), ("fwd+bwd", fb)):
                h, w = host_time(fn)
                print(f"windows of {win}: {label}: host {h:.2f} ms, wall {w:.2f} ms")
            kernel_table(fb, f"fwd+bwd, windows of {win}", top=24)
        host.CONFIG["WINDOW_TOKENS"] = 1024


if __name__ == "__main__":
    main()
