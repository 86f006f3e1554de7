"""What ``sources.chunk_start_sources`` costs (the backward's one step before its walk when
the chunk-start rows come from the final bank and the undo log, SOURCES=1), beside the
Phase 1 it follows, at configs A and B: eager (host included) and replayed from a CUDA graph,
for the dense table form, the sorted form and the torch-ops reference (all asserted equal).

    python benchmarks/sources_cost.py [--scan]

``--scan``: the dense form's graph time for several scan tiles (``SCAN_SLOTS`` x
``SCAN_CHUNKS``) instead.
"""
from __future__ import annotations

import sys

import torch

from bench_cuda import CONFIGS, bench, bench_graph, eager_plan, make_inputs
from sdm_inductor.kernels import sources
from sdm_inductor.kernels.sources import chunk_start_sources, reference_sources


def scan_tiles():
    tiles = [(64, 16), (128, 16), (256, 16), (128, 64), (64, 64), (32, 64)]
    print("| config | C | " + " | ".join(f"{sb} x {cb}" for sb, cb in tiles) + " |")
    print("| --- | --- |" + " --- |" * len(tiles))
    for name, C in (("A", 128), ("B", 128)):
        bank, k_idx, k_val, v, beta, g, q_idx, q_val = make_inputs(**CONFIGS[name])
        S = bank.shape[0]
        pl = eager_plan(S, k_idx, k_val, beta, g, q_idx, q_val, C)
        ref = chunk_start_sources(pl, S, dense=False)
        cells = []
        for sb, cb in tiles:
            sources.SCAN_SLOTS, sources.SCAN_CHUNKS = sb, cb
            fn = lambda: chunk_start_sources(pl, S, dense=True)
            assert torch.equal(fn(), ref)
            cells.append(f"{bench_graph(fn, rep=100):.4f}")
        print(f"| {name} | {C} | " + " | ".join(cells) + " |", flush=True)


def main():
    print("| config | C | plan ms | dense ms eager / graph | sorted ms eager / graph | "
          "torch-ops form eager / graph |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, C in (("A", 64), ("A", 128), ("B", 128)):
        bank, k_idx, k_val, v, beta, g, q_idx, q_val = make_inputs(**CONFIGS[name])
        S = bank.shape[0]
        pl = eager_plan(S, k_idx, k_val, beta, g, q_idx, q_val, C)
        plan_ms = bench(lambda: eager_plan(S, k_idx, k_val, beta, g, q_idx, q_val, C), rep=100)
        ref = reference_sources(pl, S)
        cells = []
        for fn in (lambda: chunk_start_sources(pl, S, dense=True),
                   lambda: chunk_start_sources(pl, S, dense=False),
                   lambda: reference_sources(pl, S)):
            assert torch.equal(fn(), ref)
            cells.append(f"{bench(fn, rep=100):.3f} / {bench_graph(fn, rep=100):.3f}")
        print(f"| {name} | {C} | {plan_ms:.3f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    scan_tiles() if "--scan" in sys.argv else main()
