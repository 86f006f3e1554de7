"""The Triton implementation as ``torch.library.triton_op``s, for Inductor's generated code.

Each body calls only torch ops and ``wrap_triton`` kernels, with shapes-only host logic,
so AOTDispatcher can decompose it and Inductor launches the kernels from its output code
(and CUDA graphs / AOTInductor carry them). The chunk loop is inside the kernels: one
compilation serves every ``T``. Arguments are already validated and cast by the caller
(the lowerings hoist the eager op's casts): no index range check happens here, the
kernels mask out-of-range rows instead (they touch nothing).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import backward as bwd
from . import host


@torch.library.triton_op("sdm::triton_write_read", mutates_args=())
def triton_write_read(bank: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor, beta: Tensor,
                      g: Tensor, q_idx: Tensor, q_val: Tensor, chunk_size: int = 64,
                      snapshot_quant: str = "none", save_for_backward: bool = True
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Tensor]]:
    """Functional ``sdm::write_read`` on CUDA: ``(readings, final_bank, saved_rows, saved_scales,
    handed)``; ``handed``: what the backward would otherwise recompute (Phase 1's plan and
    ``v - r0``), for ``triton_write_read_backward``, or empty (nothing saved for a backward).

    Contract: inputs in the op's canonical layout (bank [S, hd] fp32/bf16; k_idx/k_val
    [P, T, W]; v [P, T, hd]; beta [P, T]; g [P, T, 1 or W]; q_idx/q_val [P, T, R]);
    k_val, v, q_val in the bank dtype, beta and g fp32 (other dtypes are cast here);
    16 <= chunk_size <= 256. ``saved_rows`` / ``saved_scales`` have the shapes and dtypes
    of ``ops._saved_shapes`` (the undo log: the chunk-start value of each distinct row a
    chunk writes, chunk-major, stored per ``snapshot_quant``; empty when
    ``save_for_backward`` is False) and, with the final bank, feed
    ``sdm::triton_write_read_backward``. Without a backward and with T <= 16 the decode
    kernel runs instead of the chunked path (a guard on T, not a recompilation per T).
    """
    final = bank.clone(memory_format=torch.contiguous_format)
    readings, rows, scales, keep = host.forward_kept(
        final, k_idx, k_val.to(bank.dtype), v.to(bank.dtype), beta.float(), g.float(), q_idx,
        q_val.to(bank.dtype), chunk_size, snapshot_quant, save_for_backward,
        keep=bool(host.CONFIG["KEEP"]))
    return readings, final, rows, scales, [] if keep is None else keep.tensors()


@torch.library.triton_op("sdm::triton_write_read_gated", mutates_args=())
def triton_write_read_gated(bank: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor,
                            b_raw: Tensor, a_raw: Tensor, A_log: Tensor, dt_bias: Tensor,
                            q_idx: Tensor, q_val: Tensor, chunk_size: int = 64,
                            snapshot_quant: str = "none", save_for_backward: bool = True
                            ) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Tensor]]:
    """``sdm::write_read_gated`` on CUDA: ``triton_write_read`` whose prep kernel (Phase 1,
    or the decode path's) computes ``beta = sigmoid(b_raw)`` and
    ``g = -exp(A_log) * softplus(a_raw + dt_bias)`` in fp32 from the raw inputs.

    ``b_raw`` / ``a_raw``: ``[P, T]`` or ``[B, T, H]`` (``P = B * H``, stream ``b * H + h``),
    any float dtype and any strides (an eager call reads them in place; a traced one copies
    them to contiguous, ``host.forward_kept``); ``A_log`` / ``dt_bias``
    ``[P]``. Other inputs and the outputs as ``triton_write_read``.
    """
    final = bank.clone(memory_format=torch.contiguous_format)
    readings, rows, scales, keep = host.forward_kept(
        final, k_idx, k_val.to(bank.dtype), v.to(bank.dtype), host.raw_gate_layout(b_raw),
        host.raw_gate_layout(a_raw), q_idx, q_val.to(bank.dtype), chunk_size, snapshot_quant,
        save_for_backward, gate_params=(A_log, dt_bias), keep=bool(host.CONFIG["KEEP"]))
    return readings, final, rows, scales, [] if keep is None else keep.tensors()


@torch.library.triton_op("sdm::triton_write_read_", mutates_args=("bank",))
def triton_write_read_(bank: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor, beta: Tensor,
                       g: Tensor, q_idx: Tensor, q_val: Tensor, chunk_size: int = 64) -> Tensor:
    """In-place ``sdm::write_read_`` on CUDA: advances ``bank``, returns readings [P, T, hd].

    Same input contract as ``triton_write_read``; saves nothing. The whole sequence is
    one pass (the eager op additionally cuts long sequences into windows to bound its
    working memory; a traced call cannot loop over a symbolic length).
    """
    return host.forward_once(bank, k_idx, k_val.to(bank.dtype), v.to(bank.dtype), beta.float(),
                             g.float(), q_idx, q_val.to(bank.dtype), chunk_size, "none", False)[0]


@torch.library.triton_op("sdm::triton_write_read_backward", mutates_args=())
def triton_write_read_backward(grad_readings: Tensor, grad_final: Tensor,
                               final_bank: Tensor, saved_rows: Tensor, saved_scales: Tensor,
                               k_idx: Tensor, k_val: Tensor, v: Tensor, beta: Tensor, g: Tensor,
                               q_idx: Tensor, q_val: Tensor, chunk_size: int, snapshot_quant: str,
                               grad_bank_fp32: bool, handed: list[Tensor]
                               ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``sdm::write_read_backward`` on CUDA: ``(d_bank, d_kval, d_v, d_beta, d_g, d_qval)``.

    ``final_bank``, ``saved_rows`` / ``saved_scales`` and ``handed`` as produced by
    ``triton_write_read`` (or its gated form) with the same inputs, chunk_size and
    snapshot_quant; ``handed`` may be empty (the backward then recomputes Phase 1). d_bank,
    d_kval, d_v, d_qval come in the bank dtype (``grad_final.dtype``), d_beta and d_g in
    fp32, like the op's fake impl. With ``grad_bank_fp32`` the bank gradient accumulates in
    fp32 (one cast at the end).
    """
    dt = grad_final.dtype
    return bwd.backward(grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx,
                        k_val.to(dt), v.to(dt), beta.float(), g.float(), q_idx, q_val.to(dt),
                        chunk_size, snapshot_quant, grad_bank_fp32, host.CONFIG, handed)
