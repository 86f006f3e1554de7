"""The unit-lower-triangular solve of each chunk, as explicit matrices for Phase 2.

``L = I + tril(beta A, -1) = I - N`` with ``N`` strictly lower triangular, hence
nilpotent (``N^C = 0``), so ``X = L^-1 = (I + N)(I + N^2)(I + N^4) ... `` with
``ceil(log2 C)`` factors: a few dense C x C products instead of C dependent
substitution steps, on tensor cores with fp32 accuracy (``tf32x3``). One program per
chunk also forms ``QKX = QK @ X``. The matrices live in registers, which bounds C: up to
``BLOCKED_MAX_C`` the chunk is 2 x 2 blocks of ``MAX_C`` (two series and three products
more); beyond it the batched triangular solve of torch runs instead.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime.launch import dense, launch, pow2

MAX_C = 64


@triton.jit
def _series(N, eye, PREC: tl.constexpr, LOG: tl.constexpr):
    """``(I - N)^-1 = (I + N)(I + N^2)(I + N^4)...`` of a strictly lower triangular ``N``."""
    X = eye + N
    Pk = N
    for _ in tl.static_range(1, LOG):
        Pk = tl.dot(Pk, Pk, input_precision=PREC)
        X = X + tl.dot(X, Pk, input_precision=PREC)
    return X


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
    X = _series(N, tl.where(r[:, None] == r[None, :], 1.0, 0.0), PREC, LOG)
    tl.store(X_ptr + off, X, mask=m)
    QK = tl.load(QK_ptr + off, mask=m, other=0.0)
    tl.store(QKX_ptr + off, tl.dot(QK, X, input_precision=PREC), mask=m)


@triton.jit
def _block(ptr, base, r0, c0, C: tl.constexpr, H: tl.constexpr):
    """Offsets and mask of the ``[H, H]`` block at ``(r0, c0)`` of a ``[C, C]`` matrix."""
    r = r0 + tl.arange(0, H)
    c = c0 + tl.arange(0, H)
    return ptr + base + r[:, None] * C + c[None, :], (r < C)[:, None] & (c < C)[None, :]


@triton.jit
def _inverse_diag_kernel(A_ptr, QK_ptr, beta_ptr, X_ptr, QKX_ptr, C: tl.constexpr,
                         H: tl.constexpr, PREC: tl.constexpr, LOG: tl.constexpr):
    """``_inverse_kernel`` for ``H < C <= 2H`` by 2 x 2 blocks of ``H x H``, first launch:
    program ``(chunk, h)`` forms the diagonal block ``X_hh = L_hh^-1`` (series) and
    ``QKX_hh = QK_hh X_hh``, and the zero blocks ``X12``, ``QKX12`` (``h = 0``; ``QK`` is
    lower triangular too): a chunk's two series run in two programs, not one after the
    other."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    base = b.to(tl.int64) * C * C
    r = tl.arange(0, H)
    low = r[None, :] < r[:, None]
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    o = h * H
    bt = tl.load(beta_ptr + b.to(tl.int64) * C + o + r, mask=o + r < C, other=0.0)
    p, m = _block(A_ptr, base, o, o, C, H)
    x = _series(tl.where(low, -bt[:, None] * tl.load(p, mask=m, other=0.0), 0.0), eye, PREC,
                LOG)
    p, m = _block(X_ptr, base, o, o, C, H)
    tl.store(p, x, mask=m)
    p, m = _block(QK_ptr, base, o, o, C, H)
    q, qm = _block(QKX_ptr, base, o, o, C, H)
    tl.store(q, tl.dot(tl.load(p, mask=m, other=0.0), x, input_precision=PREC), mask=qm)
    if h == 0:
        zero = tl.zeros([H, H], tl.float32)
        p, m = _block(X_ptr, base, 0, H, C, H)
        tl.store(p, zero, mask=m)
        q, qm = _block(QKX_ptr, base, 0, H, C, H)
        tl.store(q, zero, mask=qm)


@triton.jit
def _inverse_low_kernel(A_ptr, QK_ptr, beta_ptr, X_ptr, QKX_ptr, C: tl.constexpr,
                        H: tl.constexpr, PREC: tl.constexpr):
    """The second launch: ``X21 = X22 N21 X11`` (``L21 = -N21``) and ``QKX21 = QK22 X21
    + QK21 X11`` from the diagonal blocks of ``_inverse_diag_kernel``."""
    b = tl.program_id(0)
    base = b.to(tl.int64) * C * C
    r = tl.arange(0, H)
    b2 = tl.load(beta_ptr + b.to(tl.int64) * C + H + r, mask=H + r < C, other=0.0)
    x11, m11 = _block(X_ptr, base, 0, 0, C, H)
    x22, m22 = _block(X_ptr, base, H, H, C, H)
    x11 = tl.load(x11, mask=m11, other=0.0)
    p, m = _block(A_ptr, base, H, 0, C, H)
    T = tl.dot(-b2[:, None] * tl.load(p, mask=m, other=0.0), x11, input_precision=PREC)
    x21 = tl.dot(tl.load(x22, mask=m22, other=0.0), T, input_precision=PREC)
    p, m = _block(X_ptr, base, H, 0, C, H)
    tl.store(p, x21, mask=m)
    p, m = _block(QK_ptr, base, H, H, C, H)
    y = tl.dot(tl.load(p, mask=m, other=0.0), x21, input_precision=PREC)
    p, m = _block(QK_ptr, base, H, 0, C, H)
    y += tl.dot(tl.load(p, mask=m, other=0.0), x11, input_precision=PREC)
    q, qm = _block(QKX_ptr, base, H, 0, C, H)
    tl.store(q, y, mask=qm)


# 2 x 2 blocks of 64 for 64 < C <= BLOCKED_MAX_C, in two launches (``_inverse_diag_kernel``:
# a program per diagonal block; ``_inverse_low_kernel``: the off-diagonal ones)
BLOCKED_MAX_C = 128
BLOCKED_WARPS = 4


def inverse(A, QK, beta):
    """(X, QKX) of every chunk: ``X = (I + tril(beta A, -1))^-1``; A, QK [B, C, C], beta [B, C]."""
    B, C, _ = A.shape
    if MAX_C < C <= BLOCKED_MAX_C:
        X = torch.empty_like(A)
        QKX = torch.empty_like(A)
        LOG = max(1, (MAX_C - 1).bit_length())
        launch(_inverse_diag_kernel, (B, 2), A, QK, beta, X, QKX, C=C, H=MAX_C,
               PREC="tf32x3", LOG=LOG, num_warps=BLOCKED_WARPS)
        launch(_inverse_low_kernel, (B,), A, QK, beta, X, QKX, C=C, H=MAX_C,
               PREC="tf32x3", num_warps=BLOCKED_WARPS)
        return X, QKX
    if C > MAX_C:
        L = torch.tril(beta[:, :, None] * A, -1) + torch.eye(C, device=A.device)
        eye = torch.eye(C, device=A.device).expand(B, C, C)
        # the solver may return column-major storage; the kernels index row-major (and a
        # traced matmul's layout may change after tracing: ``dense``)
        X = dense(torch.linalg.solve_triangular(L, eye, upper=False, unitriangular=True))
        return X, dense(torch.matmul(QK, X))
    X = torch.empty_like(A)
    QKX = torch.empty_like(A)
    CP = max(16, pow2(C))
    # tf32x3: three tf32 products per fp32 one, fp32 accuracy on tensor cores (plain
    # "ieee" fp32 dots spill heavily at this size)
    launch(_inverse_kernel, (B,), A, QK, beta, X, QKX, C=C, CP=CP, PREC="tf32x3",
           LOG=max(1, (CP - 1).bit_length()), num_warps=4)
    return X, QKX
