"""The caching allocator's work in windowed no-grad calls (NOTES.md run 15, item 2: two
windows of 4096 tokens cost 3.5 ms more host time than one window at config A, mostly
outside Python). For each ``WINDOW_TOKENS``: ten calls back to back (no synchronisation
between them, as a training loop or ``do_bench``), then ten with a synchronisation before
each, printing host ms per call and the allocator counters' change per call:

    python benchmarks/window_alloc.py [A|B] [C] [WINDOW_TOKENS ...]
"""
from __future__ import annotations

import sys
import time

import torch

from bench_cuda import CONFIGS, make_inputs
from sdm_inductor.kernels import host

KEYS = ("segment.all.allocated", "segment.all.freed", "num_alloc_retries",
        "num_sync_all_streams", "num_device_alloc", "num_device_free")


def counters():
    st = torch.cuda.memory_stats()
    return {k: st.get(k, 0) for k in KEYS}


def main():
    cfg = sys.argv[1] if len(sys.argv) > 1 else "A"
    C = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    sizes = [int(x) for x in sys.argv[3:]] or [8192, 4096]
    bank, *rest = make_inputs(**CONFIGS[cfg])
    for tokens in sizes:
        host.CONFIG["WINDOW_TOKENS"] = tokens

        def fn():
            return host.forward(bank, *rest, C, "none", False)

        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        for mode in ("back to back", "synchronised"):
            c0 = counters()
            hs = []
            t0 = time.perf_counter()
            for _ in range(10):
                if mode == "synchronised":
                    torch.cuda.synchronize()
                a = time.perf_counter()
                fn()
                hs.append((time.perf_counter() - a) * 1e3)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) * 1e2   # ms per call
            c1 = counters()
            delta = ", ".join(f"{k} {(c1[k] - c0[k]) / 10:g}" for k in KEYS)
            print(f"{cfg} C={C} WINDOW_TOKENS={tokens} {mode}: host {sorted(hs)[5]:.2f} ms "
                  f"(median), wall {wall:.2f} ms per call; per call: {delta}", flush=True)


if __name__ == "__main__":
    main()
