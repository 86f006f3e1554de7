"""CUDA check of the walk-graph cache (``kernels/graphs.py``) in an eager training loop
of a model with several SDM layers: after the first iterations every step walk of every
layer should replay (no new captures), and with a cache smaller than the loop's walks the
graphs that fit keep replaying instead of being recorded again each iteration.

    python benchmarks/walk_cache_check.py [--layers 6] [--iters 10]

Prints, per iteration and cache size, the step time and the counts of eager, captured and
replayed walks. Exits 1 when the policy's promises fail: with room for every walk, the
last iteration replays all of them and records none; with too little room, no walk is
recorded twice (a graph still in use is never dropped for another) and the last two
iterations replay some. How soon a loop replays depends on the caching allocator: on the
H200 a fresh process's first loop repeated its pointers from its fifth or sixth iteration,
and in one run the loop alternated between two sets of pointers, so its walks were two
sets of keys (60 graphs for 30 walks; with room for 16, every other iteration replayed).
"""
from __future__ import annotations

import argparse
import collections
import sys

import torch
from torch import nn

from sdm_inductor.kernels import host
from sdm_inductor.kernels.runtime import graphs
from sdm_inductor.nn import SparseDeltaMemory


class Stack(nn.Module):
    def __init__(self, layers: int, d: int):
        super().__init__()
        self.layers = nn.ModuleList(
            SparseDeltaMemory(d, num_heads=4, slots_per_head=4096, top_k=32, chunk_size=64,
                              device="cuda", dtype=torch.bfloat16) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def loop(model, opt, x, iters: int):
    rows = []
    for it in range(iters):
        before = collections.Counter(graphs.stats)
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        opt.zero_grad(set_to_none=False)
        model(x).float().square().mean().backward()
        opt.step()
        t1.record()
        torch.cuda.synchronize()
        d = collections.Counter(graphs.stats)
        d.subtract(before)
        counts = {k: sum(v for (kind, _), v in d.items() if kind == k)
                  for k in ("eager", "captured", "replayed")}
        rows.append((t0.elapsed_time(t1), counts))
        print(f"  iter {it}: {rows[-1][0]:7.2f} ms  " + "  ".join(f"{k} {v}" for k, v in counts.items()),
              flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Stack(args.layers, 512)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)   # in place: the pointers stay
    x = torch.randn(2, 2048, 512, device="cuda", dtype=torch.bfloat16)
    ok = True
    walks = None
    for cap, on in ((graphs.MAX_GRAPHS, 1), (16, 1), (graphs.MAX_GRAPHS, 0)):
        host.CONFIG["WALK_GRAPHS"] = on
        old, graphs.MAX_GRAPHS = graphs.MAX_GRAPHS, cap
        graphs.clear()
        print(f"WALK_GRAPHS={on} MAX_GRAPHS={cap}", flush=True)
        rows = loop(model, opt, x, args.iters)
        graphs.MAX_GRAPHS = old
        steady = rows[-2:]
        print(f"  last two: {steady[0][0]:.2f} / {steady[1][0]:.2f} ms", flush=True)
        if not on:
            continue
        n = rows[-1][1]["eager"] + rows[-1][1]["replayed"]   # walks per iteration
        walks = walks or n
        last = rows[-1][1]
        captured = sum(c["captured"] for _, c in rows)
        if cap == graphs.MAX_GRAPHS and (last["captured"] or last["replayed"] < n):
            print(f"  FAIL: last iteration {last} (want {n} replayed, none captured)")
            ok = False
        if cap < graphs.MAX_GRAPHS and (captured > cap or not any(c["replayed"] for _, c in steady)):
            print(f"  FAIL: {captured} recorded with room for {cap}, or no replays at the end")
            ok = False
    print(f"walks per iteration: {walks}")
    print("WALK CACHE", "OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
