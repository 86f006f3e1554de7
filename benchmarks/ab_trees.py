"""A/B of two source trees of ``sdm_inductor`` (for changes that no ``host.CONFIG`` key
switches, such as fewer launches around the walks): alternating child processes, one per
side and round, each importing the package from its own tree and timing the no-grad
forward (``fwd``) and the autograd forward + backward (``ag``) as ``ab_cuda.py`` does.

    python benchmarks/ab_trees.py --a /tmp/old --b . --configs A,B --chunks 128 [--rounds 3]

Prints each side's median over the rounds and the median of the per-round ratios B / A.
Processes differ more than ``ab_cuda.py``'s in-process sides (allocations, clocks): use
it for effects of ~1 % or more.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def child(configs, chunks):
    import torch
    from bench_cuda import CONFIGS, autograd_step, bench, make_inputs
    from sdm_inductor.kernels import host
    import sdm_inductor
    out = {"tree": os.path.dirname(os.path.dirname(sdm_inductor.__file__))}
    for name in configs:
        bank, *rest = make_inputs(**CONFIGS[name])
        dy, dM = torch.randn_like(rest[2]), torch.randn_like(bank)
        for C in chunks:
            ag = autograd_step((bank, *rest), dy, dM, C, "none")
            fwd = lambda: host.forward(bank, *rest, C, "none", False)   # noqa: E731
            out[f"{name} {C} fwd"] = bench(fwd, rep=100)
            out[f"{name} {C} ag"] = bench(ag, rep=200)
        del bank, rest, dy, dM
        torch.cuda.empty_cache()
    print("RESULT " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="tree (folder holding sdm_inductor/) of side A")
    ap.add_argument("--b", required=True, help="tree of side B")
    ap.add_argument("--configs", default="A,B")
    ap.add_argument("--chunks", default="128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    configs, chunks = args.configs.split(","), [int(c) for c in args.chunks.split(",")]
    if args.child:
        child(configs, chunks)
        return
    times = {"A": [], "B": []}
    for r in range(args.rounds):
        for side, tree in (("A", args.a), ("B", args.b)):
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(tree), HERE,
                                                 env.get("PYTHONPATH", "")])
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--a", args.a,
                   "--b", args.b, "--configs", args.configs, "--chunks", args.chunks]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=HERE)
            line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
            if res.returncode or not line:
                sys.exit(f"side {side} round {r} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
            got = json.loads(line[-1][len("RESULT "):])
            print(f"round {r} side {side} ({got.pop('tree')}): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in got.items()), flush=True)
            times[side].append(got)
    print(f"A = {args.a}, B = {args.b}; {args.rounds} rounds (a process per side and round)")
    print("| row | A ms | B ms | B / A |\n| --- | --- | --- | --- |")
    for k in times["A"][0]:
        a = [t[k] for t in times["A"]]
        b = [t[k] for t in times["B"]]
        ratio = statistics.median(y / x for x, y in zip(a, b))
        print(f"| {k} | {statistics.median(a):.2f} | {statistics.median(b):.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
