"""Host side of the CUDA implementation: buffers, launch parameters, the IMPLS interface.

Everything here depends on shapes only: no ``.item()``, no host sync, no data-dependent
Python, so the same functions serve the eager op (``IMPLS['cuda']``), CUDA-graph capture
and the ``triton_op`` bodies that Inductor traces (``triton_ops.py``). The one choice that
depends on how a call runs is the walk (``walk_kind``): eager calls loop over the chunks
on the host (the step walks; small shapes take the column walks, ``launch.column_suits``),
traced calls launch one kernel for all chunks.
"""
from __future__ import annotations

import dataclasses
import os

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from .. import quant
from . import backward as bwd
from .decode import DECODE_MAX_T, _decode_kernel
from .launch import Relaunch, direct_launches, launch, pdl, pow2, step_walks
from .phase1 import plan, prep
from . import graphs
from .pipeline import ahead, token_windows
from .quantize import pack_log
from .phase2 import _forward_kernel
from .step import ROWS_MAX_CP, _step_gather_kernel, _step_mix_kernel, _step_write_kernel


def _dummy(like: torch.Tensor) -> torch.Tensor:
    """A placeholder pointer argument for a kernel branch that is compiled out."""
    return torch.empty(1, dtype=like.dtype, device=like.device)

NAME = "cuda-triton-chunked"

# Launch parameters and the few switches a user or a test needs, in one dict: tests shrink
# the tiles (the interpreter's shapes are tiny) and the benchmarks may override entries.
# Every default is the measured-best form on an H200 (docs/performance.md).
CONFIG = dict(
    # --- which walk (eager step walk / traced column walk), and the eager call's extras
    # WALK: "auto" (step walk when eager, except the small shapes of
    # ``launch.column_suits``; column walk when traced), or "column" / "step" to force one
    # (a traced call always takes the column walk). Environment: SDM_INDUCTOR_WALK.
    WALK=os.environ.get("SDM_INDUCTOR_WALK", "auto"),
    # WALK_GRAPHS: an eager step walk whose launches (kernels, grids, every argument) are
    # those of an earlier call replays them from a CUDA graph (``graphs.py``); 0 makes every
    # launch. Environment: SDM_INDUCTOR_WALK_GRAPHS.
    WALK_GRAPHS=int(os.environ.get("SDM_INDUCTOR_WALK_GRAPHS", "1")),
    # WINDOW_TOKENS: the eager no-grad forward runs the sequence in windows of about this
    # many tokens, so its working memory (Phase 1 of a window) does not grow with T.
    # TRAIN_WINDOW_TOKENS (0: the whole sequence): the same for the step walks' training
    # calls; each window's Phase 1 then runs on a side stream one window ahead
    # (``pipeline.py``). Off by default: Phase 1's kernels are latency-bound and each window
    # costs host time, so one window is faster; windows bound the memory of long sequences.
    WINDOW_TOKENS=8192, TRAIN_WINDOW_TOKENS=0,
    # KEEP: a training forward of the step walks in one window hands its Phase 1 and its
    # ``v - r0`` to the backward (``Kept``), which then skips its own Phase 1 and gather
    # launch (0: the backward recomputes them, as it must after token windows).
    KEEP=1,
    # PDL: programmatic dependent launch of the step walks' launches on sm_90+
    # (``launch.pdl``); 2: the row kernels also issue their early loads (Phase 1's arrays,
    # inputs, the undo log) before waiting for the launch before them
    # (``step._grid_dependency``); 3: the backward also does work that needs nothing of the
    # launch just before (2-2.5 % faster than 2), up to chunks of PDL3_MAX_C (at C = 256, 2
    # is 3 % faster); the forward treats 3 as 2. Environment: SDM_INDUCTOR_PDL.
    PDL=int(os.environ.get("SDM_INDUCTOR_PDL", "3")), PDL3_MAX_C=128,
    # --- the column walk (phase2.py, backward.py's reverse kernel): BD bank columns per
    # program (16 bf16 columns = one 32-byte sector per gathered row), TB tokens per tile,
    # EW entries per gather tile, NG write positions per tile of the write pass, KW run
    # members gathered with the run header (longer runs loop); ROWS_AHEAD / HEAD_AHEAD:
    # the next gather tile's rows / write tile's headers load during this tile (AHEAD_BWD:
    # the backward's next tile of chunk-start rows). BWD_WINDOWS: the backward runs the
    # chunks in this many launches, so its per-column-block partial sums hold a window of
    # chunks (2 against 4: as fast, half the partial sums' memory).
    BD=16, BD_DECODE=16, BD_BWD=16, TB=64, EW=16, EW_BWD=8, NG=256, WARPS=8, WARPS_BWD=8,
    ROWS_AHEAD=1, KW=4, HEAD_AHEAD=1, NG_BWD=256, KW_BWD=4, AHEAD_BWD=1, BWD_WINDOWS=2,
    # --- the forward step walk (step.py): the gather launch (BD_STEP columns per program
    # in WARPS_STEP warps: one warp sums a token's entries in registers and shuffles, where
    # four crossed warps through shared memory with bank conflicts, 5-12 % slower), the
    # product launch (MB_MIX columns x TB_MIX tokens, WARPS_MIX warps; blocks of 32 tokens
    # give twice the programs of 64 at C = 128), the write launch (BD_STEP_W columns, NG_STEP
    # positions, KW_STEP inline members, WARPS_STEP_W warps, CL_WRITE column blocks per
    # program). MIX_ROWS: the product launch loads each token block's rows of X and QKX
    # whole before waiting for the gather launch (``step._mix_block_rows``), up to C = 128
    # (above it the rows forms spill); 0 takes the blocks form at every C.
    BD_STEP=128, WARPS_STEP=1, BD_STEP_W=128, NG_STEP=32, KW_STEP=2, WARPS_STEP_W=4,
    CL_WRITE=1, MB_MIX=32, TB_MIX=32, WARPS_MIX=4, MIX_ROWS=1,
    # --- the backward step walk (step_backward.py): BD_STEP_B columns of its row passes in
    # WARPS_STEP_B warps; its two product launches MB_MIX_B columns x TB_MIX_B tokens in
    # WARPS_MIX_B warps (64 x 16: half the partial sums of 32 x 32, 1.5-2 % faster), *_WIDE
    # above C = 128 (the blocks form, where 64 x 16 is 5 % slower); MIX_ROWS_B as MIX_ROWS.
    # The dB launch: BD_GROUP columns, NG_GROUP positions, KW_GROUP inline members,
    # WARPS_GROUP warps, CL_GROUP column blocks per program (the group headers load once:
    # 3 is 2.5 % faster than 1). GROUP_PACK: the groups' header layout (``Groups``; 2, split:
    # groups of several members at the front of each segment, those of one member from its
    # end), GROUP_ONE: the dB tiles' one-member paths (2: also every column block's loads
    # before the stores; 0 in tests: the general path on every tile). DEV_DB: the d ev and
    # dB launches as one grid of both kinds of programs (1.2-2 % faster than two launches;
    # environment SDM_INDUCTOR_DEV_DB), in WARPS_DEV_DB warps, registers capped at
    # MAXNREG_DEV_DB (the dB launch's own 64: four programs of 8 warps per SM, not three).
    BD_STEP_B=128, WARPS_STEP_B=4, MB_MIX_B=64, TB_MIX_B=16, WARPS_MIX_B=4,
    MB_MIX_B_WIDE=32, TB_MIX_B_WIDE=32, MIX_ROWS_B=1,
    BD_GROUP=64, NG_GROUP=32, KW_GROUP=2, WARPS_GROUP=8, CL_GROUP=3, GROUP_PACK=2,
    GROUP_ONE=2, DEV_DB=int(os.environ.get("SDM_INDUCTOR_DEV_DB", "1")), WARPS_DEV_DB=8,
    MAXNREG_DEV_DB=64,
)


def _prec(dtype: torch.dtype) -> str:
    # fp32 banks: exact fp32 products (1e-4 contract); bf16 banks: tf32 is far inside 2e-2
    return "ieee" if dtype == torch.float32 else "tf32"


def _contig(*xs):
    return tuple(x.contiguous() for x in xs)


def decode_forward(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val,
                   gate_params=None) -> Tensor:
    """Token loop for short sequences (no backward): advances ``bank``, returns readings.
    With ``gate_params`` the prep kernel computes the gates (see ``phase1.prep``)."""
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    S, hd = bank.shape
    # one chunk of T tokens: the padded per-token beta of prep is [P, T]
    slot, val, gate, _, _, _, beta = prep(S, k_idx, k_val, beta, g, q_idx, q_val, T, gate_params)
    out = torch.empty(P, T, hd, dtype=bank.dtype, device=bank.device)
    BD = CONFIG["BD_DECODE"]
    launch(_decode_kernel, (P, -(-hd // BD)), bank, slot, val, gate, v, beta, out, T, hd,
           W=W, R=R, WP=pow2(W), RP=pow2(R), BD=BD, num_warps=CONFIG["WARPS"])
    return out


def chunked_forward(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, C: int,
                    saved: Tensor | None, gate_params=None):
    """Phase 1 + the Phase 2 walk for the whole sequence; advances ``bank``, returns readings.

    ``saved`` ([NC*P*C, W, hd], chunk-major like ``ops._saved_shapes``) receives the undo
    log when given: the chunk-start value of each distinct row a chunk writes.
    """
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    S, hd = bank.shape
    pl = plan(S, k_idx, k_val, beta, g, q_idx, q_val, C, gate_params)
    out = torch.empty(P, T, hd, dtype=bank.dtype, device=bank.device)
    # never alias the bank: Inductor treats every pointer argument as possibly written
    # and would clone the two separately (the last copy-back wins)
    saved_arg = _dummy(bank) if saved is None else saved
    if walk_kind(C, bank, P, W, R) == "step":
        _step_walk(bank, pl, v, out, saved_arg, saved is not None)
        return out
    BD, CP = CONFIG["BD"], pow2(C)
    NCB = -(-hd // BD)
    scratch = torch.empty(P * NCB * 3 * CP * BD, dtype=torch.float32, device=bank.device)
    ru = pl.runs
    launch(_forward_kernel, (P, NCB), bank, pl.slot, pl.ev, pl.X, pl.QKX, v, pl.beta, out,
           ru.slot, ru.length, ru.decay, ru.tok, ru.coef, scratch, saved_arg, P, T, hd,
           pl.NC, C=C, W=W, R=R, BD=BD,
           TB=min(CONFIG["TB"], CP), EW=CONFIG["EW"], NG=CONFIG["NG"], CP=CP,
           SAVE=saved is not None, PREC=_prec(bank.dtype), ROWS_AHEAD=CONFIG["ROWS_AHEAD"], KW=CONFIG["KW"],
           HEAD_AHEAD=CONFIG["HEAD_AHEAD"], num_warps=CONFIG["WARPS"])
    return out


def walk_kind(C: int, bank: Tensor, P: int, W: int, R: int) -> str:
    """The Phase 2 walk of a call on ``bank`` with ``P`` streams and ``W`` / ``R`` slots per
    token. A traced call (Inductor's generated code, AOTInductor) needs one launch whose
    compilation serves every ``T``: the column walk; eager calls (and CUDA graphs of them)
    loop over the chunks on the host: the step walk, except for the small shapes where the
    column walk measured faster (``launch.step_walks``, the backward's rule too)."""
    return "step" if step_walks(CONFIG, bank, (P, W, R, C)) else "column"


def _step_walk(bank: Tensor, pl, v: Tensor, out: Tensor, saved: Tensor, save: bool,
               keep: Tensor | None = None):
    """The step walk (``step.py``): two or three launches per chunk, in chunk order.
    ``keep`` (``[NC, P, CP, hd]`` fp32): receives ``v - r0`` for the backward."""
    P, C, W, R, NC = pl.P, pl.C, pl.W, pl.R, pl.NC
    hd = bank.shape[1]
    CP = pow2(C)
    BD, BDW, NG = CONFIG["BD_STEP"], CONFIG["BD_STEP_W"], CONFIG["NG_STEP"]
    NCB, NCBW = -(-hd // BD), -(-hd // BDW)
    nrt = -(-C * W // NG)
    f32 = dict(dtype=torch.float32, device=bank.device)
    u, inter = (torch.empty(P, CP, hd, **f32) for _ in range(2))
    # the write launch reads delta for every run member: in bf16 for a bf16 bank, half the
    # L2 traffic (the written rows are stored in bf16 anyway; the sums over a run stay fp32)
    low = bank.dtype == torch.bfloat16
    delta = torch.empty(P, CP, hd, dtype=torch.bfloat16 if low else torch.float32,
                        device=bank.device)
    ru = pl.runs
    MBM, TBM = CONFIG["MB_MIX"], min(CONFIG["TB_MIX"], CP)
    prec = _prec(bank.dtype)
    pd = pdl(CONFIG, bank)
    gather = Relaunch(_step_gather_kernel, (P * C, NCB), "c", bank, pl.slot, pl.ev, v, pl.beta,
                      u, inter, u if keep is None else keep, 0, P, pl.T, hd, NC, C=C, W=W,
                      R=R, BD=BD, WP=pow2(W), RP=pow2(R), CP=CP,
                      KEEP=keep is not None, num_warps=CONFIG["WARPS_STEP"], num_stages=1, **pd)
    mix = Relaunch(_step_mix_kernel, (P * (CP // TBM), -(-hd // MBM)), "c", pl.X, pl.QKX, u,
                   inter, delta, out, 0, pl.T, hd, NC, C=C, MB=MBM, TB=TBM, CP=CP, PREC=prec,
                   ROWS=bool(CONFIG["MIX_ROWS"]) and CP <= ROWS_MAX_CP,
                   num_warps=CONFIG["WARPS_MIX"], num_stages=1, **pd)
    CLW = min(CONFIG["CL_WRITE"], NCBW)   # column blocks per write program
    write = Relaunch(_step_write_kernel, (P * nrt, -(-NCBW // CLW)), "c", bank, delta, ru.slot,
                     ru.length, ru.decay, ru.tok, ru.coef, saved, 0, P, hd, NC, C=C, W=W, BD=BDW,
                     NG=NG, KW=CONFIG["KW_STEP"], CP=CP, SAVE=save,
                     CL=CLW,
                     num_warps=CONFIG["WARPS_STEP_W"],
                     num_stages=1, **pd)
    def body():
        for c in range(NC):   # kernel boundaries order the chunks
            gather(c)
            mix(c)
            write(c)

    # the same launches as an earlier call: replayed from its CUDA graph (graphs.py)
    graphs.run(("forward", NC, gather.key, mix.key, write.key), body,
               bank.device, CONFIG["WALK_GRAPHS"])


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
    k_idx, k_val, v, q_idx, q_val = _contig(k_idx, k_val, v, q_idx, q_val)
    if gate_params is None or is_fake(beta) or is_fake(g):
        # a traced call's raw gates are made contiguous too: the kernel reads them through
        # strides that tracing bakes into the graph as numbers, and the compiled graph may
        # give a non-contiguous input (a view of a projection) a layout of its own. On the
        # H200 an AOTInductor package of the layer read wrong gates without this (readings
        # off by 5e-3, NaN at T=45: examples/export_aoti.py), and matched eager with it
        beta, g = _contig(beta, g)
    if gate_params is not None:
        gate_params = _contig(*gate_params)
    P, T, W = k_idx.shape
    raw, rows, scales = saved_buffers(bank, P, T, W, chunk_size, snapshot_quant, save)
    if T == 0:
        out = bank.new_empty(P, 0, bank.shape[1])
    elif not save and T <= DECODE_MAX_T:
        out = decode_forward(bank, k_idx, k_val, v, beta, g, q_idx, q_val, gate_params)
    else:
        out = chunked_forward(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, raw,
                              gate_params)
    if rows is None:
        rows, scales = pack_log(raw, snapshot_quant, bank.dtype)
    return out, rows, scales


@direct_launches
def forward(bank: Tensor, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size: int,
            snapshot_quant: str, save: bool, gate_params=None):
    """``IMPLS`` interface: advance ``bank`` in place; (readings, saved rows, saved scales).

    With ``gate_params`` the gates are computed in the prep kernel (``forward_gated``)."""
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    C = chunk_size
    path = "empty" if T == 0 else ("decode" if (not save and T <= DECODE_MAX_T) else "chunked")
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
        return forward_once(bank, k_idx, k_val, v, beta, g, q_idx, q_val, C, snapshot_quant, save,
                            gate_params)
    readings = bank.new_empty(P, T, bank.shape[1])
    for t0, t1 in wins:
        sl = slice(t0, t1)
        readings[:, sl] = forward_once(bank, k_idx[:, sl], k_val[:, sl], v[:, sl], beta[:, sl],
                                       g[:, sl], q_idx[:, sl], q_val[:, sl], C, "none", False,
                                       gate_params)[0]
    _, empty_rows, empty_scales = saved_buffers(bank, P, T, k_idx.shape[2], C, snapshot_quant,
                                                False)
    return readings, empty_rows, empty_scales


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

    def make(win):
        sl = slice(*win)
        # raw gate inputs ([Bg, T, GH], any strides) are read through their strides
        b, a = (beta[:, sl], g[:, sl]) if gate_params else _contig(beta[:, sl], g[:, sl])
        return plan(S, *_contig(k_idx[:, sl], k_val[:, sl]), b, a,
                    *_contig(q_idx[:, sl], q_val[:, sl]), C, gate_params)

    from .. import ops
    whole = len(wins) == 1
    keep = None
    for (t0, t1), pl in ahead(wins, make, bank.device):
        out = readings if whole else bank.new_empty(P, t1 - t0, hd)
        saved = raw[t0 // C * P * C:-(-t1 // C) * P * C] if save else dummy
        # not while a CUDA graph records the call (a compiled graph's extern call: nothing
        # takes the offer there, and it would pin memory of the graph's pool)
        if save and whole and CONFIG["KEEP"] and not ops.capturing(bank):
            keep = Kept(pl, torch.empty(pl.NC, P, pow2(C), hd, dtype=torch.float32,
                                        device=bank.device))
        _step_walk(bank, pl, v if whole else v[:, t0:t1].contiguous(), out, saved, save,
                   None if keep is None else keep.vmr)
        if not whole:
            readings[:, t0:t1] = out
    if rows is None:
        rows, scales = pack_log(raw, snapshot_quant, bank.dtype)
    if keep is not None:
        ops.keep_for_backward(readings, keep)
    return readings, rows, scales


@dataclasses.dataclass(frozen=True)
class Kept:
    """What a training forward's step walk hands to its backward (``ops.keep_for_backward``):
    its Phase 1 (``phase1.plan``) and ``v - r0`` of every chunk (``[NC, P, CP, hd]`` fp32),
    which the backward would otherwise recompute (a plan, and a gather of every write row
    per chunk). About 0.2 GiB at config A, beside the undo log's 1.6 GiB."""
    plan: object
    vmr: Tensor


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
    bd = CONFIG["BD_STEP"] if walk == "step" else CONFIG["BD"]
    ops.record_dispatch(kernel_path=path, windows=windows, walk=walk, block_cols=bd,
                        decode_max_t=DECODE_MAX_T, column_blocks=-(-bank.shape[1] // bd))


@direct_launches
def backward(grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx, k_val, v,
             beta, g, q_idx, q_val, chunk_size: int, snapshot_quant: str, grad_bank_fp32: bool):
    """``IMPLS`` interface: the six gradients (bank, k_val, v, beta, g, q_val)."""
    from .. import ops
    ops.record_dispatch(backward_path="chunked-reverse", block_cols_bwd=CONFIG["BD_BWD"])
    return bwd.backward(grad_readings, grad_final, final_bank, saved_rows, saved_scales, k_idx,
                        k_val, v, beta, g, q_idx, q_val, chunk_size, snapshot_quant,
                        grad_bank_fp32, CONFIG)
