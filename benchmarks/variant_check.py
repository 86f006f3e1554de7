"""Does a launch-shape variant compute what the defaults compute? The no-grad forward at
configs A and B of SDM_SPEC section 5 under ``host.CONFIG``'s defaults and under the
variant (``KEY=INT`` pairs, ``module.NAME=INT`` for a kernels module's constant): the
readings and the final bank, bitwise or their largest difference relative to the
largest value (an A/B of ``ab_cuda.py`` times a variant but does not check it). Usage:

    python benchmarks/variant_check.py [--chunks 128] [--configs A,B] KEY=INT ...
"""
from __future__ import annotations

import argparse

import torch

from ab_cuda import apply, module_keys, parse
from bench_cuda import CONFIGS, make_inputs, set_knob
from sdm_inductor.kernels import host


def no_grad_forward(ins, C):
    bank, *rest = ins
    work = bank.clone()
    y = host.forward(work, *rest, C, "none", False)[0]
    torch.cuda.synchronize()
    return y, work


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", default="128")
    ap.add_argument("--configs", default="A,B")
    ap.add_argument("knobs", nargs="+")
    a = ap.parse_args()
    keep = dict(host.CONFIG)
    mods = module_keys({"variant": parse(a.knobs)})   # the module constants' defaults
    bad = 0
    for cfg in a.configs.split(","):
        ins = make_inputs(**CONFIGS[cfg])
        for C in (int(c) for c in a.chunks.split(",")):
            apply(keep, mods, {})   # the defaults, CONFIG and module constants
            want = no_grad_forward(ins, C)
            for kv in a.knobs:   # (set_knob refuses a misspelt knob)
                set_knob(kv)
            got = no_grad_forward(ins, C)
            for name, x, y in zip(("readings", "final bank"), got, want):
                if torch.equal(x, y):
                    print(f"config {cfg} C={C} {name}: bitwise equal")
                    continue
                rel = ((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
                bad += rel > 1e-2   # bf16: a sum in another order moves the last bits only
                print(f"config {cfg} C={C} {name}: max difference {rel:.2e} of the largest")
    apply(keep, mods, {})
    print("variant_check:", "ok" if not bad else f"{bad} outputs differ beyond bf16 rounding")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
