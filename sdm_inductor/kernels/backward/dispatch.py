"""The backward over the chunks: which reverse walk (the step walk when eager, the queue
walk when traced, the column walk for the small shapes and traced calls' quantized undo
logs), token windows (the last first, each window's Phase 1 on a side stream one window
ahead), the chunk-start rows by their sources or restored, then Phase 1 backward."""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from ...validation import no_work
from ..phase1 import Plan, entry_groups, plan
from ..runtime.launch import dense, pow2, walk_kind
from ..runtime.pipeline import ahead, token_windows
from .phase1_grads import phase1_grads
from .queue_walk import queue_reverse
from .reverse_walk import column_reverse
from .sources import chunk_start_sources
from .step_walk import step_reverse


# snapshot_quant modes as the kernel decodes the undo log
_QMODE = {"none": 0, "bf16": 0, "fp8": 1, "int4": 2}


@dataclasses.dataclass(frozen=True)
class Kept:
    """What a training forward hands to its backward, which would otherwise recompute it:
    its Phase 1 (``phase1.plan``) and, after a step or queue walk, ``v - r0`` of every chunk
    (``[NC * P, CP, hd]`` fp32; None: gathered again). 48 MiB at config A, beside the
    undo log's 1.6 GiB. An eager forward offers it through the autograd context
    (``kept.keep_for_backward``); a traced one hands its tensors through the graph."""
    plan: Plan
    vmr: Tensor | None

    def tensors(self) -> list[Tensor]:
        """The tensors of this ``Kept`` (a traced forward's values for ``from_tensors``)."""
        return self.plan.backward_tensors() + ([] if self.vmr is None else [self.vmr])

    @staticmethod
    def from_tensors(P: int, T: int, C: int, W: int, R: int, hd: int, tensors) -> "Kept":
        """The ``Kept`` that ``tensors`` lists, for a call of ``P`` streams of ``T`` tokens
        (chunks of ``C``, ``W`` / ``R`` slots per token, rows of ``hd``); their sizes (and
        ``v - r0``'s dtype) are checked, so a list of another call's is refused before a
        kernel indexes through it. The slots the plan holds are not checked against the
        bank's rows: a list of a call with other indices gives other gradients."""
        n = Plan.n_backward_tensors()
        pl = Plan.from_tensors(P, T, C, W, R, tensors[:n])
        vmr = tensors[n] if len(tensors) > n else None
        sizes = [(pl.slot.numel(), pl.B * C * pl.E), (pl.A.numel(), pl.B * C * C),
                 (pl.first.shape[0], P), (pl.runs.slot.numel(), pl.B * C * W)]
        if vmr is not None:   # [NC * P, CP, hd] fp32
            sizes += [(vmr.dim(), 3), (vmr.dtype, torch.float32),
                      *zip(vmr.shape, (pl.NC * P, pow2(C), hd))]
        for got, want in sizes:
            torch._check(got == want, lambda: "sdm: what the forward handed over does not fit "
                         f"this backward ({P} streams of {T} tokens, chunks of {C}, W = {W}, "
                         f"R = {R}, rows of {hd})")
        return Kept(pl, vmr)


def backward(grad_readings: Tensor, grad_final: Tensor, final_bank: Tensor, saved_rows: Tensor,
             saved_scales: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, C: int,
             snapshot_quant: str, grad_bank_fp32: bool, config: dict, handed=()):
    """The six gradients (bank, k_val, v, beta, g, q_val). Shapes-only host code.

    Eager calls (the step walks) run the sequence in token windows, the last first, with
    the Phase 1 of the window before on a side stream (``pipeline.ahead``); a traced call
    does the whole sequence as one window. ``handed``: what the forward handed over as
    tensors (``host.forward_kept``; a traced graph's), else empty: then an eager forward's
    ``Kept`` (``kept.kept_for_backward``), else recomputed."""
    k_idx, k_val, v, beta, g, q_idx, q_val, dy = (
        dense(x) for x in (k_idx, k_val, v, beta, g, q_idx, q_val, grad_readings))
    S, hd = grad_final.shape
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    bank_dtype = grad_final.dtype
    dev = grad_final.device
    acc_dtype = torch.float32 if (grad_bank_fp32 or bank_dtype == torch.float32) else bank_dtype
    dB = grad_final.to(acc_dtype, copy=True, memory_format=torch.contiguous_format)
    if no_work(grad_final, k_idx):
        return (dB.to(bank_dtype), torch.zeros_like(k_val, dtype=bank_dtype),
                torch.zeros_like(v, dtype=bank_dtype), torch.zeros_like(beta, dtype=torch.float32),
                torch.zeros_like(g, dtype=torch.float32), torch.zeros_like(q_val, dtype=bank_dtype))
    qmode = _QMODE[snapshot_quant]
    log = saved_rows.view(torch.uint8) if qmode == 1 else saved_rows
    tokens = config["TRAIN_WINDOW_TOKENS"]
    walk = reverse_kind(config, dB, P, W, R, C, qmode)
    step = walk == "step"
    one_window = not step or tokens <= 0 or T <= tokens
    # the step walk of one window and the queue walk, over a log of raw rows, read each
    # chunk-start row from the final bank or the log (sources.py): no working copy of the
    # bank, no restore per chunk. Otherwise (token windows, fp8 / int4 logs, whose
    # dequantization in the one-warp gather launch would spill on sm_90) the walk rebuilds
    # the bank state chunk by chunk in reverse from the final bank and the log
    by_source = walk != "column" and one_window and qmode == 0
    work = (final_bank.contiguous() if by_source
            else final_bank.clone(memory_format=torch.contiguous_format))
    # a separate placeholder, never dB itself: Inductor treats both pointers as written
    # and clones aliased arguments separately (the untouched copy would win)
    scales = saved_scales if saved_scales.numel() else torch.empty(1, dtype=torch.float32,
                                                                  device=dev)
    prec = "ieee" if bank_dtype == torch.float32 else "tf32"
    ctx = (dB, work, saved_rows.shape[-1], qmode, prec, config, walk)

    def make(win):   # Phase 1 of a window: independent of the bank
        sl = slice(*win)
        pl = plan(S, *(x[:, sl].contiguous() for x in (k_idx, k_val, beta, g, q_idx, q_val)), C)
        return pl, entry_groups(pl)

    # what a forward hands over covers the whole sequence: token windows recompute
    kept = (_handed(handed, P, T, C, W, R, hd) if len(handed) and one_window else
            _kept(one_window, P, T, C, W, R))
    if one_window:
        pl = plan(S, k_idx, k_val, beta, g, q_idx, q_val, C) if kept is None else kept.plan
        from ... import ops
        ops.record_dispatch(chunk_start_rows="sources" if by_source else "restored",
                            reverse_walk=walk)
        groups = entry_groups(pl)
        sources = chunk_start_sources(pl, S) if by_source else None
        dv, sums = _reverse(pl, groups, log, scales, v, dy, *ctx, dv_dtype=bank_dtype,
                            vmr=None if kept is None else kept.vmr, sources=sources)
        dk, dbeta, dg, dq = phase1_grads(pl, sums, g.shape[2])
        return dB.to(bank_dtype), dk.to(bank_dtype), dv, dbeta, dg, dq.to(bank_dtype)
    f32 = dict(dtype=torch.float32, device=dev)
    dk, dv, dbeta, dg, dq = (
        torch.empty(P, T, W, dtype=bank_dtype, device=dev),
        torch.empty(P, T, hd, dtype=bank_dtype, device=dev), torch.empty(P, T, **f32),
        torch.empty(P, T, g.shape[2], **f32), torch.empty(P, T, R, dtype=bank_dtype, device=dev))
    wins = token_windows(T, C, tokens)
    for (t0, t1), (pl, gr) in ahead(wins[::-1], make, dev):
        rows = slice(t0 // C * P * C, -(-t1 // C) * P * C)   # the window's chunks in the log
        dv_w, sums = _reverse(pl, gr, log[rows],
                              scales[rows] if saved_scales.numel() else scales,
                              v[:, t0:t1].contiguous(), dy[:, t0:t1].contiguous(), *ctx,
                              dv_dtype=bank_dtype)
        dv[:, t0:t1] = dv_w
        # (on the current stream: beside the next window's walk it measured slower)
        for o, x in zip((dk, dbeta, dg, dq), phase1_grads(pl, sums, g.shape[2])):
            o[:, t0:t1] = x
    return dB.to(bank_dtype), dk, dv, dbeta, dg, dq


def raw_log(snapshot_quant: str) -> bool:
    """Whether an undo log of ``snapshot_quant`` holds raw rows (the queue walk reads those)."""
    return _QMODE[snapshot_quant] == 0


def reverse_kind(config: dict, dB: Tensor, P: int, W: int, R: int, C: int, qmode: int) -> str:
    """The reverse walk of a backward: the forward's choice (``launch.walk_kind``), except
    that an fp8 / int4 undo log takes the column walk where that choice is the queue walk
    (the queue walk reads chunk-start rows from their sources, which serve raw logs only)."""
    walk = walk_kind(config, dB, (P, W, R, C))
    return "column" if walk == "queue" and qmode != 0 else walk


def _kept(usable: bool, P: int, T: int, C: int, W: int, R: int):
    """What the eager forward kept for this backward (``Kept``), when ``usable`` and it fits
    the call; the dispatch record says whether the backward recomputes its Phase 1."""
    from ... import kept as kept_values, ops
    kept = kept_values.kept_for_backward() if usable else None
    pl = getattr(kept, "plan", None)
    if pl is not None and (pl.P, pl.T, pl.C, pl.W, pl.R) != (P, T, C, W, R):
        kept = None   # not this call's forward: never used
    ops.record_dispatch(phase1_backward="recomputed" if kept is None else "kept")
    return kept


def _handed(tensors, P: int, T: int, C: int, W: int, R: int, hd: int) -> Kept:
    """``Kept`` of the tensors a traced forward handed over (``host.forward_kept``)."""
    from ... import ops
    ops.record_dispatch(phase1_backward="handed")
    return Kept.from_tensors(P, T, C, W, R, hd, tensors)


def _reverse(pl, gr, log, scales, v, dy, dB, work, width: int, qmode: int, prec: str,
             config: dict, walk: str, dv_dtype: torch.dtype, vmr=None, sources=None):
    """The reverse walk over one window's chunks (``pl``: its Phase 1; ``log`` / ``scales``
    its undo log; ``v`` / ``dy`` its tokens; ``vmr``: the forward's ``v - r0``, if kept),
    advancing ``dB`` and ``work`` in place to the window's start: the window's ``dv``
    and cross-column sums. ``dv`` is written once per element, so the kernels round it to
    ``dv_dtype`` (the bank's) as they store it: no fp32 copy and conversion pass after."""
    dv = torch.empty(pl.P, pl.T, dB.shape[1], dtype=dv_dtype, device=dB.device)
    if walk == "step":
        # eager: the step walk, launches per chunk over the whole GPU
        sums = step_reverse(dB, work, log, scales, width, pl, gr, v, dy, dv, qmode, prec, config,
                            vmr, sources)
    elif walk == "queue":
        # traced: the step walk's items in one launch (the chunk-start rows by their sources)
        sums = queue_reverse(dB, work, log, scales, width, pl, gr, v, dy, dv, prec, config,
                             sources, vmr)
    else:
        sums = column_reverse(dB, work, log, scales, width, pl, gr, v, dy, dv, qmode, prec,
                               config)
    return dv, sums
