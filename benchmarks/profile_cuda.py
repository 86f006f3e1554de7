"""Where the time goes (config A of SDM_SPEC section 5, or ``--config=B``): per-kernel CUDA
time from torch.profiler, and the Phase 2 forward kernel alone with passes switched off
and under other launch parameters. Usage:
python benchmarks/profile_cuda.py [C] [--tables-only] [KEY=INT ...] (knobs as in
``bench_cuda.set_knob``; ``PDL=0`` gives each kernel's own time, without the overlap of a
programmatic launch's wait)
(``SDM_INDUCTOR_WALK=step`` profiles the step walk's launches.)
"""
from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from bench_cuda import CONFIGS, bench, make_inputs, set_knob
from sdm_inductor.kernels import host, phase1
from sdm_inductor.kernels.launch import pow2
from sdm_inductor.kernels.phase2 import _forward_kernel


def forward_kernel_only(bank, pl, v, C, BD=16, EW=8, WARPS=8, NG=512, TB=64, PASSES=7):
    P, T, hd = pl.P, pl.T, bank.shape[1]
    CP = pow2(C)
    NCB = -(-hd // BD)
    out = torch.empty(P, T, hd, dtype=bank.dtype, device=bank.device)
    scratch = torch.empty(P * NCB * 3 * CP * BD, dtype=torch.float32, device=bank.device)
    ru = pl.runs

    def run():
        _forward_kernel[(P, NCB)](bank, pl.slot, pl.ev, pl.X, pl.QKX, v, pl.beta, out, ru.slot,
                                  ru.length, ru.decay, ru.tok, ru.coef, scratch, bank, P, T, hd,
                                  pl.NC, C=C, W=pl.W, R=pl.R, BD=BD, TB=min(TB, CP), EW=EW,
                                  NG=NG, CP=CP, SAVE=False, PREC="tf32", PASSES=PASSES,
                                  num_warps=WARPS)
    return bench(run, rep=200)


def main():
    for kv in (a for a in sys.argv[1:] if "=" in a and not a.startswith("--")):
        set_knob(kv)
    nums = [a for a in sys.argv[1:] if not a.startswith("--") and "=" not in a]
    C = int(nums[0]) if nums else 64
    name = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--config=")), "A")
    cfg = CONFIGS[name]
    bank, k_idx, k_val, v, beta, g, q_idx, q_val = make_inputs(**cfg)
    rest = (k_idx, k_val, v, beta, g, q_idx, q_val)
    work = bank.clone()
    dy, dM = torch.randn_like(v), torch.randn_like(bank)

    def fwdbwd():
        y, M, rows, scales = torch.ops.sdm.triton_write_read(bank, *rest, C, "none", True)
        torch.ops.sdm.triton_write_read_backward(dy, dM, M, rows, scales, *rest, C, "none", False)

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
    if "--tables-only" in sys.argv:
        return
    pl = phase1.plan(bank.shape[0], k_idx, k_val, beta, g, q_idx, q_val, C)
    for passes in (7, 1, 2, 4, 0):
        ms = forward_kernel_only(work, pl, v, C, PASSES=passes)
        print(f"forward kernel PASSES={passes}: {ms:.3f} ms ({ms / pl.NC * 1e3:.1f} us per chunk)")
    for kw in (dict(EW=4, WARPS=4), dict(EW=16, WARPS=8), dict(EW=8, WARPS=4), dict(BD=32),
               dict(NG=1024), dict(EW=4, WARPS=8)):
        ms = forward_kernel_only(work, pl, v, C, **kw)
        print(f"forward kernel {kw}: {ms:.3f} ms")


if __name__ == "__main__":
    main()
