"""The ``torch.ops.sdm`` library: op definitions, fake impls, autograd, dispatch.

Ops (canonical layout of ``reference.py``: ``[P, T, *]`` inputs, global bank rows):

- ``sdm::write_read``: functional. ``(readings, final_bank, saved_rows, saved_scales)``;
  the last two are what the backward keeps besides the final bank: the undo log (the
  chunk-start value of each distinct row each chunk writes, ``[NC * P * C, W, width]``,
  stored per ``snapshot_quant``; ``quant.UndoLog``), empty when ``save_for_backward``
  is False, like the logsumexp output of ``aten::_scaled_dot_product_flash_attention``.
- ``sdm::write_read_``: advances the bank in place and returns the readings; saves
  nothing (the no-grad path).
- ``sdm::write_read_gated``: ``write_read`` with the gate prologue inside: raw gate
  inputs ``b_raw``, ``a_raw`` (``[P, T]`` or a projection's ``[B, T, H]``) and per-stream
  ``A_log``, ``dt_bias`` ``[P]``; ``beta = sigmoid(b)``,
  ``g = -exp(A_log) * softplus(a + dt_bias)`` (``gates.py``). On CUDA the prep kernel of
  Phase 1 computes them; the backward recomputes them with torch ops and chains the
  gradients of ``write_read_backward`` through them.
- ``sdm::write_read_backward``: gradients for (bank, k_val, v, beta, g, q_val), from the
  final bank and the undo log (it rebuilds each chunk's start state in reverse).
- ``sdm::split_heads`` / ``sdm::merge_heads`` / ``sdm::expand_bank``: layout helpers.

An eager forward that saves for a backward may also hand its implementation's
intermediates (CUDA: Phase 1's plan and ``v - r0``) to its own backward through the
autograd context (``kept.keep_for_backward``), so the backward does not recompute them (a
traced graph whose kernels are emitted hands them through the graph: ``lowerings``). That
is an optimisation only: a backward without them (a direct call of ``write_read_backward``)
recomputes the same values.

Device implementations register themselves in ``IMPLS``: CPU here (``cpu.py``), CUDA by
``sdm_inductor.kernels`` whenever Triton is importable (no GPU needed to register).
"""
from __future__ import annotations

import contextlib
import functools
import math
import threading

import torch
from torch import Tensor

from . import cpu, frames, gates, kept, quant
from . import validation
from .validation import (DeferredIndexCheck, check_backward, check_call, check_gated,
                         start_index_check)

__all__ = ["IMPLS", "last_dispatch", "repeated_write_slots", "count_repeated_write_slots"]


class _State:
    repeats_of: tuple | None = None   # (k_idx of the last eager call, its version)
    dispatch: dict = {}


_STATE = _State()

# device type -> object with forward(...) / backward(...) like ``cpu``; CUDA registers here.
IMPLS: dict[str, object] = {"cpu": cpu}

# Index checks read data (a host sync on CUDA); on CUDA they can be switched off.
CHECK_INDICES: dict[str, bool] = {"cpu": True, "cuda": True}

# the index check of the eager call in progress, when its implementation waits for it
# itself (``AWAITS_INDEX_CHECK``) before its first write to the bank
_PENDING = threading.local()


def begin_index_check() -> None:
    """Implementations call this beside work that writes nothing (Phase 1): the index check
    of the current call starts now, on a stream of its own
    (``validation.DeferredIndexCheck``), so the verdict does not wait for that work on the
    GPU, and the implementation chooses where the check's host time goes."""
    check = getattr(_PENDING, "check", None)
    if check is not None:
        check.start()


def await_index_check() -> None:
    """Implementations call this before their first write to the bank: it waits for the
    index check of the current call (starting it if ``begin_index_check`` did not) and
    raises if it failed. Work queued before it must not write the bank (Phase 1, the
    functional form's copy)."""
    check = getattr(_PENDING, "check", None)
    _PENDING.check = None
    if check is not None:
        check.wait()


@contextlib.contextmanager
def _op_body():
    """The body of an eager op: its index check has been waited for when the body ends
    (an implementation path that never called ``await_index_check`` still raises), and
    none is left behind for a later call when the body fails. Called from a compiled
    graph, its host code runs under CPython's own frame evaluation (``frames``)."""
    with frames.plain_frames():
        try:
            yield
            await_index_check()
        finally:
            _PENDING.check = None


def last_dispatch() -> dict:
    """The launch decisions of the last eager sdm call (implementation, sizes, chunking)."""
    return dict(_STATE.dispatch)


def record_dispatch(**info) -> None:
    """Implementations add their launch decisions to the record of the current call."""
    _STATE.dispatch.update(info)


def count_repeated_write_slots(k_idx: Tensor) -> Tensor:
    """Number of write entries that repeat a slot already written by the same token."""
    count = torch.zeros((), dtype=torch.long, device=k_idx.device)
    if k_idx.dim() < 2:
        k_idx = k_idx.view(1, -1)
    # after a sort along W, each repeat sits right after an equal slot: O(W log W) per
    # token and no W x W comparison; windows of tokens bound the sorted copy
    for _, win in validation.token_windows(k_idx):
        s = win.sort(dim=-1).values
        count += (s[..., 1:] == s[..., :-1]).sum()
    return count


def repeated_write_slots(k_idx: Tensor | None = None) -> int:
    """Repeated write slots in ``k_idx``, or in the last eager sdm call when none is given.

    Repeats are legal (dense-key meaning, spec section 1) but usually a bug upstream.
    """
    if k_idx is not None:
        return int(count_repeated_write_slots(k_idx))
    if _STATE.repeats_of is None:
        return 0
    # counted on request: a count per call (a sort of k_idx) cost ~0.3 ms at config A
    idx, version = _STATE.repeats_of
    if version is not None and kept.version(idx) != version:
        raise RuntimeError(
            "sdm: repeated_write_slots(): the k_idx of the last sdm call was modified in "
            "place since that call; pass the k_idx to count as an argument")
    return int(count_repeated_write_slots(idx))


def _impl(bank: Tensor):
    impl = IMPLS.get(bank.device.type)
    if impl is None:
        raise NotImplementedError(
            f"sdm: no implementation for device '{bank.device.type}' "
            f"(available: {sorted(IMPLS)}; CUDA needs triton)")
    return impl


def _prepare(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream,
             shared_bank, snapshot_quant, in_place=False):
    check_call(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream,
               shared_bank, snapshot_quant, in_place=in_place)
    _prepare_data(bank, k_idx, q_idx, chunk_size, slots_per_stream, snapshot_quant,
                  per_write_gate=g.shape[2] == k_idx.shape[2] and k_idx.shape[2] > 1)


def capturing(t: Tensor) -> bool:
    """A CUDA-graph capture is recording this call (e.g. a compiled graph's extern call
    under mode="reduce-overhead"): the index checks' host sync would break the capture,
    so they run in the eager calls before it (warm-up) and the kernels mask out-of-range
    rows in the replays; nothing of the call is kept past it (``repeated_write_slots``
    then counts only when given the indices; the CUDA forward offers no kept Phase 1).
    CPU tensors (the interpreter runs the CUDA host code on them): never."""
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _prepare_data(bank, k_idx, q_idx, chunk_size, slots_per_stream, snapshot_quant,
                  per_write_gate):
    """The checks that read data and the dispatch record of a call; the repeat count's
    source (``repeated_write_slots``)."""
    kept.drop_offer()   # an untaken offer of an earlier call is never held past this one
    recording = capturing(bank)
    if CHECK_INDICES.get(bank.device.type, True) and not recording:
        impl = _impl(bank)
        start = functools.partial(start_index_check, bank.shape[0], k_idx.shape[0],
                                  slots_per_stream, k_idx, q_idx,
                                  getattr(impl, "range_flags", None))
        if getattr(impl, "AWAITS_INDEX_CHECK", False):
            _PENDING.check = DeferredIndexCheck(start, bank.device)
        else:
            start().wait()
    # a recorded call's k_idx lives in the graph's memory pool: never held past the call
    _STATE.repeats_of = None if recording else (k_idx, kept.version(k_idx))
    P, T, W = k_idx.shape
    _STATE.dispatch = dict(
        device=str(bank.device), impl=getattr(_impl(bank), "NAME", "?"), P=P, T=T, W=W,
        R=q_idx.shape[2], hd=bank.shape[1], slots=bank.shape[0], chunk_size=chunk_size,
        n_chunks=math.ceil(T / chunk_size), per_write_gate=per_write_gate,
        bank_dtype=str(bank.dtype), snapshot_quant=snapshot_quant)


def _saved_shapes(bank: Tensor, k_idx: Tensor, chunk_size: int, snapshot_quant: str,
                  save: bool):
    P, T, W = k_idx.shape
    hd = bank.shape[1]
    dtype, width, scaled = quant.storage(snapshot_quant, bank.dtype, hd)
    # segments x C: never 1, so traced code gets no size-1 guard on a symbolic length
    n = ((T + chunk_size - 1) // chunk_size) * P * chunk_size if save else 0
    rows = (n, W, width)
    return rows, dtype, ((n, W) if scaled and save else (0,))


# ---------------------------------------------------------------- write_read (functional)

@torch.library.custom_op("sdm::write_read", mutates_args=())
def write_read(bank: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor, beta: Tensor, g: Tensor,
               q_idx: Tensor, q_val: Tensor, chunk_size: int = 64, slots_per_stream: int = 0,
               shared_bank: bool = False, snapshot_quant: str = "none",
               grad_bank_fp32: bool = False, save_for_backward: bool = True
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Functional SDM write/read: (readings [P,T,hd], final bank, saved rows, saved scales)."""
    with _op_body():
        _prepare(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream,
                 shared_bank, snapshot_quant)
        final = bank.clone(memory_format=torch.contiguous_format)
        readings, rows, scales = _impl(bank).forward(
            final, k_idx, k_val.to(bank.dtype), v.to(bank.dtype), beta.float(), g.float(),
            q_idx, q_val.to(bank.dtype), chunk_size, snapshot_quant, save_for_backward)
    kept.register_by_log(readings, rows, final, (k_idx, k_val, v, beta, g, q_idx, q_val))
    return readings, final, rows, scales


def _fake_outputs(bank, k_idx, chunk_size, snapshot_quant, save_for_backward):
    """(readings, final bank, saved rows, saved scales) of ``write_read`` and its gated
    form, by shape only."""
    P, T, _ = k_idx.shape
    readings = bank.new_empty(P, T, bank.shape[1])
    rows, dtype, scales = _saved_shapes(bank, k_idx, chunk_size, snapshot_quant,
                                        save_for_backward)
    return (readings, torch.empty_like(bank, memory_format=torch.contiguous_format),
            bank.new_empty(rows, dtype=dtype),
            bank.new_empty(scales, dtype=torch.float32))


@write_read.register_fake
def _(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size=64, slots_per_stream=0,
      shared_bank=False, snapshot_quant="none", grad_bank_fp32=False, save_for_backward=True):
    check_call(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream,
               shared_bank, snapshot_quant)
    return _fake_outputs(bank, k_idx, chunk_size, snapshot_quant, save_for_backward)


def _setup_context(ctx, inputs, output):
    (bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream, shared_bank,
     snapshot_quant, grad_bank_fp32, save) = inputs
    readings, final, rows, scales = output
    ctx.save_for_backward(final, rows, scales, k_idx, k_val, v, beta, g, q_idx, q_val)
    ctx.kept = kept.take(readings)
    ctx.options = (chunk_size, snapshot_quant, grad_bank_fp32, save)
    ctx.dtypes = (k_val.dtype, v.dtype, beta.dtype, g.dtype, q_val.dtype)
    _no_grads_for_the_log(ctx, rows, scales)


def _no_grads_for_the_log(ctx, rows, scales):
    # the undo log is not differentiable; with gradients materialized, autograd filled a
    # zero gradient of its size (1.6 GB at config A) for every backward
    ctx.mark_non_differentiable(rows, scales)
    ctx.set_materialize_grads(False)


def _take_kept(ctx):
    """What the forward kept, for this backward: the context lets go of it, so it is freed
    when the backward ends, as the saved tensors are, and not only when the graph goes (in
    a loop that holds its loss until the next step, after the next forward: two steps'
    worth held). A second backward through a retained graph finds it by the undo log the
    graph still holds (``kept.kept_by_log``), or recomputes the same values."""
    obj, ctx.kept = getattr(ctx, "kept", None), None
    return obj


def _grads_in(grad_readings, grad_final, final, k_idx):
    """The incoming gradients, zeros for an output the loss did not use."""
    if grad_readings is None:
        grad_readings = final.new_zeros(k_idx.shape[0], k_idx.shape[1], final.shape[1])
    return grad_readings, torch.zeros_like(final) if grad_final is None else grad_final


def _backward(ctx, grad_readings, grad_final, _grad_rows, _grad_scales):
    final, rows, scales, k_idx, k_val, v, beta, g, q_idx, q_val = ctx.saved_tensors
    grad_readings, grad_final = _grads_in(grad_readings, grad_final, final, k_idx)
    chunk_size, snapshot_quant, grad_bank_fp32, save = ctx.options
    if not save:
        raise RuntimeError(
            "sdm::write_read was called with save_for_backward=False, so it kept nothing for a "
            "backward; call it with save_for_backward=True (sdm_inductor.sdm_write_read does this "
            "whenever a gradient is needed)")
    with kept.backward_with(_take_kept(ctx)):
        grads = torch.ops.sdm.write_read_backward(
            grad_readings, grad_final, final, rows, scales, k_idx, k_val, v, beta, g, q_idx,
            q_val, chunk_size, snapshot_quant, grad_bank_fp32)
    d_bank, d_kval, d_v, d_beta, d_g, d_qval = grads
    d_g = gates.floor_grad(d_g, g)   # the implementations floor the gates they read
    return (d_bank, None, d_kval.to(ctx.dtypes[0]), d_v.to(ctx.dtypes[1]), d_beta.to(ctx.dtypes[2]),
            d_g.to(ctx.dtypes[3]), None, d_qval.to(ctx.dtypes[4]),
            None, None, None, None, None, None)


write_read.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------- write_read_gated

def _check_gated_call(bank, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias, q_idx, q_val,
                      chunk_size, slots_per_stream, shared_bank, snapshot_quant):
    check_call(bank, k_idx, k_val, v, None, None, q_idx, q_val, chunk_size, slots_per_stream,
               shared_bank, snapshot_quant, gated=True)
    check_gated(bank, k_idx, b_raw, a_raw, A_log, dt_bias)


@torch.library.custom_op("sdm::write_read_gated", mutates_args=())
def write_read_gated(bank: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor, b_raw: Tensor,
                     a_raw: Tensor, A_log: Tensor, dt_bias: Tensor, q_idx: Tensor,
                     q_val: Tensor, chunk_size: int = 64, slots_per_stream: int = 0,
                     shared_bank: bool = False, snapshot_quant: str = "none",
                     grad_bank_fp32: bool = False, save_for_backward: bool = True
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``write_read`` with ``beta = sigmoid(b_raw)`` and
    ``g = -exp(A_log) * softplus(a_raw + dt_bias)`` computed inside (fp32).

    ``b_raw`` / ``a_raw``: ``[P, T]`` or ``[B, T, H]`` (stream ``b * H + h``), the same
    shape; ``A_log`` / ``dt_bias``: ``[P]``. Outputs as ``write_read``'s.
    """
    _check_gated_call(bank, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias, q_idx, q_val,
                      chunk_size, slots_per_stream, shared_bank, snapshot_quant)
    with _op_body():
        _prepare_data(bank, k_idx, q_idx, chunk_size, slots_per_stream, snapshot_quant, False)
        final = bank.clone(memory_format=torch.contiguous_format)
        impl = _impl(bank)
        dt = bank.dtype
        fused = getattr(impl, "forward_gated", None)
        if fused is not None:   # CUDA: the prep kernel computes the gates
            readings, rows, scales = fused(
                final, k_idx, k_val.to(dt), v.to(dt), b_raw, a_raw, A_log, dt_bias, q_idx,
                q_val.to(dt), chunk_size, snapshot_quant, save_for_backward)
        else:
            record_dispatch(gates="torch")
            beta, g = gates.torch_gates(b_raw, a_raw, A_log, dt_bias)
            readings, rows, scales = impl.forward(
                final, k_idx, k_val.to(dt), v.to(dt), beta, g, q_idx, q_val.to(dt), chunk_size,
                snapshot_quant, save_for_backward)
    # a compiled graph's backward (``_backward_gated``, traced) finds the offer by the log
    kept.register_by_log(readings, rows, final, (k_idx, k_val, v, None, None, q_idx, q_val))
    return readings, final, rows, scales


@write_read_gated.register_fake
def _(bank, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias, q_idx, q_val, chunk_size=64,
      slots_per_stream=0, shared_bank=False, snapshot_quant="none", grad_bank_fp32=False,
      save_for_backward=True):
    _check_gated_call(bank, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias, q_idx, q_val,
                      chunk_size, slots_per_stream, shared_bank, snapshot_quant)
    return _fake_outputs(bank, k_idx, chunk_size, snapshot_quant, save_for_backward)


def _setup_gated(ctx, inputs, output):
    (bank, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias, q_idx, q_val, chunk_size,
     slots_per_stream, shared_bank, snapshot_quant, grad_bank_fp32, save) = inputs
    readings, final, rows, scales = output
    ctx.save_for_backward(final, rows, scales, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias,
                          q_idx, q_val)
    ctx.kept = kept.take(readings)
    ctx.options = (chunk_size, snapshot_quant, grad_bank_fp32, save)
    ctx.dtypes = (k_val.dtype, v.dtype, q_val.dtype)
    _no_grads_for_the_log(ctx, rows, scales)


def _backward_gated(ctx, grad_readings, grad_final, _grad_rows, _grad_scales):
    (final, rows, scales, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias, q_idx,
     q_val) = ctx.saved_tensors
    grad_readings, grad_final = _grads_in(grad_readings, grad_final, final, k_idx)
    chunk_size, snapshot_quant, grad_bank_fp32, save = ctx.options
    if not save:
        raise RuntimeError(
            "sdm::write_read_gated was called with save_for_backward=False, so it kept nothing "
            "for a backward; call it with save_for_backward=True (sdm_inductor.api."
            "write_read_gated does this whenever a gradient is needed)")
    # the gates again, with torch ops (the forward computed them inside the kernel)
    beta, g = gates.torch_gates(b_raw, a_raw, A_log, dt_bias)
    with kept.backward_with(_take_kept(ctx)):
        d_bank, d_kval, d_v, d_beta, d_g, d_qval = torch.ops.sdm.write_read_backward(
            grad_readings, grad_final, final, rows, scales, k_idx, k_val, v, beta, g, q_idx,
            q_val, chunk_size, snapshot_quant, grad_bank_fp32)
    d_b, d_a, d_A_log, d_dt_bias = gates.gate_grads(d_beta, d_g, beta, g, b_raw, a_raw, A_log,
                                                    dt_bias)
    return (d_bank, None, d_kval.to(ctx.dtypes[0]), d_v.to(ctx.dtypes[1]), d_b, d_a, d_A_log,
            d_dt_bias, None, d_qval.to(ctx.dtypes[2]), None, None, None, None, None, None)


write_read_gated.register_autograd(_backward_gated, setup_context=_setup_gated)


# ---------------------------------------------------------------- backward op

def _check_backward(grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx,
                    k_val, v, beta, g, q_idx, q_val, chunk_size, snapshot_quant):
    check_backward(grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx, k_val,
                   v, beta, g, q_idx, q_val, chunk_size, snapshot_quant,
                   lambda mode: _saved_shapes(grad_final, k_idx, chunk_size, mode, True))


@torch.library.custom_op("sdm::write_read_backward", mutates_args=())
def write_read_backward(grad_readings: Tensor, grad_final: Tensor, final_bank: Tensor,
                        saved_rows: Tensor, saved_scales: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor,
                        beta: Tensor, g: Tensor, q_idx: Tensor, q_val: Tensor, chunk_size: int,
                        snapshot_quant: str, grad_bank_fp32: bool
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients (bank, k_val, v, beta, g, q_val) of sdm::write_read (``final_bank``: its
    final bank output; ``saved_rows`` / ``saved_scales``: its undo log)."""
    with frames.plain_frames():
        _check_backward(grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx,
                        k_val, v, beta, g, q_idx, q_val, chunk_size, snapshot_quant)
        dtype = grad_final.dtype
        # an eager autograd call's (its context), or by the log's identity
        offer = kept.kept_for_backward()
        if offer is None:
            offer = kept.kept_by_log(saved_rows, final_bank,
                                     (k_idx, k_val, v, beta, g, q_idx, q_val))
        with kept.backward_with(offer):
            return _impl(grad_final).backward(
                grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx,
                k_val.to(dtype), v.to(dtype), beta.float(), g.float(), q_idx, q_val.to(dtype),
                chunk_size, snapshot_quant, grad_bank_fp32)


@write_read_backward.register_fake
def _(grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx, k_val, v, beta, g,
      q_idx, q_val, chunk_size, snapshot_quant, grad_bank_fp32):
    _check_backward(grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx,
                    k_val, v, beta, g, q_idx, q_val, chunk_size, snapshot_quant)
    dt = grad_final.dtype
    # the implementations return the gate gradients contiguous whatever the gates' strides
    # (a traced graph may hand a transposed view: the layer's [B, T, H] gates per stream)
    return (torch.empty_like(grad_final), k_val.new_empty(k_val.shape, dtype=dt),
            v.new_empty(v.shape, dtype=dt), beta.new_empty(beta.shape, dtype=torch.float32),
            g.new_empty(g.shape, dtype=torch.float32), q_val.new_empty(q_val.shape, dtype=dt))


# ---------------------------------------------------------------- write_read_ (in place)

@torch.library.custom_op("sdm::write_read_", mutates_args=("bank",))
def write_read_(bank: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor, beta: Tensor, g: Tensor,
                q_idx: Tensor, q_val: Tensor, chunk_size: int = 64, slots_per_stream: int = 0,
                shared_bank: bool = False) -> Tensor:
    """Advance ``bank`` in place through the tokens; return the readings [P, T, hd]."""
    with _op_body():
        _prepare(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream,
                 shared_bank, "none", in_place=True)
        readings, _, _ = _impl(bank).forward(
            bank, k_idx, k_val.to(bank.dtype), v.to(bank.dtype), beta.float(), g.float(),
            q_idx, q_val.to(bank.dtype), chunk_size, "none", False)
    return readings


@write_read_.register_fake
def _(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size=64, slots_per_stream=0,
      shared_bank=False):
    check_call(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, slots_per_stream,
               shared_bank, "none")
    P, T, _ = k_idx.shape
    return bank.new_empty(P, T, bank.shape[1])


# ---------------------------------------------------------------- layout helpers

def _check_heads(name: str, x: Tensor, num_heads: int, dim: int):
    if not isinstance(x, Tensor):   # (a schema's Tensor argument takes None from Python)
        validation._fail("x", f"a 3-D tensor ({name})", type(x).__name__)
    if x.dim() != 3:
        validation._fail("x", f"a 3-D tensor ({name})", f"shape {list(x.shape)}")
    if num_heads < 1 or x.shape[dim] % num_heads:
        validation._fail("num_heads", f"a positive divisor of dim {dim} ({x.shape[dim]}) of x "
                         f"({name})", num_heads)


@torch.library.custom_op("sdm::split_heads", mutates_args=())
def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``b t (h k) -> (b h) t k``."""
    _check_heads("split_heads", x, num_heads, 2)
    B, T, HK = x.shape
    return x.reshape(B, T, num_heads, HK // num_heads).permute(0, 2, 1, 3).reshape(
        B * num_heads, T, HK // num_heads).clone()


@split_heads.register_fake
def _(x, num_heads):
    _check_heads("split_heads", x, num_heads, 2)
    B, T, HK = x.shape
    return x.new_empty(B * num_heads, T, HK // num_heads)


@torch.library.custom_op("sdm::merge_heads", mutates_args=())
def merge_heads(x: Tensor, num_heads: int) -> Tensor:
    """``(b h) t k -> b t (h k)``."""
    _check_heads("merge_heads", x, num_heads, 0)
    BH, T, K = x.shape
    return x.reshape(BH // num_heads, num_heads, T, K).permute(0, 2, 1, 3).reshape(
        BH // num_heads, T, num_heads * K).clone()


@merge_heads.register_fake
def _(x, num_heads):
    _check_heads("merge_heads", x, num_heads, 0)
    BH, T, K = x.shape
    return x.new_empty(BH // num_heads, T, num_heads * K)


split_heads.register_autograd(
    lambda ctx, grad: (torch.ops.sdm.merge_heads(grad, ctx.num_heads), None),
    setup_context=lambda ctx, inputs, output: setattr(ctx, "num_heads", inputs[1]))
merge_heads.register_autograd(
    lambda ctx, grad: (torch.ops.sdm.split_heads(grad, ctx.num_heads), None),
    setup_context=lambda ctx, inputs, output: setattr(ctx, "num_heads", inputs[1]))


def _check_expand(bank: Tensor, batch: int):
    if not isinstance(bank, Tensor):
        validation._fail("bank", "a tensor [S, hd] (expand_bank)", type(bank).__name__)
    if bank.dim() != 2:
        validation._fail("bank", "a tensor [S, hd] (expand_bank)", f"shape {list(bank.shape)}")
    if batch < 0:
        validation._fail("batch", "an int >= 0 (expand_bank)", batch)


@torch.library.custom_op("sdm::expand_bank", mutates_args=())
def expand_bank(bank: Tensor, batch: int) -> Tensor:
    """A per-batch private copy of a learned bank: ``[S, hd] -> [batch * S, hd]``."""
    _check_expand(bank, batch)
    return bank.repeat(batch, 1)


@expand_bank.register_fake
def _(bank, batch):
    _check_expand(bank, batch)
    return bank.new_empty(batch * bank.shape[0], bank.shape[1])


def _expand_backward(ctx, grad):
    # summed over the batch in a fixed order: deterministic
    return grad.view(ctx.batch, *ctx.bank_shape).sum(0), None


def _setup_expand(ctx, inputs, output):
    ctx.batch, ctx.bank_shape = inputs[1], tuple(inputs[0].shape)


expand_bank.register_autograd(_expand_backward, setup_context=_setup_expand)
