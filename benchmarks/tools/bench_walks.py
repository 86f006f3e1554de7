"""Walks against each other over a grid of shapes (``WALK`` forced on eager calls),
interleaved per shape: the data a per-call choice of walk would rest on.

    python benchmarks/tools/bench_walks.py [--rounds 2] [--grid | --spec A,B] [--chunk 128]
        [--walks step,column]

Prints, per shape (P streams, T tokens, hd columns, slots per stream, W = R, C), the
no-grad forward and the forward + backward through autograd of each walk (medians of the
rounds), each over the first walk's, and the walk an eager call with ``WALK="auto"`` takes
(``launch.column_suits``, whose rule was fitted on ``--grid``'s first 27 shapes, step
against column). ``--walks queue,column`` compares what traced calls can take (their
forward + backward rows both run the reverse column walk backward).

A walk may carry launch parameters: ``queue+QUEUE_DB_TILES=2+QUEUE_TOKENS_B=1`` is the
queue walk with those ``CONFIG`` entries, so ``--spec A,B --walks
step,queue,queue+QUEUE_DB_TILES=2`` measures a knob against the shipped form in one
process. Walks that differ only in such parameters must give the same outputs and
gradients bitwise (the orders of their sums do not change); each is checked against the
first of its walk, and a difference is printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench_cuda
from bench_cuda import CONFIGS, autograd_step, bench, make_inputs
from sdm_inductor.kernels import host
from sdm_inductor.kernels.runtime.launch import column_suits

SHAPES = [  # P, T, hd, sph, W(=R), C
    (16, 2048, 128, 4096, 32, 64),    # the 4-layer model of bench_compile.py
    (64, 1024, 64, 4096, 32, 64),
    (32, 512, 128, 2048, 16, 64),
    (8, 2048, 512, 16384, 64, 64),
    (4, 4096, 256, 16384, 64, 64),
    (2, 8192, 768, 36864, 64, 128),   # config A
]

# --grid: columns x W x streams at 32K tokens in all, C = 64 (the data a rule is fitted on),
# then shapes outside it (the check of the rule: not used to make it)
GRID = [(P, 32768 // P, hd, 16384, W, 64)
        for hd in (64, 128, 256) for W in (16, 32, 64) for P in (4, 16, 64)]
HELD_OUT = [
    (8, 4096, 96, 8192, 24, 64),
    (32, 1024, 192, 8192, 48, 64),
    (2, 8192, 128, 16384, 32, 64),
    (128, 256, 64, 2048, 16, 64),
    (16, 2048, 128, 4096, 32, 128),
    (8, 2048, 384, 16384, 32, 128),
]


def variant(spec: str) -> tuple[str, dict]:
    """``"queue+KEY=INT+..."`` -> ``("queue", {KEY: INT, ...})``; keys must be ``CONFIG``'s
    (a misspelt one would change nothing)."""
    walk, *sets = spec.split("+")
    over = {}
    for kv in sets:
        key, value = kv.split("=")
        if key not in host.CONFIG:
            raise SystemExit(f"no key {key} in kernels.host.CONFIG")
        over[key] = int(value)
    return walk, over


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--grid", action="store_true", help="GRID then HELD_OUT instead of SHAPES")
    ap.add_argument("--spec", help="the spec's configs instead of SHAPES, e.g. A,B")
    ap.add_argument("--chunk", type=int, default=128, help="C of the --spec configs")
    ap.add_argument("--walks", default="step,column",
                    help="WALK values, each maybe with +KEY=INT launch parameters; the first "
                         "is the base")
    args = ap.parse_args()
    walks = args.walks.split(",")
    forms = {w: variant(w) for w in walks}
    if args.spec:
        shapes = [(c["P"], c["T"], c["hd"], c["sph"], c["W"], args.chunk)
                  for c in (CONFIGS[n] for n in args.spec.split(","))]
    else:
        shapes = GRID + HELD_OUT if args.grid else SHAPES
    names = " / ".join(walks)
    print(f"| P | T | hd | sph | W=R | C | no-grad {names} ms | ratios | fwd+bwd {names} ms "
          "| ratios | auto |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    keep = dict(host.CONFIG)
    for P, T, hd, sph, W, C in shapes:
        bank, *rest = make_inputs(P=P, T=T, hd=hd, sph=sph, W=W, R=W)
        dy, dM = torch.randn_like(rest[2]), torch.randn_like(bank)

        def fwd():
            return host.forward(bank, *rest, C, "none", False)
        ag = autograd_step((bank, *rest), dy, dM, C, "none")

        def use(w):   # CONFIG as shipped, then the walk and its parameters
            host.CONFIG.update(keep, WALK=forms[w][0], **forms[w][1])
        first = {}
        for w in walks:   # a walk's forms against its first: bitwise (also compiles each)
            use(w)
            out = [x.clone() for x in ag()]
            ref = first.setdefault(forms[w][0], (w, out))
            if not all(torch.equal(a, b) for a, b in zip(ref[1], out)):
                print(f"{w}: outputs or gradients differ from {ref[0]}'s", flush=True)
        del first
        t = {(w, k): [] for w in walks for k in ("fwd", "ag")}
        for _ in range(args.rounds):
            for walk in walks:
                use(walk)
                t[(walk, "fwd")].append(bench(fwd, rep=50))
                t[(walk, "ag")].append(bench(ag, rep=100))
        m = {k: statistics.median(v) for k, v in t.items()}
        cells = []
        for k in ("fwd", "ag"):
            cells.append(" / ".join(f"{m[w, k]:.3f}" for w in walks))
            cells.append(" / ".join(f"{m[w, k] / m[walks[0], k]:.3f}" for w in walks[1:]))
        print(f"| {P} | {T} | {hd} | {sph} | {W} | {C} | " + " | ".join(cells) + " | "
              f"{'column' if column_suits(P, W, W, C, hd) else 'step'} |", flush=True)
    host.CONFIG.update(keep)


if __name__ == "__main__":
    main()
