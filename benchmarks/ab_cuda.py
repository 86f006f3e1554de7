"""Interleaved A/B of two ``kernels.host.CONFIG`` settings on one input set, for effects
smaller than the run-to-run spread of ``bench_variants.py`` (one variant after another):

    python benchmarks/ab_cuda.py --config A --chunks 64,128 --a PDL=1 --b PDL=0 [--rounds 5]

Each round times A then B (no-grad forward and forward + backward, medians of
``triton.testing.do_bench``); the table gives each side's median over the rounds and
the median of the per-round ratios B / A.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from bench_cuda import CONFIGS, bench, make_inputs
from sdm_inductor.kernels import host


def parse(kvs):
    return {k: int(v) for k, v in (kv.split("=", 1) for kv in kvs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="A")
    ap.add_argument("--chunks", default="64,128")
    ap.add_argument("--a", nargs="*", default=[])
    ap.add_argument("--b", nargs="*", default=[])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    bank, *rest = make_inputs(**CONFIGS[args.config])
    dy, dM = torch.randn_like(rest[2]), torch.randn_like(bank)
    keep = dict(host.CONFIG)
    sides = {"A": parse(args.a), "B": parse(args.b)}
    print(f"config {args.config}; A = {sides['A']}, B = {sides['B']}; {args.rounds} rounds")
    print("| C | what | A ms | B ms | B / A (median of rounds) |\n| --- | --- | --- | --- | --- |")
    for C in (int(c) for c in args.chunks.split(",")):
        def fwd():
            return host.forward(bank, *rest, C, "none", False)

        def fb():
            _, rows, sc = host.forward(bank, *rest, C, "none", True)
            return host.backward(dy, dM, bank, rows, sc, *rest, C, "none", False)
        for what, fn, rep in (("no-grad fwd", fwd, 100), ("fwd+bwd", fb, 200)):
            times = {"A": [], "B": []}
            for _ in range(args.rounds):
                for side, over in sides.items():
                    host.CONFIG.clear()
                    host.CONFIG.update(keep, **over)
                    times[side].append(bench(fn, rep=rep))
            ratio = statistics.median(b / a for a, b in zip(times["A"], times["B"]))
            print(f"| {C} | {what} | {statistics.median(times['A']):.2f} | "
                  f"{statistics.median(times['B']):.2f} | {ratio:.3f} |", flush=True)
    host.CONFIG.clear()
    host.CONFIG.update(keep)


if __name__ == "__main__":
    main()
