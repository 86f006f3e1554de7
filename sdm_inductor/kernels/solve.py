"""The unit-lower-triangular solve of each chunk, as explicit matrices for Phase 2.

``L = I + tril(beta A, -1) = I - N`` with ``N`` strictly lower triangular, hence
nilpotent (``N^C = 0``), so ``X = L^-1 = (I + N)(I + N^2)(I + N^4) ... `` with
``ceil(log2 C)`` factors: a few dense C x C products instead of C dependent
substitution steps, on tensor cores with fp32 accuracy (``tf32x3``). One program per
chunk also forms ``QKX = QK @ X``. The matrices live in registers, which bounds C:
for C > ``MAX_C`` the batched triangular solve of torch runs instead.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch, pow2

MAX_C = 64


@triton.jit
def _inverse_kernel(A_ptr, QK_ptr, beta_ptr, X_ptr, QKX_ptr, C: tl.constexpr, CP: tl.constexpr,
                    PREC: tl.constexpr,
                    LOG: tl.constexpr):
    b = tl.program_id(0)
    r = tl.arange(0, CP)
    base = b.to(tl.int64) * C * C
    off = base + r[:, None] * C + r[None, :]
    m = (r < C)[:, None] & (r < C)[None, :]
    beta = tl.load(beta_ptr + b.to(tl.int64) * C + r, mask=r < C, other=0.0)
    A = tl.load(A_ptr + off, mask=m, other=0.0)
    N = tl.where(r[None, :] < r[:, None], -beta[:, None] * A, 0.0)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    X = eye + N
    Pk = N
    for _ in tl.static_range(1, LOG):
        Pk = tl.dot(Pk, Pk, input_precision=PREC)
        X = X + tl.dot(X, Pk, input_precision=PREC)
    tl.store(X_ptr + off, X, mask=m)
    QK = tl.load(QK_ptr + off, mask=m, other=0.0)
    tl.store(QKX_ptr + off, tl.dot(QK, X, input_precision=PREC), mask=m)


def inverse(A, QK, beta):
    """(X, QKX) of every chunk: ``X = (I + tril(beta A, -1))^-1``; A, QK [B, C, C], beta [B, C]."""
    B, C, _ = A.shape
    if C > MAX_C:
        L = torch.tril(beta[:, :, None] * A, -1) + torch.eye(C, device=A.device)
        eye = torch.eye(C, device=A.device).expand(B, C, C)
        # the solver may return column-major storage; the kernels index row-major
        X = torch.linalg.solve_triangular(L, eye, upper=False, unitriangular=True).contiguous()
        return X, torch.matmul(QK, X).contiguous()
    X = torch.empty_like(A)
    QKX = torch.empty_like(A)
    CP = max(16, pow2(C))
    # tf32x3: three tf32 products per fp32 one, fp32 accuracy on tensor cores (plain
    # "ieee" fp32 dots spill heavily at this size)
    launch(_inverse_kernel, (B,), A, QK, beta, X, QKX, C=C, CP=CP, PREC="tf32x3",
           LOG=max(1, (CP - 1).bit_length()), num_warps=4)
    return X, QKX
