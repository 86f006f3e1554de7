"""The gate prologue of ``sdm::write_read_gated`` in plain torch ops.

The layer's per-token gates (Gated DeltaNet / Mamba-2 form), per stream ``p``:

    beta = sigmoid(b)                              write strength
    g    = -exp(A_log[p]) * softplus(a + dt_bias[p])   log-decay (softplus: beta=1, threshold=20)

``b`` and ``a`` (the *raw* gate inputs) come as ``[P, T]`` or as a projection's
``[B, T, H]`` output (token-major, stream ``p = b * H + h``); ``A_log`` and ``dt_bias``
are ``[P]``. Everything is computed in fp32. The CUDA kernels compute the same inside
Phase 1's prep kernel (``kernels/phase1/entries.py``); these functions serve the CPU
implementation, the compiled CPU graph and the backward (which recomputes the gates).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["LOG_DECAY_FLOOR", "to_streams", "from_streams", "torch_gates", "gate_grads",
           "floor_grad"]

# Log-decays below this are a full forget: exp(-104) is 0 in fp32, so a row decayed by it
# is exactly 0, as in the token loop. The chunked form takes differences of per-chunk
# cumulative sums of the gates; -inf there gives inf - inf = NaN, and a gate like -1e4
# leaves the small gates after it in the same sum with an error of ulp(1e4) ~ 1e-3. Every
# implementation raises the gates it reads to this floor (CPU: ``cpu.py``; CUDA: Phase 1's
# prep kernel, also for the gates it computes). A slot's cumulative sum then grows by 104 per
# full forget in its chunk, and the rounding of its later decays there with it: about 1e-5
# relative per forget (docs/spec.md, input ranges).
LOG_DECAY_FLOOR = -104.0


def to_streams(x: Tensor) -> Tensor:
    """A raw gate input as ``[P, T]`` (a ``[B, T, H]`` input is transposed: a copy)."""
    if x.dim() == 2:
        return x
    B, T, H = x.shape
    return x.permute(0, 2, 1).reshape(B * H, T)


def from_streams(x: Tensor, like: Tensor) -> Tensor:
    """``[P, T]`` back to the layout of the raw input ``like``, in its dtype."""
    if like.dim() == 3:
        B, T, H = like.shape
        x = x.view(B, H, T).permute(0, 2, 1).contiguous()
    return x.to(like.dtype)


def torch_gates(b_raw: Tensor, a_raw: Tensor, A_log: Tensor, dt_bias: Tensor):
    """``(beta [P, T], g [P, T, 1])`` in fp32, the form ``sdm::write_read`` takes."""
    beta = torch.sigmoid(to_streams(b_raw).float())
    g = -torch.exp(A_log.float())[:, None] * F.softplus(
        to_streams(a_raw).float() + dt_bias.float()[:, None])
    return beta, g[..., None]


def floor_grad(d_g: Tensor, g: Tensor) -> Tensor:
    """The gradient of the user's ``g`` from that of the floored one: none at or below
    ``LOG_DECAY_FLOOR`` (there the loop's d/dg of ``exp(g) * row`` is ``exp(g) * row = 0``
    in fp32; the implementations' is that of the floor, which through the chunked form's
    cumulative sums is rounding noise, ~1e-6, not 0). NaN gates keep theirs."""
    return torch.where(g <= LOG_DECAY_FLOOR, torch.zeros_like(d_g), d_g)


def gate_grads(d_beta: Tensor, d_g: Tensor, beta: Tensor, g: Tensor, b_raw: Tensor,
               a_raw: Tensor, A_log: Tensor, dt_bias: Tensor):
    """Chain ``(d_beta [P, T], d_g [P, T, 1])`` through the gate formulas, given the gates
    ``(beta, g)`` of ``torch_gates`` (computed once by the caller): the gradients of
    ``(b_raw, a_raw, A_log, dt_bias)``, each in its input's layout and dtype."""
    g = g[..., 0]
    d_g = floor_grad(d_g[..., 0].float(), g)
    d_b = d_beta.float() * beta * (1 - beta)
    x = to_streams(a_raw).float() + dt_bias.float()[:, None]
    # softplus' = sigmoid (above the threshold torch passes the gradient through: 1,
    # which is what sigmoid rounds to in fp32 there)
    # 0 where the floor cut d_g: there exp(A_log) may be inf (A_log = inf), never 0 * inf
    cut = g <= LOG_DECAY_FLOOR
    d_a = torch.where(cut, 0.0, d_g * -torch.exp(A_log.float())[:, None] * torch.sigmoid(x))
    # g, not the floor, is d g / d A_log
    d_A_log = torch.where(cut, 0.0, d_g * g).sum(1)
    d_dt_bias = d_a.sum(1)
    return (from_streams(d_b, b_raw), from_streams(d_a, a_raw), d_A_log.to(A_log.dtype),
            d_dt_bias.to(dt_bias.dtype))
