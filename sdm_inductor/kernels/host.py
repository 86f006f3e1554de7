"""Host side of the CUDA implementation: which path and walk a call takes, its buffers, the
IMPLS interface.

Everything here depends on shapes only: no ``.item()``, no host sync, no data-dependent
Python, so the same functions serve the eager op (``IMPLS['cuda']``), CUDA-graph capture
and the ``triton_op`` bodies that Inductor traces (``triton_ops.py``). The one choice that
depends on how a call runs is the walk (``walk_kind``): eager calls loop over the chunks
on the host (the step walks; small shapes take the column walks, ``launch.column_suits``),
traced calls launch one kernel for all chunks (the queue walks; small shapes the column
walks).
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from .. import kept, quant
from ..validation import no_work
from . import backward as bwd
from . import index_ranges
from .backward import Kept
from .config import CONFIG
from .forward.column_walk import column_walk
from .forward.decode import DECODE_MAX_T, decode
from .forward.queue_walk import queue_walk
from .forward.quantize import pack_log
from .forward.step_walk import step_walk
from .phase1 import plan
from .runtime import graphs
from .runtime import launch as runtime_launch
from .runtime.launch import arg_key, dense, direct_launches, pow2
from .runtime.pipeline import ahead, token_windows

__all__ = ["CONFIG", "NAME", "backward", "forward", "forward_gated", "forward_kept",
           "forward_once", "range_flags", "raw_gate_layout", "saved_buffers", "walk_kind"]


def _dummy(like: torch.Tensor) -> torch.Tensor:
    """A placeholder pointer argument for a kernel branch that is compiled out."""
    return torch.empty(1, dtype=like.dtype, device=like.device)


NAME = "cuda-triton-chunked"
# the index check's range part in one launch (``validation.start_index_check``)
range_flags = index_ranges.range_flags
# the ops hand over the index check; the chunked paths start it beside Phase 1 (``_plan``:
# on a stream of its own), the decode path at its wait, and every path waits for it before
# the first write to the bank (``_await_index_check``)
AWAITS_INDEX_CHECK = True


def _begin_index_check():
    from .. import ops
    ops.begin_index_check()


def _await_index_check():
    from .. import ops
    ops.await_index_check()


def _prec(dtype: torch.dtype) -> str:
    # fp32 banks: exact fp32 products (1e-4 contract); bf16 banks: tf32 is far inside 2e-2
    return "ieee" if dtype == torch.float32 else "tf32"


def _contig(*xs):
    return tuple(dense(x) for x in xs)


def rows_in_place(fn):
    """``fn(bank, ...)``, which advances ``bank`` in place, for any bank layout: the kernels
    address row ``r`` at ``r * hd``, so a bank laid out otherwise (a column slice of a wider
    tensor, a transposed one) runs on a contiguous copy that is copied back; without that
    they would compute on the wrong elements and write past the view's columns."""
    @functools.wraps(fn)
    def run(bank: Tensor, *args, **kwargs):
        if bank.is_contiguous():
            return fn(bank, *args, **kwargs)
        work = bank.contiguous()
        out = fn(work, *args, **kwargs)
        bank.copy_(work)
        return out
    return run


def chunked_forward(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, C: int,
                    saved: Tensor | None, gate_params=None, keep: bool = False,
                    raw_log: bool = True):
    """Phase 1 + the Phase 2 walk for the whole sequence; advances ``bank``, returns the
    readings and what a backward would otherwise recompute (``Kept``) with ``keep``, else None.

    ``saved`` ([NC*P*C, W, hd], chunk-major like ``ops._saved_shapes``) receives the undo
    log when given: the chunk-start value of each distinct row a chunk writes. ``v - r0``
    is kept where the backward's walk reads it: the step and queue walks over a ``raw_log``
    (``backward.dispatch.reverse_kind``).
    """
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    S, hd = bank.shape
    pl = _plan(S, k_idx, k_val, beta, g, q_idx, q_val, C, gate_params,
               replay=saved is None and not keep)
    out = torch.empty(P, T, hd, dtype=bank.dtype, device=bank.device)
    # never alias the bank: Inductor treats every pointer argument as possibly written
    # and would clone the two separately (the last copy-back wins)
    saved_arg = _dummy(bank) if saved is None else saved
    kind = walk_kind(C, bank, P, W, R)
    vmr = _vmr_buffer(pl, bank) if keep and raw_log and kind in ("step", "queue") else None
    _await_index_check()
    if kind == "column":
        column_walk(bank, pl, v, out, saved_arg, saved is not None, CONFIG, _prec(bank.dtype))
    else:
        walk = step_walk if kind == "step" else queue_walk
        walk(bank, pl, v, out, saved_arg, saved is not None, CONFIG, _prec(bank.dtype), vmr)
    return out, (Kept(pl, vmr) if keep else None)


def _plan(S: int, k_idx, k_val, beta, g, q_idx, q_val, C: int, gate_params, replay: bool):
    """Phase 1 (``phase1.plan``). With ``replay`` (a call that keeps nothing of its plan past
    itself: no-grad), from a CUDA graph once the same inputs come again
    (``graphs.made``: ``CONFIG["PLAN_GRAPHS"]`` graphs at most).

    The call's index check starts beside it: before Phase 1's ~20 launches (no ``replay``),
    whose host time outlasts the check's; with ``replay`` after ``graphs.made``, so a
    replay's one launch need not wait for the check's host time (where ``made`` makes the
    plan eagerly, the check follows its launches)."""
    make = lambda: plan(S, k_idx, k_val, beta, g, q_idx, q_val, C, gate_params)
    inputs = (k_idx, k_val, beta, g, q_idx, q_val, *(gate_params or ()))
    if not replay or any(is_fake(t) for t in inputs):   # traced: no pointers to key on
        _begin_index_check()
        return make()
    key = ("plan", S, C, gate_params is not None,
           tuple((arg_key(t), tuple(t.shape), t.stride()) for t in inputs))
    pl = graphs.made(key, make, k_idx.device, CONFIG["PLAN_GRAPHS"])
    _begin_index_check()
    return pl


def _vmr_buffer(pl, bank: Tensor) -> Tensor:
    """The ``[NC * P, CP, hd]`` fp32 buffer (chunk-major) in which a walk keeps ``v - r0``
    for the backward. No dimension of the chunk count alone: a traced graph would ask
    whether it is 1 (the tensor's contiguity), a guard that recompiles at the second chunk."""
    return torch.empty(pl.NC * pl.P, pow2(pl.C), bank.shape[1], dtype=torch.float32,
                       device=bank.device)


def walk_kind(C: int, bank: Tensor, P: int, W: int, R: int) -> str:
    """The Phase 2 walk of a call on ``bank`` with ``P`` streams and ``W`` / ``R`` slots per
    token (``launch.walk_kind``)."""
    return runtime_launch.walk_kind(CONFIG, bank, (P, W, R, C))


def saved_buffers(bank: Tensor, P: int, T: int, W: int, C: int, mode: str, save: bool):
    """(buffer the kernel writes or None, final rows or None, scales or None).

    The final tensors have the layout of ``ops._saved_shapes``. Modes with per-row scales
    need whole rows, which no column-block program sees: the kernel stores raw rows and
    ``quantize.pack_log`` packs them afterwards (the None entries).
    """
    hd = bank.shape[1]
    dtype, width, scaled = quant.storage(mode, bank.dtype, hd)
    if not save:
        return None, bank.new_empty(0, W, width, dtype=dtype), bank.new_empty(
            0, dtype=torch.float32)
    n = -(-T // C) * P * C   # C * W rows per segment; those past its count stay unset
    if scaled:   # the unset rows stay unset (unspecified, as in the unscaled log): packing
        # quantizes whatever they hold, and no backward reads them
        return bank.new_empty(n, W, hd), None, None
    rows = bank.new_empty(n, W, width, dtype=dtype)
    return rows, rows, bank.new_empty(0, dtype=torch.float32)


def forward_once(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size: int,
                 snapshot_quant: str, save: bool, gate_params=None):
    """One pass over the whole sequence: (readings, saved rows, saved scales). Traceable.

    With ``gate_params = (A_log, dt_bias)``, ``beta`` / ``g`` are the raw gate inputs
    ``[Bg, T, GH]`` that the prep kernel reads through their strides (in place when eager;
    a traced call copies them to contiguous first, below)."""
    return forward_kept(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size,
                        snapshot_quant, save, gate_params, keep=False)[:3]


@rows_in_place
def forward_kept(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size: int,
                 snapshot_quant: str, save: bool, gate_params=None, keep: bool = True):
    """``forward_once`` and, fourth, what a backward of the call would otherwise recompute
    (``Kept``: the plan, and ``v - r0`` where the backward's walk reads it) when ``keep``
    and the call saves for a backward and made a plan, else None. A traced forward hands
    its tensors (``Kept.tensors``) to the traced backward as values of the graph
    (``lowerings.write_read``)."""
    k_idx, k_val, v, q_idx, q_val = _contig(k_idx, k_val, v, q_idx, q_val)
    if gate_params is None or is_fake(beta) or is_fake(g):
        # a traced call's raw gates are copied dense too, and the prep kernel gets strides
        # computed from their sizes (``dense``, ``phase1.entries.gate_strides``); an eager call's
        # are read in place through their strides
        beta, g = _contig(beta, g)
    if gate_params is not None:
        gate_params = _contig(*gate_params)
    P, T, W = k_idx.shape
    raw, rows, scales = saved_buffers(bank, P, T, W, chunk_size, snapshot_quant, save)
    kept_values = None
    if no_work(bank, k_idx):
        out = bank.new_zeros(P, T, bank.shape[1])
    elif not save and T <= DECODE_MAX_T:
        _await_index_check()
        out = decode(bank, k_idx, k_val, v, beta, g, q_idx, q_val, CONFIG, gate_params)
    else:
        out, kept_values = chunked_forward(bank, k_idx, k_val, v, beta, g, q_idx, q_val,
                                           chunk_size, raw, gate_params, keep and save,
                                           bwd.raw_log(snapshot_quant))
    if rows is None:
        rows, scales = pack_log(raw, snapshot_quant, bank.dtype)
    return out, rows, scales, kept_values


@direct_launches
@rows_in_place
def forward(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size: int,
            snapshot_quant: str, save: bool, gate_params=None):
    """``IMPLS`` interface: advance ``bank`` in place; (readings, saved rows, saved scales).

    With ``gate_params`` the gates are computed in the prep kernel (``forward_gated``)."""
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    C = chunk_size
    path = ("empty" if no_work(bank, k_idx) else
            "decode" if (not save and T <= DECODE_MAX_T) else "chunked")
    walk = walk_kind(C, bank, P, W, R) if path == "chunked" else None
    step = walk == "step"
    tokens = CONFIG["TRAIN_WINDOW_TOKENS"] if save else CONFIG["WINDOW_TOKENS"]
    windowed = path == "chunked" and (not save or (step and tokens > 0))
    wins = token_windows(T, C, tokens) if windowed else [(0, T)]
    windows = len(wins)
    _record(path, windows, bank, walk)
    if step:
        return _step_forward(bank, k_idx, k_val, v, beta, g, q_idx, q_val, C, snapshot_quant,
                             save, gate_params, wins)
    if windows == 1:
        readings, rows, scales, keep = forward_kept(
            bank, k_idx, k_val, v, beta, g, q_idx, q_val, C, snapshot_quant, save, gate_params,
            keep=_keeps(bank))
        if keep is not None:
            kept.keep_for_backward(readings, keep)
        return readings, rows, scales
    readings = bank.new_empty(P, T, bank.shape[1])
    for t0, t1 in wins:
        sl = slice(t0, t1)
        readings[:, sl] = forward_once(bank, k_idx[:, sl], k_val[:, sl], v[:, sl], beta[:, sl],
                                       g[:, sl], q_idx[:, sl], q_val[:, sl], C, "none", False,
                                       gate_params)[0]
    _, empty_rows, empty_scales = saved_buffers(bank, P, T, k_idx.shape[2], C, snapshot_quant,
                                                False)
    return readings, empty_rows, empty_scales


def _keeps(bank: Tensor) -> bool:
    """Whether an eager training forward on ``bank`` offers its backward what it would
    otherwise recompute (``KEEP``): not while a CUDA graph records the call (a compiled
    graph's extern call: nothing takes the offer there, and it would pin memory of the
    graph's pool)."""
    from .. import ops
    return bool(CONFIG["KEEP"]) and not ops.capturing(bank)


def _step_forward(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, C: int,
                  snapshot_quant: str, save: bool, gate_params, wins):
    """The step walk over token windows, each window's Phase 1 on a side stream one
    window ahead (``pipeline.ahead``). A window's undo log is the chunk-major slice of
    its chunks; its readings land in the window's tokens."""
    P, T, W = k_idx.shape
    S, hd = bank.shape
    k_idx, k_val, v, q_idx, q_val = _contig(k_idx, k_val, v, q_idx, q_val)
    gate_params = None if gate_params is None else _contig(*gate_params)
    raw, rows, scales = saved_buffers(bank, P, T, W, C, snapshot_quant, save)
    readings = bank.new_empty(P, T, hd)
    dummy = _dummy(bank)

    whole = len(wins) == 1

    def make(win):
        sl = slice(*win)
        # raw gate inputs ([Bg, T, GH], any strides) are read through their strides
        b, a = (beta[:, sl], g[:, sl]) if gate_params else _contig(beta[:, sl], g[:, sl])
        return _plan(S, *_contig(k_idx[:, sl], k_val[:, sl]), b, a,
                     *_contig(q_idx[:, sl], q_val[:, sl]), C, gate_params,
                     replay=whole and not save)

    keep = None
    for (t0, t1), pl in ahead(wins, make, bank.device):
        out = readings if whole else bank.new_empty(P, t1 - t0, hd)
        saved = raw[t0 // C * P * C:-(-t1 // C) * P * C] if save else dummy
        if save and whole and _keeps(bank):
            keep = Kept(pl, _vmr_buffer(pl, bank))
        _await_index_check()
        step_walk(bank, pl, v if whole else v[:, t0:t1].contiguous(), out, saved, save, CONFIG,
                  _prec(bank.dtype), None if keep is None else keep.vmr)
        if not whole:
            readings[:, t0:t1] = out
    if rows is None:
        rows, scales = pack_log(raw, snapshot_quant, bank.dtype)
    if keep is not None:
        kept.keep_for_backward(readings, keep)
    return readings, rows, scales


@direct_launches
def forward_gated(bank: Tensor, k_idx, k_val, v, b_raw, a_raw, A_log, dt_bias, q_idx, q_val,
                  chunk_size: int, snapshot_quant: str, save: bool):
    """``IMPLS`` interface of ``sdm::write_read_gated``: like ``forward``, with the raw gate
    inputs ``b_raw`` / ``a_raw`` (``[P, T]`` or ``[B, T, H]``, ``P = B * H``) and
    ``A_log`` / ``dt_bias`` ``[P]``; ``beta = sigmoid(b)`` and
    ``g = -exp(A_log) * softplus(a + dt_bias)`` are computed in fp32 by the prep kernel
    (no pass of their own over the tokens)."""
    from .. import ops
    ops.record_dispatch(gates="prep-kernel")
    return forward(bank, k_idx, k_val, v, raw_gate_layout(b_raw), raw_gate_layout(a_raw),
                   q_idx, q_val, chunk_size, snapshot_quant, save, gate_params=(A_log, dt_bias))


def raw_gate_layout(x: Tensor) -> Tensor:
    """A raw gate input as ``[Bg, T, GH]``: ``[P, T]`` is ``[P, T, 1]`` (a view)."""
    return x if x.dim() == 3 else x.unsqueeze(-1)


def _record(path: str, windows: int, bank: Tensor, walk: str | None):
    from .. import ops
    bd = CONFIG["BD_STEP"] if walk in ("step", "queue") else CONFIG["BD"]
    ops.record_dispatch(kernel_path=path, windows=windows, walk=walk, block_cols=bd,
                        decode_max_t=DECODE_MAX_T, column_blocks=-(-bank.shape[1] // bd))


@direct_launches
def backward(grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx, k_val, v,
             beta, g, q_idx, q_val, chunk_size: int, snapshot_quant: str, grad_bank_fp32: bool,
             handed=()):
    """``IMPLS`` interface: the six gradients (bank, k_val, v, beta, g, q_val); ``handed``:
    what the forward handed over (``forward_kept``), if anything."""
    from .. import ops
    ops.record_dispatch(backward_path="chunked-reverse", block_cols_bwd=CONFIG["BD_BWD"])
    return bwd.backward(grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx,
                        k_val, v, beta, g, q_idx, q_val, chunk_size, snapshot_quant,
                        grad_bank_fp32, CONFIG, handed)
