"""Is an eager call bound by its host time? For configs A and B of SDM_SPEC section 5 and
chunk sizes C, one table (ms):

- eager: ``do_bench`` of the eager call, back to back (the benchmark's figure);
- host: the time the host takes to enqueue one call (median, GPU drained before each);
- graph: ``do_bench`` of the same call replayed from a CUDA graph: the GPU's own time,
  with no host cost;
- plan host / plan graph: the same two for Phase 1 alone.

Rows: ``fwd`` (no-grad forward, in place) and ``fb`` (training forward + backward through
the ops). Usage: python benchmarks/host_bound.py [A:128 B:128 ...] [KEY=INT ...]
"""
from __future__ import annotations

import sys

import torch

from bench_cuda import CONFIGS, bench, bench_graph, eager_plan, make_inputs, set_knob
from timeline import host_and_wall


def row(name, fn):
    e = bench(fn)
    h = host_and_wall(fn, reps=7)[0]
    gr = bench_graph(fn)
    return f"{name} | {e:.3f} | {h:.3f} | {gr:.3f} | {h / e:.2f} | {gr / e:.2f}"


def main():
    cases = [a for a in sys.argv[1:] if ":" in a] or ["A:64", "A:128", "A:256", "B:128"]
    for kv in (a for a in sys.argv[1:] if "=" in a):
        set_knob(kv)
    print("| case | eager | host | graph | host / eager | graph / eager |")
    print("| --- | --- | --- | --- | --- | --- |")
    for case in cases:
        cfg, C = case.split(":")
        C = int(C)
        bank, k_idx, k_val, v, beta, g, q_idx, q_val = make_inputs(**CONFIGS[cfg])
        rest = (k_idx, k_val, v, beta, g, q_idx, q_val)
        work = bank.clone()
        dy, dM = torch.randn_like(v), torch.randn_like(bank)

        def fwd():
            torch.ops.sdm.triton_write_read_(work, *rest, C)

        def fb():
            y, M, rows, scales = torch.ops.sdm.triton_write_read(bank, *rest, C, "none", True)
            torch.ops.sdm.triton_write_read_backward(dy, dM, M, rows, scales, *rest, C, "none",
                                                     False)

        def plan():
            eager_plan(bank.shape[0], k_idx, k_val, beta, g, q_idx, q_val, C)

        print(row(f"{cfg} C={C} fwd", fwd))
        print(row(f"{cfg} C={C} plan", plan))
        print(row(f"{cfg} C={C} fb", fb))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
