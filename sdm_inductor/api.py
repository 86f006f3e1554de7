"""The Python interface users know from ``sparse-delta-memory`` 2.0.0 (spec section 4)."""
from __future__ import annotations

import torch
from torch import Tensor

from .validation import (API_NAMES, _fail, as_int, check_call, check_options, check_tensors,
                         refuse_forward_ad)

__all__ = ["sdm_write_read", "write_read", "write_read_gated", "to_streams"]


def to_streams(num_parallel: int, k_idx: Tensor, k_val: Tensor, v: Tensor, beta: Tensor,
               g: Tensor, q_idx: Tensor, q_val: Tensor, key_weighted_decay=None):
    """Inputs as ``[P*T, *]`` (or already ``[P, T, *]``) -> ``((k_idx, k_val, v, beta, g,
    q_idx, q_val), flat)`` in the op's ``[P, T, *]`` layout; ``flat``: the inputs came as
    ``[P*T, *]``. Shapes are checked here in the caller's layout, so an error quotes what was passed
    (the bank's width, which this function does not see, is ``sdm_write_read``'s check)."""
    num_parallel = as_int(num_parallel)
    if isinstance(num_parallel, bool) or not isinstance(num_parallel, int) or num_parallel < 0:
        _fail("num_parallel", "an int >= 1 (0 only with no tokens)", repr(num_parallel))
    check_tensors([("k_idx", k_idx), ("k_val", k_val), ("v", v), ("beta", beta), ("g", g),
                   ("q_idx", q_idx), ("q_val", q_val)])
    if key_weighted_decay is not None and not isinstance(key_weighted_decay, bool):
        _fail("key_weighted_decay", "None, True or False", repr(key_weighted_decay))
    P = num_parallel
    if k_idx.dim() not in (2, 3):
        _fail("k_idx", "[P*T, W] or [P, T, W]", list(k_idx.shape))
    flat = k_idx.dim() == 2
    if flat:
        N = k_idx.shape[0]
        if N and not P:
            _fail("num_parallel", "an int >= 1 (0 only with no tokens)", P)
        if P and N % P:
            _fail("num_parallel", f"a divisor of the {N} tokens (k_idx.shape[0] = P*T)", P)
        T = N // P if P else 0
    else:
        if k_idx.shape[0] != P:
            _fail("num_parallel", f"k_idx.shape[0] = {k_idx.shape[0]} streams", P)
        T = k_idx.shape[1]
    W = k_idx.shape[-1]
    n_lead = 1 if flat else 2
    want = [P * T] if flat else [P, T]
    layout = "[P*T" if flat else "[P, T"

    def lead(name, t, trailing=None, what=""):
        """``t`` in the op's layout; its leading sizes those of k_idx and, where given, its
        last size ``trailing`` (explicit sizes, no -1: T = 0 leaves nothing to infer)."""
        if t.dim() != n_lead + 1 or list(t.shape[:n_lead]) != want or (
                trailing is not None and t.shape[-1] != trailing):
            sizes = ", ".join(str(n) for n in want + ["*" if trailing is None else trailing])
            _fail(name, f"shape [{sizes}] ({layout}, {what})", list(t.shape))
        return t.reshape(P, T, t.shape[-1])

    k_val = lead("k_val", k_val, W, "W] like k_idx")
    v = lead("v", v, None, "hd]")
    if q_idx.dim() != k_idx.dim():
        _fail("q_idx", f"{layout}, R] like k_idx's layout", list(q_idx.shape))
    R = q_idx.shape[-1]
    q_idx = lead("q_idx", q_idx, R, "R]")
    q_val = lead("q_val", q_val, R, "R] like q_idx")
    # beta: one value per token, with or without a trailing 1
    if beta.dim() == n_lead + 1 and beta.shape[-1] == 1:
        beta = lead("beta", beta, 1, "1]")[..., 0]
    elif beta.dim() == n_lead and list(beta.shape) == want:
        beta = beta.reshape(P, T)
    else:
        _fail("beta", f"one value per token: {want} or {want + [1]}", list(beta.shape))
    # g: one gate per token ([.., 1] or none) or per write slot ([.., W])
    widths = {True: (W,), False: (1,), None: (1, W)}[key_weighted_decay]
    if g.dim() == n_lead and list(g.shape) == want and 1 in widths:
        g = g.reshape(P, T, 1)
    elif g.dim() == n_lead + 1 and g.shape[-1] in widths:
        g = lead("g", g, g.shape[-1])
    else:
        per = {True: f"one gate per write slot {want + [W]} (W = {W}) with "
                     "key_weighted_decay=True",
               False: f"one gate per token {want} or {want + [1]} with key_weighted_decay=False",
               None: f"one gate per token {want} / {want + [1]} or per write slot "
                     f"{want + [W]} (W = {W})"}
        _fail("g", per[key_weighted_decay], list(g.shape))
    return (k_idx.reshape(P, T, W), k_val, v, beta, g, q_idx, q_val), flat


def _needs_grad(*ts: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def write_read(bank: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor, beta: Tensor, g: Tensor,
               q_idx: Tensor, q_val: Tensor, *, chunk_size: int = 64, slots_per_stream: int = 0,
               shared_bank: bool = False, snapshot_quant: str = "none",
               grad_bank_fp32: bool = False):
    """Functional form on ``[P, T, *]`` inputs: ``(readings [P, T, hd], final_bank)``.

    The bank is not modified. Differentiable in bank, k_val, v, beta, g and q_val. The
    backward's undo log is only kept when a gradient is needed.
    """
    check_tensors((("bank", bank), ("k_idx", k_idx), ("k_val", k_val), ("v", v),
                   ("beta", beta), ("g", g), ("q_idx", q_idx), ("q_val", q_val)))
    chunk_size, slots_per_stream = check_options(
        chunk_size, (("slots_per_stream", slots_per_stream),),
        (("shared_bank", shared_bank), ("grad_bank_fp32", grad_bank_fp32)), snapshot_quant)
    refuse_forward_ad((("bank", bank), ("k_val", k_val), ("v", v), ("beta", beta), ("g", g),
                       ("q_val", q_val)))
    save = _needs_grad(bank, k_val, v, beta, g, q_val)
    readings, final, _, _ = torch.ops.sdm.write_read(
        bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream, shared_bank,
        snapshot_quant, grad_bank_fp32, save)
    return readings, final


def write_read_gated(bank: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor, b_raw: Tensor,
                     a_raw: Tensor, A_log: Tensor, dt_bias: Tensor, q_idx: Tensor,
                     q_val: Tensor, *, chunk_size: int = 64, slots_per_stream: int = 0,
                     shared_bank: bool = False, snapshot_quant: str = "none",
                     grad_bank_fp32: bool = False):
    """``write_read`` with the gates computed inside the op from their raw inputs:
    ``beta = sigmoid(b_raw)``, ``g = -exp(A_log) * softplus(a_raw + dt_bias)`` (fp32).

    ``b_raw`` / ``a_raw``: ``[P, T]`` or a projection's ``[B, T, H]`` (stream ``b * H + h``);
    ``A_log`` / ``dt_bias``: ``[P]``. Returns ``(readings [P, T, hd], final_bank)``;
    differentiable in bank, k_val, v, b_raw, a_raw, A_log, dt_bias and q_val.
    """
    check_tensors((("bank", bank), ("k_idx", k_idx), ("k_val", k_val), ("v", v),
                   ("b_raw", b_raw), ("a_raw", a_raw), ("A_log", A_log),
                   ("dt_bias", dt_bias), ("q_idx", q_idx), ("q_val", q_val)))
    chunk_size, slots_per_stream = check_options(
        chunk_size, (("slots_per_stream", slots_per_stream),),
        (("shared_bank", shared_bank), ("grad_bank_fp32", grad_bank_fp32)), snapshot_quant)
    refuse_forward_ad((("bank", bank), ("k_val", k_val), ("v", v), ("b_raw", b_raw),
                       ("a_raw", a_raw), ("A_log", A_log), ("dt_bias", dt_bias), ("q_val", q_val)))
    save = _needs_grad(bank, k_val, v, b_raw, a_raw, A_log, dt_bias, q_val)
    readings, final, _, _ = torch.ops.sdm.write_read_gated(
        bank, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias, q_idx, q_val, chunk_size,
        slots_per_stream, shared_bank, snapshot_quant, grad_bank_fp32, save)
    return readings, final


def sdm_write_read(memory: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor, beta: Tensor,
                   g: Tensor, q_idx: Tensor, q_val: Tensor, *, chunk_size: int = 64,
                   num_memory_slots: int = 0, num_parallel: int = 1, snapshot_quant: str = "none",
                   key_weighted_decay: bool | None = None, shared_bank: bool = False,
                   grad_bank_fp32: bool = False) -> Tensor:
    """SDM write/read with ``memory`` advanced in place (the 2.0.0 interface).

    Inputs are ``[P*T, *]`` with ``num_parallel=P`` (or ``[P, T, *]``); returns the readings
    in the same leading layout. With gradients enabled they reach the initial ``memory``
    (its value at the call) and every float input.
    """
    if not isinstance(memory, Tensor):
        _fail("memory", "a tensor [S, hd]", type(memory).__name__)
    # integers as the ops take them (numpy and 0-d tensor integers too)
    chunk_size, num_memory_slots = check_options(
        chunk_size, (("num_memory_slots", num_memory_slots),),
        (("shared_bank", shared_bank), ("grad_bank_fp32", grad_bank_fp32)), snapshot_quant)
    (k_idx, k_val, v, beta, g, q_idx, q_val), flat = to_streams(
        num_parallel, k_idx, k_val, v, beta, g, q_idx, q_val, key_weighted_decay)
    if memory.dim() == 2 and v.shape[-1] != memory.shape[1]:   # in the caller's layout
        lead = [v.shape[0] * v.shape[1]] if flat else list(v.shape[:2])
        _fail("v", f"shape {lead + [memory.shape[1]]} (hd from the memory)",
              lead + [v.shape[-1]])
    # every check with this interface's names, on the dtypes as given (before the casts);
    # memory advances in place in either branch below
    check_call(memory, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, num_memory_slots,
               shared_bank, snapshot_quant, names=API_NAMES, in_place=True)
    dt = memory.dtype
    k_val, v, q_val = k_val.to(dt), v.to(dt), q_val.to(dt)
    beta, g = beta.float(), g.float()
    if _needs_grad(memory, k_val, v, beta, g, q_val):
        readings, final, _, _ = torch.ops.sdm.write_read(
            memory, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, num_memory_slots,
            shared_bank, snapshot_quant, grad_bank_fp32, True)
        with torch.no_grad():
            memory.copy_(final)
    else:
        readings = torch.ops.sdm.write_read_(memory, k_idx, k_val, v, beta, g, q_idx, q_val,
                                             chunk_size, num_memory_slots, shared_bank)
    return readings.flatten(0, 1) if flat else readings
