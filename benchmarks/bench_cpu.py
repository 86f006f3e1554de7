"""CPU op vs the eager token loop.

    python benchmarks/bench_cpu.py [--T 1024] [--hd 64] [--slots 4096] [--W 16] [--reps 3]

Prints a table: forward and forward+backward for the eager token loop of spec
section 1 (``sdm_inductor.reference``) and the chunked CPU op, fp32, one stream.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import sdm_inductor
from sdm_inductor.reference import sdm_write_read_reference


def make_inputs(T, hd, slots, W, R, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k_idx = torch.rand(1, T, slots, generator=gen).topk(W, dim=-1).indices  # distinct per token
    q_idx = torch.randint(0, slots, (1, T, R), generator=gen)
    k_val = torch.randn(1, T, W, generator=gen).softmax(-1)
    q_val = torch.randn(1, T, R, generator=gen).softmax(-1)
    v = torch.randn(1, T, hd, generator=gen)
    beta = torch.rand(1, T, generator=gen)
    g = -torch.rand(1, T, 1, generator=gen) * 0.1
    bank = torch.randn(slots, hd, generator=gen) * 0.1
    return bank, k_idx, k_val, v, beta, g, q_idx, q_val


def timed(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--hd", type=int, default=64)
    ap.add_argument("--slots", type=int, default=4096)
    ap.add_argument("--W", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    inputs = make_inputs(args.T, args.hd, args.slots, args.W, args.W)
    float_ids = (0, 2, 3, 4, 5, 7)

    def leaves():
        return [x.clone().requires_grad_(i in float_ids) for i, x in enumerate(inputs)]

    def loop_fwd():
        with torch.no_grad():
            sdm_write_read_reference(*inputs)

    def loop_fwd_bwd():
        xs = leaves()
        y, M = sdm_write_read_reference(*xs)
        (y.square().sum() + M.square().sum()).backward()

    def op_fwd():
        with torch.no_grad():
            sdm_inductor.write_read(*inputs, chunk_size=args.chunk)

    def op_fwd_bwd():
        xs = leaves()
        y, M = sdm_inductor.write_read(*xs, chunk_size=args.chunk)
        (y.square().sum() + M.square().sum()).backward()

    rows = []
    for name, loop, op in (("forward (no grad)", loop_fwd, op_fwd),
                           ("forward + backward", loop_fwd_bwd, op_fwd_bwd)):
        t_loop, t_op = timed(loop, args.reps), timed(op, args.reps)
        rows.append((name, t_loop * 1e3, t_op * 1e3, t_loop / t_op))
    print(f"T={args.T} hd={args.hd} slots={args.slots} W=R={args.W} C={args.chunk} fp32, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"{'':22s} {'token loop ms':>14s} {'sdm op ms':>10s} {'speed-up':>9s}")
    for name, a, b, s in rows:
        print(f"{name:22s} {a:14.1f} {b:10.2f} {s:8.1f}x")


if __name__ == "__main__":
    main()
