"""The memory time of a no-grad forward's necessary row traffic, measured rather than
computed: how close can any step walk come to the spec's bandwidth floor on this GPU?

``bench_cuda.py``'s floor divides the forward's bytes (``2 x distinct written rows + C R
read rows`` per chunk, spec section 5) by the copy bandwidth. But those bytes are random
row segments, not a stream: this script moves exactly them with the simplest Triton
kernels that can (no Phase 1, no products, no gates), on the benchmark's own inputs, and
times them replayed from a CUDA graph (the GPU's time alone):

- ``gather W+R``: one program per (token, 128 columns) sums its ``W + R`` weighted
  chunk-start row segments, as the step walk's gather launch does (``step.py``);
- ``gather R``: the read rows alone;
- ``rmw``: read and rewrite each distinct written row of a chunk once (the write launch);

as one launch over all chunks (no step boundaries: the random-access ceiling) and as
launches per chunk in chunk order (the dependency any exact walk has). ``gather R + rmw``
per chunk moves the spec floor's bytes; ``gather W+R + rmw`` moves what the step walk
moves now (its write launch re-reads the written rows the gather read). The op's own
no-grad call is timed in the same run beside them.

Usage: python benchmarks/floor_cuda.py [--configs A,B] [--chunk 128]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from bench_cuda import CONFIGS, bench, bench_graph, copy_bandwidth, make_inputs
import sdm_inductor  # noqa: F401  (the ops)

BD = 128   # columns per program: 256-byte bf16 segments, as the step walk's row launches
NG = 32    # written rows per rmw program


@triton.jit
def _gather_kernel(bank_ptr, idx_ptr, wt_ptr, out_ptr, hd, E: tl.constexpr,
                   EP: tl.constexpr, BD: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cm = cols < hd
    e = tl.arange(0, EP)
    sl = tl.load(idx_ptr + t.to(tl.int64) * E + e, mask=e < E, other=-1)
    wt = tl.load(wt_ptr + t.to(tl.int64) * E + e, mask=e < E, other=0.0)
    rows = tl.load(bank_ptr + sl.to(tl.int64)[:, None] * hd + cols[None, :],
                   mask=(sl >= 0)[:, None] & cm[None, :], other=0.0)
    tl.store(out_ptr + t.to(tl.int64) * hd + cols,
             tl.sum(wt[:, None] * rows.to(tl.float32), axis=0), mask=cm)


@triton.jit
def _rmw_kernel(bank_ptr, slot_ptr, n, hd, NG: tl.constexpr, BD: tl.constexpr):
    r = tl.program_id(0) * NG + tl.arange(0, NG)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    m = (r < n)[:, None] & (cols < hd)[None, :]
    sl = tl.load(slot_ptr + r, mask=r < n, other=0)
    ptr = bank_ptr + sl.to(tl.int64)[:, None] * hd + cols[None, :]
    x = tl.load(ptr, mask=m, other=0.0)
    tl.store(ptr, (0.999 * x.to(tl.float32)).to(x.dtype), mask=m)


class Traffic:
    """A config's per-chunk entries (tokens x (W + R) slots) and distinct written slots."""

    def __init__(self, name: str, C: int):
        cfg = CONFIGS[name]
        self.bank, k_idx, k_val, *_, q_idx, q_val = make_inputs(**cfg)
        P, T, W = k_idx.shape
        R = q_idx.shape[2]
        self.hd, self.W, self.R = cfg["hd"], W, R
        NC = -(-T // C)
        # token-major per chunk: chunk c's tokens of every stream
        self.idx, self.wt, self.slots, self.nw = [], [], [], []
        for c in range(NC):
            sl = slice(c * C, min(T, (c + 1) * C))
            ki, qi = k_idx[:, sl].reshape(-1, W), q_idx[:, sl].reshape(-1, R)
            self.idx.append(torch.cat([qi, ki], 1).int().contiguous())   # reads first
            self.wt.append(torch.cat([q_val[:, sl].reshape(-1, R), k_val[:, sl].reshape(-1, W)],
                                     1).float().contiguous())
            u = torch.unique(ki).int()
            self.slots.append(u)
            self.nw.append(u.numel())
        self.tokens = sum(i.shape[0] for i in self.idx)
        self.out = torch.empty(self.idx[0].shape[0], self.hd, device="cuda")
        self.all_idx = torch.cat(self.idx)
        self.all_wt = torch.cat(self.wt)
        self.all_slots = torch.cat(self.slots)
        self.all_out = torch.empty(self.tokens, self.hd, device="cuda")

    def row_bytes(self, rows: int) -> int:
        return rows * self.hd * self.bank.element_size()

    def gather(self, idx, wt, out, E):
        """``idx[:, :E]`` (the read entries first: E = R reads only, W + R both)."""
        grid = (idx.shape[0], triton.cdiv(self.hd, BD))
        _gather_kernel[grid](self.bank, idx, wt, out, self.hd, E=E, EP=triton.next_power_of_2(E),
                             BD=BD, num_warps=1)

    def rmw(self, slots):
        grid = (triton.cdiv(slots.numel(), NG), triton.cdiv(self.hd, BD))
        _rmw_kernel[grid](self.bank, slots, slots.numel(), self.hd, NG=NG, BD=BD, num_warps=4)


def _prefix(idx, E):
    return idx[:, :E].contiguous()


def measure(name: str, C: int, bw: float):
    tr = Traffic(name, C)
    E2, E1 = tr.W + tr.R, tr.R
    idx_r = [_prefix(i, E1) for i in tr.idx]
    wt_r = [_prefix(w, E1) for w in tr.wt]
    all_r, all_wr = _prefix(tr.all_idx, E1), _prefix(tr.all_wt, E1)
    nc = len(tr.idx)
    rows_r = tr.tokens * tr.R
    rows_w = tr.tokens * tr.W
    written = sum(tr.nw)
    variants = {
        "gather W+R, one launch": (lambda: tr.gather(tr.all_idx, tr.all_wt, tr.all_out, E2),
                                   rows_r + rows_w),
        "gather R, one launch": (lambda: tr.gather(all_r, all_wr, tr.all_out, E1), rows_r),
        "rmw, one launch": (lambda: tr.rmw(tr.all_slots), 2 * written),
        "gather R + rmw, per chunk (spec floor bytes)":
            (lambda: [(tr.gather(idx_r[c], wt_r[c], tr.out, E1), tr.rmw(tr.slots[c]))
                      for c in range(nc)], rows_r + 2 * written),
        "gather W+R + rmw, per chunk (the step walk's bytes)":
            (lambda: [(tr.gather(tr.idx[c], tr.wt[c], tr.out, E2), tr.rmw(tr.slots[c]))
                      for c in range(nc)], rows_r + rows_w + 2 * written),
    }
    rows = []
    for what, (fn, nrows) in variants.items():
        ms = bench_graph(fn)
        b = tr.row_bytes(nrows)
        rows.append((what, ms, b / 1e9, b / (ms * 1e-3) / 1e12, b / bw * 1e3))
    op_ms = op_nograd_ms(name, C)
    return rows, op_ms, nc


def op_nograd_ms(name: str, C: int) -> tuple[float, float]:
    """The op's in-place no-grad call as ``bench_cuda.py`` times it: eager, and replayed
    from a CUDA graph."""
    bank, *rest = make_inputs(**CONFIGS[name])
    call = lambda: torch.ops.sdm.triton_write_read_(bank, *rest, C)
    return bench(call), bench_graph(call)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="B,A")
    ap.add_argument("--chunk", type=int, default=128)
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s")
    for name in args.configs.split(","):
        rows, op_ms, nc = measure(name, args.chunk, bw)
        print(f"\nconfig {name}, C={args.chunk} ({nc} chunks); the op's no-grad forward: "
              f"{op_ms[0]:.2f} ms eager, {op_ms[1]:.2f} ms from a CUDA graph")
        print("| traffic | ms (graph) | GB | TB/s | ms at copy bandwidth | us per chunk |")
        print("| --- | --- | --- | --- | --- | --- |")
        for what, ms, gb, tbs, at_copy in rows:
            print(f"| {what} | {ms:.3f} | {gb:.2f} | {tbs:.2f} | {at_copy:.3f} | "
                  f"{ms * 1e3 / nc:.1f} |")


if __name__ == "__main__":
    main()
