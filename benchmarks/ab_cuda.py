"""Interleaved A/B of two ``kernels.host.CONFIG`` settings on one input set, for effects
smaller than the run-to-run spread of ``bench_variants.py`` (one variant after another):

    python benchmarks/ab_cuda.py --config A --chunks 64,128 --a PDL=1 --b PDL=0 [--rounds 5]

A key ``module.NAME`` sets a constant of ``sdm_inductor.kernels.module`` instead (e.g.
``phase1.FLAT_SORT=0``); ``--plan`` adds a row for Phase 1 (``phase1.plan``) alone.

Each round times A then B (no-grad forward and forward + backward, medians of
``triton.testing.do_bench``); the table gives each side's median over the rounds and
the median of the per-round ratios B / A (``--c`` / ``--d``: a third and fourth side,
each against A). ``--graph``: each call replayed from a CUDA graph, so the host's time
(which can reach the GPU's, NOTES.md run 17) does not enter.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from bench_cuda import CONFIGS, autograd_step, bench, bench_graph, eager_plan, make_inputs
from sdm_inductor.kernels import host


def parse(kvs):
    return {k: int(v) for k, v in (kv.split("=", 1) for kv in kvs)}


def apply(keep_config, keep_modules, over):
    """CONFIG = keep_config with ``over``'s plain keys; module constants = theirs."""
    host.CONFIG.clear()
    host.CONFIG.update(keep_config, **{k: v for k, v in over.items() if "." not in k})
    for (mod, name), value in keep_modules.items():
        setattr(mod, name, over.get(f"{mod.__name__.rsplit('.', 1)[1]}.{name}", value))


def module_keys(sides):
    """(module, NAME) -> current value, for every ``module.NAME`` key of either side."""
    import importlib
    keys = {}
    for over in sides.values():
        for k in over:
            if "." in k:
                mod_name, name = k.rsplit(".", 1)
                mod = importlib.import_module(f"sdm_inductor.kernels.{mod_name}")
                keys[(mod, name)] = getattr(mod, name)
    return keys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="A")
    ap.add_argument("--chunks", default="64,128")
    ap.add_argument("--a", nargs="*", default=[])
    ap.add_argument("--b", nargs="*", default=[])
    ap.add_argument("--c", nargs="*", default=None, help="optional third side")
    ap.add_argument("--d", nargs="*", default=None, help="optional fourth side")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--rows", default="fwd,fb",
                    help="which of fwd (no-grad), fb (the ops), ag (autograd) to time")
    ap.add_argument("--graph", action="store_true",
                    help="time each call replayed from a CUDA graph: the GPU's time alone, "
                         "free of the host's (rows plan, fwd, fb)")
    args = ap.parse_args()
    if args.graph and "ag" in args.rows.split(","):
        ap.error("--graph times the ops' calls; autograd's row (ag) is not captured")
    timer = bench_graph if args.graph else bench
    bank, *rest = make_inputs(**CONFIGS[args.config])
    dy, dM = torch.randn_like(rest[2]), torch.randn_like(bank)
    keep = dict(host.CONFIG)
    sides = {"A": parse(args.a), "B": parse(args.b)}
    sides.update({k.upper(): parse(v) for k, v in (("c", args.c), ("d", args.d)) if v is not None})
    keep_mod = module_keys(sides)
    others = [k for k in sides if k != "A"]
    print(f"config {args.config}; " + ", ".join(f"{k} = {v}" for k, v in sides.items())
          + f"; {args.rounds} rounds")
    print("| C | what | A ms | " + " | ".join(f"{k} ms | {k} / A" for k in others) + " |\n|"
          + " --- |" * (3 + 2 * len(others)))
    for C in (int(c) for c in args.chunks.split(",")):
        def fwd():
            return host.forward(bank, *rest, C, "none", False)

        def fb():
            _, rows, sc = host.forward(bank, *rest, C, "none", True)
            return host.backward(dy, dM, bank, rows, sc, *rest, C, "none", False)
        def plan():
            return eager_plan(bank.shape[0], *rest[:2], *rest[3:], C)
        rows = {"plan": ("plan", plan, 100), "fwd": ("no-grad fwd", fwd, 100),
                "fb": ("fwd+bwd", fb, 200),
                "ag": ("fwd+bwd autograd", autograd_step((bank, *rest), dy, dM, C, "none"), 200)}
        asked = (["plan"] if args.plan else []) + args.rows.split(",")
        for what, fn, rep in (rows[k] for k in asked):
            times = {k: [] for k in sides}
            for _ in range(args.rounds):
                for side, over in sides.items():
                    apply(keep, keep_mod, over)
                    times[side].append(timer(fn, rep=rep))
            cells = []
            for k in others:   # each side's median, and the median of its per-round ratios
                ratio = statistics.median(b / a for a, b in zip(times["A"], times[k]))
                cells.append(f"{statistics.median(times[k]):.2f} | {ratio:.3f}")
            print(f"| {C} | {what} | {statistics.median(times['A']):.2f} | "
                  + " | ".join(cells) + " |", flush=True)
    apply(keep, keep_mod, {})


if __name__ == "__main__":
    main()
