"""The index range check of an eager CUDA call in one launch (``range_flags``).

The check's verdict gates the first write to the bank (``validation.start_index_check``),
and the host queues the check before it queues Phase 1. As a dozen torch ops (per-stream
min / max, compares, ``any``) it would keep the host busy longer than the GPU needs for
them, with the launch latency of each in front of the call's work. One program here checks
``BLOCK`` entries of one stream, of ``k_idx`` and ``q_idx`` together, and writes its own
verdict (no zeroed flag, no atomics); the host reads the few bytes. A stream's ``k_idx`` or
``q_idx`` may be empty (its loads are all masked)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _range_flags_kernel(k_ptr, q_ptr, flag_ptr, n_k, n_q, blocks, rows_per_stream, rows,
                        OWN: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)            # p * blocks + b
    p = (pid // blocks).to(tl.int64)
    b = (pid % blocks).to(tl.int64)
    if OWN:   # stream p's own rows [p * rows_per_stream, (p + 1) * rows_per_stream)
        lo = p * rows_per_stream
        hi = lo + rows_per_stream
    else:     # the whole bank
        lo = p * 0
        hi = lo + rows
    offs = b * BLOCK + tl.arange(0, BLOCK)
    mk = offs < n_k
    mq = offs < n_q
    k = tl.load(k_ptr + p * n_k + offs, mask=mk, other=0).to(tl.int64)
    q = tl.load(q_ptr + p * n_q + offs, mask=mq, other=0).to(tl.int64)
    bad = (mk & ((k < lo) | (k >= hi))) | (mq & ((q < lo) | (q >= hi)))
    tl.store(flag_ptr + pid, tl.max(bad.to(tl.int8), axis=0))


def range_flags(k_idx: torch.Tensor, q_idx: torch.Tensor, rows: int, rows_per_stream: int,
                own: bool) -> torch.Tensor:
    """One int8 per program, nonzero where an entry of ``k_idx`` / ``q_idx`` (``[P, T, W]``
    / ``[P, T, R]``, real tensors, not both empty) leaves its stream's rows (``own``:
    ``[p * rows_per_stream, (p + 1) * rows_per_stream)``) or the bank's ``rows``."""
    k_idx, q_idx = k_idx.contiguous(), q_idx.contiguous()
    P = k_idx.shape[0]
    n_k, n_q = k_idx.numel() // P, q_idx.numel() // P
    blocks = triton.cdiv(max(n_k, n_q), BLOCK)
    flags = torch.empty(P * blocks, dtype=torch.int8, device=k_idx.device)
    # launched directly (an eager call on real tensors: never traced into a graph)
    _range_flags_kernel[(P * blocks,)](k_idx, q_idx, flags, n_k, n_q, blocks,
                                       rows_per_stream, rows, OWN=own, BLOCK=BLOCK,
                                       num_warps=4)
    return flags
