"""The memory time of a call's necessary row traffic, measured rather than computed: how
close can any exact walk come to the spec's bandwidth floor on this GPU?

``bench_cuda.py``'s floor divides the forward's bytes (``2 x distinct written rows + C R
read rows`` per chunk, spec section 5) by the copy bandwidth. But those bytes are random
row segments, not a stream: this script moves exactly them with the simplest Triton
kernels that can (no Phase 1, no products, no gates), on the benchmark's own inputs, and
times them replayed from a CUDA graph (the GPU's time alone):

- ``gather W+R``: one program per (token, 128 columns) sums its ``W + R`` weighted
  chunk-start row segments, as the step walk's gather launch does
  (``kernels/forward/step_walk.py``);
- ``gather R``: the read rows alone;
- ``rmw``: read and rewrite each distinct written row of a chunk once (the write launch);

as launches per chunk in chunk order (the dependency any exact walk has), and as one
launch over all chunks. The one-launch figures are no floor of an exact walk: their
programs run column block by column block over every token of the sequence, so a
block's ~38 MB of bank columns (B) stays in L2 while the sequence's repeated slots read
it again (the read rows move at ~7 TB/s that way); they show what chunk
order costs. ``gather R + rmw`` per chunk moves the spec floor's bytes; ``gather W+R +
rmw`` moves what the step walk moves (its write launch re-reads the written rows the
gather read); ``training`` adds the undo log and the backward's rows (``bench_cuda``'s
forward + backward floor bytes). The op's no-grad call and autograd step are timed in the
same run beside them.

Usage: python benchmarks/floor_cuda.py [--configs A,B] [--chunk 128]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from bench_cuda import CONFIGS, autograd_step, bench, bench_graph, copy_bandwidth, make_inputs
import sdm_inductor  # noqa: F401  (the ops)

BD = 128   # columns per program: 256-byte bf16 segments, as the step walk's row launches
NG = 32    # written rows per rmw program


@triton.jit
def _gather_kernel(bank_ptr, idx_ptr, wt_ptr, out_ptr, hd, E: tl.constexpr,
                   EB: tl.constexpr, BD: tl.constexpr):
    """Token ``t``'s ``E`` weighted row segments summed, ``EB`` rows a load (the step
    walk's gather loads its W rows, then its R rows, as two such tiles)."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    cm = cols < hd
    acc = tl.zeros([BD], tl.float32)
    for e0 in tl.static_range(0, E, EB):
        e = e0 + tl.arange(0, EB)
        sl = tl.load(idx_ptr + t.to(tl.int64) * E + e, mask=e < E, other=-1)
        wt = tl.load(wt_ptr + t.to(tl.int64) * E + e, mask=e < E, other=0.0)
        rows = tl.load(bank_ptr + sl.to(tl.int64)[:, None] * hd + cols[None, :],
                       mask=(sl >= 0)[:, None] & cm[None, :], other=0.0)
        acc += tl.sum(wt[:, None] * rows.to(tl.float32), axis=0)
    tl.store(out_ptr + t.to(tl.int64) * hd + cols, acc, mask=cm)


@triton.jit
def _rmw_kernel(bank_ptr, slot_ptr, log_ptr, n, hd, NG: tl.constexpr, BD: tl.constexpr,
                LOG: tl.constexpr):
    """Rewrite ``NG`` rows of ``slot`` (with ``LOG``: their old values to the undo log)."""
    r = tl.program_id(0) * NG + tl.arange(0, NG)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    m = (r < n)[:, None] & (cols < hd)[None, :]
    sl = tl.load(slot_ptr + r, mask=r < n, other=0)
    ptr = bank_ptr + sl.to(tl.int64)[:, None] * hd + cols[None, :]
    x = tl.load(ptr, mask=m, other=0.0)
    if LOG:
        tl.store(log_ptr + r.to(tl.int64)[:, None] * hd + cols[None, :], x, mask=m)
    tl.store(ptr, (0.999 * x.to(tl.float32)).to(x.dtype), mask=m)


@triton.jit
def _move_kernel(src_ptr, src_idx_ptr, dst_ptr, dst_idx_ptr, n, hd, SRC_IDX: tl.constexpr,
                 DST_IDX: tl.constexpr, NG: tl.constexpr, BD: tl.constexpr):
    """``dst[dst_idx[r]] = src[src_idx[r]]`` for ``NG`` rows (an index absent: ``r``)."""
    r = tl.program_id(0) * NG + tl.arange(0, NG)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    m = (r < n)[:, None] & (cols < hd)[None, :]
    rs, rd = r, r
    if SRC_IDX:
        rs = tl.load(src_idx_ptr + r, mask=r < n, other=0)
    if DST_IDX:
        rd = tl.load(dst_idx_ptr + r, mask=r < n, other=0)
    x = tl.load(src_ptr + rs.to(tl.int64)[:, None] * hd + cols[None, :], mask=m, other=0.0)
    tl.store(dst_ptr + rd.to(tl.int64)[:, None] * hd + cols[None, :], x, mask=m)


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
        self.idx, self.wt, self.slots, self.touched = [], [], [], []
        for c in range(NC):
            sl = slice(c * C, min(T, (c + 1) * C))
            ki, qi = k_idx[:, sl].reshape(-1, W), q_idx[:, sl].reshape(-1, R)
            self.idx.append(torch.cat([qi, ki], 1).int().contiguous())   # reads first
            self.wt.append(torch.cat([q_val[:, sl].reshape(-1, R), k_val[:, sl].reshape(-1, W)],
                                     1).float().contiguous())
            self.slots.append(torch.unique(ki).int())
            self.touched.append(torch.unique(torch.cat([ki, qi]).reshape(-1)).int())
        self.tokens = sum(i.shape[0] for i in self.idx)
        self.out = torch.empty(self.idx[0].shape[0], self.hd, device="cuda")
        # the read entries alone (the first R of each token)
        self.r_idx = [i[:, :R].contiguous() for i in self.idx]
        self.r_wt = [w[:, :R].contiguous() for w in self.wt]
        self.all_idx, self.all_r_idx = torch.cat(self.idx), torch.cat(self.r_idx)
        self.all_wt, self.all_r_wt = torch.cat(self.wt), torch.cat(self.r_wt)
        self.all_slots = torch.cat(self.slots)
        self.all_out = torch.empty(self.tokens, self.hd, device="cuda")
        # the training walk's undo log (chunk c's rows from log_at[c]) and gradient bank
        self.log_at = [0]
        for u in self.slots:
            self.log_at.append(self.log_at[-1] + u.numel())
        self.log = torch.empty(self.log_at[-1], self.hd, dtype=self.bank.dtype, device="cuda")
        self.grad = torch.empty_like(self.bank)

    def row_bytes(self, rows: int) -> int:
        return rows * self.hd * self.bank.element_size()

    def gather(self, idx, wt, out):
        """Each token's (row of ``idx``) weighted row segments: R reads, or W + R entries."""
        grid = (idx.shape[0], triton.cdiv(self.hd, BD))
        _gather_kernel[grid](self.bank, idx, wt, out, self.hd, E=idx.shape[1],
                             EB=triton.next_power_of_2(min(self.W, self.R)), BD=BD,
                             num_warps=1)

    def _grid(self, n):
        return (triton.cdiv(n, NG), triton.cdiv(self.hd, BD))

    def rmw(self, slots, log=None):
        _rmw_kernel[self._grid(slots.numel())](self.bank, slots, self.bank if log is None else log,
                                               slots.numel(), self.hd, NG=NG, BD=BD,
                                               LOG=log is not None, num_warps=4)

    def training(self, c_count: int):
        """A training call's necessary traffic: the forward (read rows, written rows
        rewritten with their old values to the undo log), then the backward in reverse
        chunk order (the written rows restored from the log, every distinct touched row
        read and its gradient row written)."""
        for c in range(c_count):
            self.gather(self.r_idx[c], self.r_wt[c], self.out)
            self.rmw(self.slots[c], self.log[self.log_at[c]:self.log_at[c + 1]])
        for c in reversed(range(c_count)):
            sl, lg = self.slots[c], self.log[self.log_at[c]:self.log_at[c + 1]]
            _move_kernel[self._grid(sl.numel())](lg, sl, self.bank, sl, sl.numel(), self.hd,
                                                 SRC_IDX=False, DST_IDX=True, NG=NG, BD=BD,
                                                 num_warps=4)
            tc = self.touched[c]
            _move_kernel[self._grid(tc.numel())](self.bank, tc, self.grad, tc, tc.numel(),
                                                 self.hd, SRC_IDX=True, DST_IDX=True, NG=NG,
                                                 BD=BD, num_warps=4)


def measure(name: str, C: int, bw: float):
    tr = Traffic(name, C)
    touched = sum(t.numel() for t in tr.touched)
    nc = len(tr.idx)
    rows_r = tr.tokens * tr.R
    rows_w = tr.tokens * tr.W
    written = tr.log_at[-1]
    variants = {
        "gather W+R, one launch": (lambda: tr.gather(tr.all_idx, tr.all_wt, tr.all_out),
                                   rows_r + rows_w),
        "gather R, one launch": (lambda: tr.gather(tr.all_r_idx, tr.all_r_wt, tr.all_out),
                                 rows_r),
        "rmw, one launch": (lambda: tr.rmw(tr.all_slots), 2 * written),
        "gather W+R, per chunk": (lambda: [tr.gather(tr.idx[c], tr.wt[c], tr.out)
                                           for c in range(nc)], rows_r + rows_w),
        "rmw, per chunk": (lambda: [tr.rmw(tr.slots[c]) for c in range(nc)], 2 * written),
        "gather R + rmw, per chunk (spec floor bytes)":
            (lambda: [(tr.gather(tr.r_idx[c], tr.r_wt[c], tr.out), tr.rmw(tr.slots[c]))
                      for c in range(nc)], rows_r + 2 * written),
        "gather W+R + rmw, per chunk (the step walk's bytes)":
            (lambda: [(tr.gather(tr.idx[c], tr.wt[c], tr.out), tr.rmw(tr.slots[c]))
                      for c in range(nc)], rows_r + rows_w + 2 * written),
        "training: forward, then backward in reverse, per chunk (fwd+bwd floor bytes)":
            (lambda: tr.training(nc), rows_r + 5 * written + 2 * touched),
    }
    rows = []
    for what, (fn, nrows) in variants.items():
        ms = bench_graph(fn)
        b = tr.row_bytes(nrows)
        rows.append((what, ms, b / 1e9, b / (ms * 1e-3) / 1e12, b / bw * 1e3))
    del tr
    torch.cuda.empty_cache()
    return rows, op_ms(name, C), nc


def op_ms(name: str, C: int) -> tuple[float, float, float]:
    """The op as ``bench_cuda.py`` times it: the in-place no-grad call eager and replayed
    from a CUDA graph, and the autograd forward + backward (eager)."""
    ins = make_inputs(**CONFIGS[name])
    bank, *rest = ins
    work = bank.clone()
    call = lambda: torch.ops.sdm.triton_write_read_(work, *rest, C)
    step = autograd_step(ins, torch.randn_like(ins[3]), torch.randn_like(bank), C, "none")
    return bench(call), bench_graph(call), bench(step, rep=400)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="B,A")
    ap.add_argument("--chunk", type=int, default=128)
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s")
    for name in args.configs.split(","):
        rows, (fwd, fwd_graph, fb), nc = measure(name, args.chunk, bw)
        print(f"\nconfig {name}, C={args.chunk} ({nc} chunks); the op: no-grad forward "
              f"{fwd:.2f} ms eager, {fwd_graph:.2f} ms from a CUDA graph; autograd forward + "
              f"backward {fb:.2f} ms")
        print("| traffic | ms (graph) | GB | TB/s | ms at copy bandwidth | us per chunk |")
        print("| --- | --- | --- | --- | --- | --- |")
        for what, ms, gb, tbs, at_copy in rows:
            print(f"| {what} | {ms:.3f} | {gb:.2f} | {tbs:.2f} | {at_copy:.3f} | "
                  f"{ms * 1e3 / nc:.1f} |")


if __name__ == "__main__":
    main()
