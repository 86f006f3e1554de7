"""Where the time goes (config A of docs/spec.md section 5, or ``--config=B``): per-kernel CUDA
time from torch.profiler for the no-grad forward and for forward + backward through the
triton ops, and Phase 1 alone. Usage:

    python benchmarks/tools/profile_cuda.py [C] [--config=B] [KEY=INT ...]

(knobs as in ``bench_cuda.set_knob``; ``PDL=0`` gives each kernel's own time, without the
overlap of a programmatic launch's wait; ``WALK_GRAPHS=0`` keeps the walks' launches
visible to the profiler instead of graph replays.)
"""
from __future__ import annotations

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench_cuda
from bench_cuda import CONFIGS, bench, make_inputs, set_knob  # noqa: E402
from sdm_inductor.kernels import phase1  # noqa: E402


def main():
    for kv in (a for a in sys.argv[1:] if "=" in a and not a.startswith("--")):
        set_knob(kv)
    nums = [a for a in sys.argv[1:] if not a.startswith("--") and "=" not in a]
    C = int(nums[0]) if nums else 64
    name = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--config=")), "A")
    bank, k_idx, k_val, v, beta, g, q_idx, q_val = make_inputs(**CONFIGS[name])
    rest = (k_idx, k_val, v, beta, g, q_idx, q_val)
    work = bank.clone()
    dy, dM = torch.randn_like(v), torch.randn_like(bank)

    def fwdbwd():
        y, M, rows, scales, _ = torch.ops.sdm.triton_write_read(bank, *rest, C, "none", True)
        torch.ops.sdm.triton_write_read_backward(dy, dM, M, rows, scales, *rest, C, "none", False,
                                                 [])

    torch.ops.sdm.triton_write_read_(work, *rest, C)
    fwdbwd()
    torch.cuda.synchronize()
    for label, fn in (("no-grad forward", lambda: torch.ops.sdm.triton_write_read_(work, *rest, C)),
                      ("forward + backward", fwdbwd)):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        print(f"== {label}, config {name}, C={C}: per-kernel CUDA time over 3 calls")
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18,
                                        max_name_column_width=60))
    plan_ms = bench(lambda: phase1.plan(bank.shape[0], k_idx, k_val, beta, g, q_idx, q_val, C))
    print(f"phase 1 (plan) alone: {plan_ms:.3f} ms")


if __name__ == "__main__":
    main()
