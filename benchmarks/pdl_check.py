"""Race check of the programmatic-launch modes (``host.CONFIG["PDL"]``, NOTES.md run 14):
a training call (forward + backward through autograd) at configs A and B of SDM_SPEC
section 5 must give bitwise the same readings, final bank and gradients under ``PDL=2``
and ``PDL=3`` as under ``PDL=1`` (every launch waits for the one before it before any
load). The kernels sum in the same order in every mode, so any difference is a launch
reading or writing too early. Usage (CUDA, sm_90):

    python benchmarks/pdl_check.py [--reps 3] [--chunks 64,128] [--modes none,fp8]
"""
from __future__ import annotations

import argparse

import torch

from bench_cuda import CONFIGS, autograd_step, make_inputs
from sdm_inductor.kernels import host


def train_call(ins, dy, dM, C, mode):
    out = autograd_step(ins, dy, dM, C, mode)()
    torch.cuda.synchronize()
    return [x.detach() for x in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunks", default="64,128")
    ap.add_argument("--modes", default="none")
    a = ap.parse_args()
    names = ("readings", "final bank", "grad bank", "grad k_val", "grad v", "grad beta",
             "grad g", "grad q_val")
    bad = 0
    for cfg in ("A", "B"):
        ins = make_inputs(**CONFIGS[cfg])
        gen = torch.Generator(device="cuda").manual_seed(5)
        dy = torch.randn(ins[3].shape, device="cuda", generator=gen).to(ins[3].dtype)
        dM = torch.randn(ins[0].shape, device="cuda", generator=gen).to(ins[0].dtype)
        for C in (int(c) for c in a.chunks.split(",")):
            for mode in a.modes.split(","):
                host.CONFIG["PDL"] = 1
                want = train_call(ins, dy, dM, C, mode)
                for pdl in (2, 3):
                    host.CONFIG["PDL"] = pdl
                    for rep in range(a.reps):
                        got = train_call(ins, dy, dM, C, mode)
                        diff = [n for n, x, y in zip(names, got, want) if not torch.equal(x, y)]
                        bad += bool(diff)
                        print(f"config {cfg} C={C} mode={mode} PDL={pdl} rep {rep}: "
                              + ("bitwise equal to PDL=1" if not diff else f"DIFFERS: {diff}"))
    print("pdl_check:", "all equal" if not bad else f"{bad} calls differ")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
