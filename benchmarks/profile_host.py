"""Host time of the eager calls by function (cProfile), config A of SDM_SPEC section 5:

    python benchmarks/profile_host.py [C] [WINDOW_TOKENS]

Where the host's time goes when a call is bound by launches rather than by the GPU.
"""
from __future__ import annotations

import cProfile
import pstats
import sys

import torch

from bench_cuda import CONFIGS, make_inputs
from sdm_inductor.kernels import host


def main():
    C = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    host.CONFIG["WINDOW_TOKENS"] = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    bank, *rest = make_inputs(**CONFIGS["A"])
    v = rest[2]
    dy, dM = torch.randn_like(v), torch.randn_like(bank)

    def fwd():
        return host.forward(bank, *rest, C, "none", False)

    def fb():
        _, rows, sc = host.forward(bank, *rest, C, "none", True)
        return host.backward(dy, dM, bank, rows, sc, *rest, C, "none", False)
    for name, fn in (("no-grad forward", fwd), ("forward + backward", fb)):
        fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(3):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        print(f"\n## {name}, C={C}, WINDOW_TOKENS={host.CONFIG['WINDOW_TOKENS']} (3 calls)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
