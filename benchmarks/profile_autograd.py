"""Where the training step through ``sdm::write_read`` and autograd spends time beside the
triton ops called directly (config A): the pieces timed alone, then a profile of one
autograd step (CUDA kernels by total time).

Usage: python benchmarks/profile_autograd.py [C] [ROWS]
"""
from __future__ import annotations

import sys

import torch

from bench_cuda import CONFIGS, autograd_step, bench, make_inputs
from sdm_inductor import ops


def main(C: int = 128, rows: int = 25):   # rows: of the profile's table
    ins = make_inputs(**CONFIGS["A"])
    bank, k_idx, k_val, v, beta, g, q_idx, q_val = ins
    rest = (k_idx, k_val, v, beta, g, q_idx, q_val)
    sph = bank.shape[0] // k_idx.shape[0]
    dy, dM = torch.randn_like(v), torch.randn_like(bank)
    ops.CHECK_INDICES["cuda"] = False
    rows = {
        "repeat count": lambda: ops.count_repeated_write_slots(k_idx),
        "triton_write_read (save)": lambda: torch.ops.sdm.triton_write_read(bank, *rest, C,
                                                                            "none", True),
        "sdm::write_read (save, no autograd)": lambda: torch.ops.sdm.write_read(
            bank, *rest, C, sph, False, "none"),
    }
    y, M, r, s = torch.ops.sdm.triton_write_read(bank, *rest, C, "none", True)
    rows["triton_write_read_backward"] = lambda: torch.ops.sdm.triton_write_read_backward(
        dy, dM, M, r, s, *rest, C, "none", False)
    rows["sdm::write_read_backward"] = lambda: torch.ops.sdm.write_read_backward(
        dy, dM, M, r, s, *rest, C, "none", False)
    step = autograd_step(ins, dy, dM, C, "none")
    rows["autograd step"] = step
    for name, fn in rows.items():
        print(f"{name}: {bench(fn, rep=100):.3f} ms", flush=True)
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
