"""Does a programmatic (PDL) launch that follows a cross-stream join wait for the other
stream's work before its early loads? The step walks' kernels load Phase 1's arrays
before ``griddepcontrol.wait`` ("early loads", ``step._grid_dependency``) on the grounds
that everything queued before the walk is complete when its first launch starts; where
that work ran on the side stream (``pipeline.ahead`` / ``beside``) the current stream
only waits for an event. This check: a slow kernel writes a buffer on the side stream,
the current stream waits for its event, then a kernel launched with ``launch_pdl`` reads
the buffer before its wait. Any stale element means the early loads may race.

    python benchmarks/pdl_event_check.py [--reps 20]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

N, BLOCK = 1 << 16, 256


@triton.jit
def _slow_write(out_ptr, value, spin, BLOCK: tl.constexpr):
    """``out[block] = value`` after a dependent loop of ``spin`` steps (a slow producer)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(out_ptr + offs) * 0.0
    for _ in range(spin):
        x = x * 0.5 + 1.0
    tl.store(out_ptr + offs, tl.where(x >= 0.0, value, -1.0))


@triton.jit
def _touch(ptr, BLOCK: tl.constexpr):
    """A plain kernel on the current stream before the join (as the groups' kernels)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offs, tl.load(ptr + offs) + 1.0)


@triton.jit
def _early_read(in_ptr, out_ptr, BLOCK: tl.constexpr):
    """Loads ``in`` before ``griddepcontrol.wait`` (an early load), stores it after."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(in_ptr + offs, cache_modifier=".cg")
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + offs, x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--spin", type=int, default=20000)
    a = ap.parse_args()
    main_s = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    buf = torch.zeros(N, device="cuda")
    scratch = torch.zeros(N, device="cuda")
    out = torch.empty(N, device="cuda")
    grid = (N // BLOCK,)
    stale = 0
    for rep in range(a.reps):
        value = float(rep + 1)
        side.wait_stream(main_s)
        with torch.cuda.stream(side):
            _slow_write[grid](buf, value, a.spin, BLOCK=BLOCK)
            done = torch.cuda.Event()
            done.record(side)
        _touch[grid](scratch, BLOCK=BLOCK)
        main_s.wait_event(done)
        _early_read[grid](buf, out, BLOCK=BLOCK, launch_pdl=True)
        torch.cuda.synchronize()
        n_bad = int((out != value).sum())
        stale += n_bad
        print(f"rep {rep}: {n_bad} stale elements of {N}")
    print(f"PDL launch after an event wait: {'RACES' if stale else 'waits for the event'} "
          f"({stale} stale elements in {a.reps} reps)")


if __name__ == "__main__":
    main()
