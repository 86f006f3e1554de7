"""How soon an eager training loop's step walks replay from walk graphs (``kernels/graphs.py``):
the loop of ``tests/test_cuda.py::test_walk_graph_replays_are_bitwise_the_launches``
(same shapes and leaves, each result dropped), run for more steps, printing per step the
walks run eagerly / captured / replayed and, for a walk that did not replay, which
arguments of its key moved since its previous call (by how many bytes).

    python benchmarks/replay_loop.py [--steps 16] [--dtypes fp32,bf16] [--no-empty-cache]
"""
from __future__ import annotations

import argparse
import collections

import torch

import sdm_inductor  # noqa: F401
from sdm_inductor.kernels import host
from sdm_inductor.kernels.runtime import graphs
from sdm_inductor.testing import FLOAT_INPUTS, make_inputs


def moved(keys) -> str:
    diffs = graphs.differences(*keys)
    ints = [(p, a, b) for p, a, b in diffs if isinstance(a, int) and isinstance(b, int)]
    deltas = collections.Counter(b - a for _, a, b in ints)
    return f"{len(diffs)} args differ; pointer moves {dict(deltas.most_common(4))}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--no-empty-cache", action="store_true")
    args = ap.parse_args()
    host.CONFIG["WALK"] = "step"
    for name in args.dtypes.split(","):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        ins = make_inputs(dtype=dtype, device="cuda", P=2, T=300, W=16, R=8, hd=96,
                          slots_per_stream=256, per_write_gate=True, repeats=True, seed=1234)
        dy = torch.randn(2, 300, 96, device="cuda").to(dtype)
        dM = torch.randn_like(ins.bank)
        leaves = ins.leaves()

        def step():
            y, M, _, _ = torch.ops.sdm.write_read(*leaves, 64, 256, False, "none", False, True)
            grads = torch.autograd.grad((y, M), [leaves[i] for i in FLOAT_INPUTS], (dy, dM))
            return [y.detach(), M.detach(), *grads]

        host.CONFIG["WALK_GRAPHS"] = 0
        want = step()
        host.CONFIG["WALK_GRAPHS"] = 1
        graphs.clear()
        torch.cuda.synchronize()
        if not args.no_empty_cache:
            torch.cuda.empty_cache()
        print(f"{name}:", flush=True)
        for it in range(args.steps):
            before = collections.Counter(graphs.stats)
            got = step()
            same = all(torch.equal(a, b) for a, b in zip(got, want))
            del got
            d = collections.Counter(graphs.stats)
            d.subtract(before)
            counts = " ".join(f"{k[0][:3]}/{k[1][:3]} {v}" for k, v in sorted(d.items()) if v)
            notes = [f"{k[0]}: {moved(keys)}" for k, keys in graphs.recent.items()
                     if len(keys) == 2 and keys[0] != keys[1] and d["replayed", k[0]] == 0]
            print(f"  step {it:2d}: bitwise {same}  {counts}", flush=True)
            for n in notes:
                print(f"           {n}", flush=True)


if __name__ == "__main__":
    main()
