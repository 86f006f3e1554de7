"""The undo log's packing kernel (``kernels/quantize.py``) at config A's raw log (C=64):
rows per program x warps, against a plain copy of the same bytes.

Usage: python benchmarks/bench_pack.py
"""
from __future__ import annotations

import torch
import triton.testing

from sdm_inductor.kernels.forward import quantize


def main():
    raw = torch.randn(2 * 8192, 64, 768, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(raw)
    ms = triton.testing.do_bench(lambda: out.copy_(raw), rep=200)
    print(f"copy of the raw log ({raw.numel() * 2 / 2**30:.2f} GiB): {ms:.3f} ms")
    print(f"zero fill: {triton.testing.do_bench(lambda: raw.new_zeros(raw.shape), rep=200):.3f} ms")
    for mode in ("fp8", "int4"):
        for rb in (1, 2, 4, 8):
            for warps in (2, 4, 8):
                quantize.ROWS_PER_PROGRAM, quantize.WARPS = rb, warps
                ms = triton.testing.do_bench(lambda: quantize.pack_log(raw, mode, torch.bfloat16),
                                             rep=100)
                print(f"{mode} RB={rb} warps={warps}: {ms:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
