"""One training call (forward with the undo log, then the backward) of a config, for
Nsight Compute: a warm-up call compiles every kernel, then the profiled call runs between
``cudaProfilerStart`` / ``cudaProfilerStop``, so ``ncu --profile-from-start off`` sees
only that call's kernels:

    ncu --profile-from-start off --clock-control none -k regex:_step_gather \\
        --launch-skip 8 --launch-count 1 python benchmarks/tools/ncu_step.py A 128 PDL=0

(``PDL=0``: with programmatic dependent launch a kernel's time includes its wait for the
launch before it.)
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench_cuda
from bench_cuda import CONFIGS, make_inputs, set_knob
from sdm_inductor.kernels import host


def main():
    name, C = sys.argv[1], int(sys.argv[2])
    for kv in sys.argv[3:]:
        set_knob(kv)
    bank, k_idx, k_val, v, beta, g, q_idx, q_val = make_inputs(**CONFIGS[name])
    dy, dM = torch.randn_like(v), torch.randn_like(bank)

    def call():
        _, rows, sc = host.forward(bank, k_idx, k_val, v, beta, g, q_idx, q_val, C, "none", True)
        return host.backward(dy, dM, bank, rows, sc, k_idx, k_val, v, beta, g, q_idx, q_val,
                             C, "none", False)
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
