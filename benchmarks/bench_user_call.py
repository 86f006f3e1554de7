"""The op as a user's step calls it: ``sdm_inductor.write_read`` with its host-side index
checks, one call then a sync (how a step's wall time is paid), against back-to-back calls
(``triton.testing.do_bench``: the host queues ahead) and against the checks switched off.

    python benchmarks/bench_user_call.py [--configs A,B] [--chunk 128] [--reps 20]

The checks read the indices, so each one is a host sync: the host cannot queue the next
kernels while it waits, and the launch latency of what follows is exposed. Also timed
alone: ``validation.check_indices`` against the windowed form it replaced (four windows,
one sync per window and index tensor at A).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import triton.testing

import sdm_inductor
from sdm_inductor import ops, validation

from bench_cuda import CONFIGS, make_inputs


def synced_ms(fn, reps: int) -> float:
    """Median wall time of one call followed by a sync (ms)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def windowed_check(S, P, sph, k_idx, q_idx):
    """The index check before session 10: per window and index tensor, an int64 copy, a
    mask and ``bool(any)``, one host sync each."""
    for idx in (k_idx, q_idx):
        for _, win in validation.token_windows(idx):
            base = torch.arange(P, device=idx.device).view(P, 1, 1) * sph
            local = win.long() - base
            if bool(((local < 0) | (local >= sph)).any()):
                raise ValueError("out of range")


def run(name: str, C: int, reps: int):
    cfg = CONFIGS[name]
    bank, k_idx, k_val, v, beta, g, q_idx, q_val = make_inputs(**cfg)
    sph = cfg["sph"]
    leaves = [x.detach().clone().requires_grad_() for x in (bank, k_val, v, beta, g, q_val)]
    dy = torch.randn_like(v)

    def nograd():
        with torch.no_grad():
            sdm_inductor.write_read(bank, k_idx, k_val, v, beta, g, q_idx, q_val,
                                    chunk_size=C, slots_per_stream=sph)

    def train():
        lb, lk, lv, lbeta, lg, lq = leaves
        y, M = sdm_inductor.write_read(lb, k_idx, lk, lv, lbeta, lg, q_idx, lq, chunk_size=C,
                                       slots_per_stream=sph)
        torch.autograd.backward((y, M), (dy, torch.ones_like(M)))
        for x in leaves:
            x.grad = None

    S, P = bank.shape[0], k_idx.shape[0]
    checks = {
        "check_indices": lambda: validation.check_indices(S, P, sph, k_idx, q_idx),
        "windowed (before)": lambda: windowed_check(S, P, sph, k_idx, q_idx),
    }
    for label, fn in checks.items():
        print(f"{name} {label:<22} synced {synced_ms(fn, reps):7.3f} ms")
    for label, fn in (("no-grad forward", nograd), ("forward + backward", train)):
        row = []
        for on in (True, False):
            ops.CHECK_INDICES["cuda"] = on
            row.append((synced_ms(fn, reps), triton.testing.do_bench(fn, warmup=50, rep=300)))
        ops.CHECK_INDICES["cuda"] = True
        (s_on, b_on), (s_off, b_off) = row
        print(f"{name} C={C} {label:<19} checks on: synced {s_on:7.3f} ms, back-to-back "
              f"{b_on:7.3f} ms | off: synced {s_off:7.3f} ms, back-to-back {b_off:7.3f} ms",
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="A,B")
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for name in args.configs.split(","):
        run(name, args.chunk, args.reps)


if __name__ == "__main__":
    main()
