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
from .launch import EVICT, Relaunch, direct_launches, launch, pdl, pow2, step_walks
from .phase1 import plan, prep
from . import graphs, plan_graph
from .pipeline import ahead, beside, token_windows
from .quantize import pack_log
from .phase2 import _forward_kernel
from .step import ROWS_MAX_CP, _step_gather_kernel, _step_mix_kernel, _step_write_kernel
from .walk import _walk_kernel


def _dummy(like: torch.Tensor) -> torch.Tensor:
    """A placeholder pointer argument for a kernel branch that is compiled out."""
    return torch.empty(1, dtype=like.dtype, device=like.device)

NAME = "cuda-triton-chunked"

# Launch parameters (the benchmark may override them). BD: bank columns per program
# (16 bf16 columns = one 32-byte sector per gathered row); TB: tokens per tile; EW:
# entries per gather tile; NG: write entries per tile of the write pass; KW (a power of
# 2): members of each run gathered with its header (longer runs loop); ROWS_AHEAD /
# HEAD_AHEAD: the next gather tile's rows / write tile's headers load during this tile.
# The kernel measured in session 2: NG=512, KW=1, ROWS_AHEAD=0, HEAD_AHEAD=0 (and
# NG_BWD=512, KW_BWD=1, AHEAD_BWD=0). AHEAD_BWD: the backward's next tile of chunk-start
# rows loads while this one is reduced. BWD_WINDOWS: the backward runs the chunks in this many
# launches, so its per-column-block partial sums hold a window of chunks (1: session 2's).
# 2 against 4 (NOTES.md run 25): autograd 0.994 at A and B C=128, peak at A C=128 2.57 ->
# 2.68 GiB (the partial sums of a window double).
CONFIG = dict(PRELUDE=0, BD=16, BD_DECODE=16, BD_BWD=16, TB=64, EW=16, EW_BWD=8, NG=256, WARPS=8,
              WARPS_BWD=8, WALK=os.environ.get("SDM_INDUCTOR_WALK", "auto"), BD_WALK=128, EW_WALK=128, NG_WALK=64,
              WARPS_WALK=8, STAGES_WALK=1, GATHER_STAGES=0, ROWS_AHEAD=1, KW=4, HEAD_AHEAD=1,
              NG_BWD=256, KW_BWD=4, AHEAD_BWD=1, BWD_WINDOWS=2,
              BD_STEP=128, WARPS_STEP=1, MB_STEP=32, BD_STEP_W=128, NG_STEP=32, KW_STEP=2,
              WARPS_STEP_W=4, MIX_STEP=0, MB_MIX=32, BD_STEP_B=128, MB_MIX_B=64,
              WINDOW_TOKENS=8192, TRAIN_WINDOW_TOKENS=0, PLAN_AHEAD=1, PLAN_GRAPH=0, PDL=int(os.environ.get("SDM_INDUCTOR_PDL", "3")),
              WARPS_STEP_B=4, MAXNREG_STEP=0, TB_MIX=32, WARPS_MIX=4, TB_MIX_B=16, MB_MIX_B_WIDE=32, TB_MIX_B_WIDE=32,
              WARPS_MIX_B=4, BD_GROUP=64, NG_GROUP=32, KW_GROUP=2, WARPS_GROUP=8,
              EV_GW=0, EV_GR=0, EV_WO=0, EV_BW=0, EV_DB=0, BD_DW=0, WARPS_DW=0, KEEP=1,
              CL_GROUP=3, CL_WRITE=1, DEV_DB=int(os.environ.get("SDM_INDUCTOR_DEV_DB", "1")), WARPS_DEV_DB=8,
              MAXNREG_DEV_DB=64, PDL3_MAX_C=128, SOURCES=1, GROUP_PACK=2, GROUP_ONE=2,
              WALK_GRAPHS=int(os.environ.get("SDM_INDUCTOR_WALK_GRAPHS", "1")), DELTA_BF16=1, MIX_ROWS=1, MIX_ROWS_B=1)
# WALK: "grid" (walk.py, every SM in every chunk step, grid barriers), "column"
# (phase2.py, one program per stream and 16-column block, no inter-program sync),
# "step" (step.py, launches per chunk over the whole GPU; eager calls only: a traced
# call takes the column walk) or "auto" (the default: step when eager, column when
# traced, measured in benchmarks/NOTES.md run 7, and column for the small eager shapes
# of ``launch.column_suits``, run 13). *_STEP: the step walk's gather launch (columns per
# program, warps, column slice of its delta product); *_STEP_W: its write launch;
# MIX_STEP=1: the gather launch's last programs compute delta (no mix launch), else the
# mix launch does, in column slices of MB_MIX. The backward's step walk
# (step_backward.py): BD_STEP_B columns per program of its row passes, MB_MIX_B of its
# products; its restore pass takes the write launch's BD_STEP_W / NG_STEP, its dB pass
# *_GROUP (columns, positions and members per tile, warps; CL_GROUP: column blocks per
# program, whose group headers load once: 3 measured 2.5 % faster at A, NOTES.md run 13).
# CL_WRITE: the same for the forward's write launch (3 measured 5 % slower; 1).
# DEV_DB: the backward's d ev and dB launches as one grid of both kinds of programs
# (step_backward._dev_and_groups; 1 against 0, autograd C=128: 0.988 at A, 0.980 at B,
# NOTES.md run 27), in WARPS_DEV_DB warps each, registers capped at
# MAXNREG_DEV_DB (0: none; 64, the dB launch's own, compiles without spills on sm_90, where
# the uncapped merged kernel takes 80: three programs of 8 warps per SM instead of four;
# uncapped measured 1.033 / 1.018 against 64).
# WINDOW_TOKENS: the eager no-grad forward runs the sequence in windows of about this many
# tokens, so its working memory (Phase 1 of a window) does not grow with T.
# TRAIN_WINDOW_TOKENS (0: the whole sequence): the same for the step walks' training calls
# (forward with the undo log, and the backward, its windows last first). With several
# windows, the step walks take each window's Phase 1 on a side stream one window ahead of
# the walk, and the backward's Phase 1 backward of a window behind it (``pipeline.py``);
# measured slower than one window at config A (benchmarks/NOTES.md run 8: Phase 1's
# kernels are bound by per-segment latency, and each window costs host time), so off by
# default. Traced calls (one triton_op) cannot loop over a length: the whole sequence.
# WARPS_STEP_B: warps of the backward step walk's row passes; MAXNREG_STEP (0: none): a
# register cap for the forward gather. WARPS_STEP=1 (NOTES.md run 15): with four warps the
# sums over a token's entries crossed warps through shared memory with ~10-way bank
# conflicts, whose wavefronts filled the L1 pipe (Nsight Compute: 82 % busy, ~8x the row
# loads' own); one warp sums in registers and shuffles (164 registers, one wave of
# programs): no-grad 9-12 % faster at A, 5 % at B. (With four warps a cap of 80 had been
# 2-2.5 % faster, run 8; a cap of 128 on the one warp spills, 4-7 % slower.)
# TB_MIX / WARPS_MIX: token block and warps of the forward's product launch (the
# gather's ``TB`` stays 64); TB_MIX_B / WARPS_MIX_B: the same for the backward's two,
# and MB_MIX_B their column slices; *_WIDE: both for C > 128 (the blocks form, not
# MIX_ROWS_B). 64 columns x 16 tokens (the same program count as 32 x 32, half the dQK /
# dL partial sums and their window sums): with one-warp Phase 1 grads, autograd 0.980 (A
# C=128), 0.984 (A C=64), 0.986 (B C=128) against 32 x 32 (NOTES.md run 29); at C = 256
# 64 x 16 measured 1.049 (A) / 1.046 (B) slower, so the blocks form keeps 32 x 32.
# Blocks of 32 tokens (NOTES.md run 17, GPU time from CUDA graphs): the forward's launch at
# 64 tokens ran 96 programs at C=128 (7 us, 6 % occupancy); 32 gives twice the programs:
# no-grad 0.878 (A C=64) / 0.980 (A C=128) / 0.977 (B); the backward's, forward +
# backward 0.944 / 0.985 / 0.986. 16 tokens or two warps were slower. The write launch in
# four warps over 128 columns (BD_STEP_W, WARPS_STEP_W; the restore pass shares them):
# no-grad 0.982 / 0.978 / 0.974, forward + backward 0.996 / 0.990 / 0.987.
# PDL: the step walks' launches use programmatic dependent launch on sm_90+ (``launch.pdl``);
# 2: the row kernels also issue their early loads (Phase 1's arrays, inputs, the undo log)
# before waiting for the kernel before them (``step._grid_dependency``, NOTES.md run 14);
# 3 (the default): the backward walk also does work that needs nothing of the launch just
# before (forward + backward 0.976-0.981 against 2 at A C=64 / 128 and B C=128, NOTES.md
# run 19; the forward's launches treat 3 as 2). Environment: SDM_INDUCTOR_PDL.
# SOURCES: the backward step walk of one window reads each entry's chunk-start row from the
# final bank or the undo log (``sources.py``): no working copy of the bank and no restore
# launch per chunk. 1: logs of raw rows (modes none / bf16); 2: also fp8 / int4 logs
# (dequantized in the row launches: the one-warp gather launch then spills on sm_90,
# unmeasured); 0: the restore launch. Autograd forward + backward, 1 against 0, NOTES.md
# run 21: 0.951 (A C=128), 0.926 (B C=128); peak memory less one bank.
# GROUP_PACK=1: the backward's dB groups with their headers packed to the front of each
# segment (``phase1.entry_groups``), so its tiles hold only groups and the tiles past the
# last skip their work; 0: headers by position (the dB launch then spends issue slots on
# the ~20 % of positions at A C=128 where no group starts). Nsight Compute: 34.1 -> 30.3
# us per dB launch at A C=128; autograd forward + backward against 0 (both by the groups
# kernel; ratio of the A/B's medians, NOTES.md run 22): 0.997 (A C=64), 0.978 (A C=128),
# 0.957 (A C=256), 0.996 (B C=128).
# GROUP_PACK=2 (split): the groups of several members packed to the front, those of one
# member from the end, so that with GROUP_ONE (0: off) most dB tiles hold single members
# only and take the launch's one-member path (1: one member's loads instead of KW_GROUP's,
# no loop over long groups; 2: also every column block's loads before the stores, and the
# member with the headers, ``Groups.tok0`` / ``ev0``). Nsight Compute, the dB launch at A C=128
# (``PDL=0``): 31.1 us packed, 29.0 split with GROUP_ONE=1, 27.1 with 2. Autograd forward
# + backward against session 22's packed headers (NOTES.md run 23): GROUP_ONE=1 0.989
# (A C=128), 0.995 (B C=128); 2: 0.970, 0.960.
# PDL3_MAX_C: the backward takes PDL=3 only up to this chunk size, 2 above it (autograd
# forward + backward at A C=256, PDL=2 against 3: 0.967, NOTES.md run 20; at C=128 1.021).
# PLAN_AHEAD=0: the windows' Phase 1 on the current stream (no overlap; for measurements).
# PLAN_GRAPH=1: the no-grad step walk replays each window's Phase 1 from a CUDA graph per
# window shape (``plan_graph.py``): its host time is then a few copies and one launch.
# EV_*: L2 eviction policies (``launch.EVICT``: 0 none, 1 evict_first, 2 evict_last) of the
# step walks' row loads: the forward gather's write rows (GW, read again by the write
# launch) and read rows (GR), the write launch's old rows (WO); the backward's chunk-start
# write rows in its gather and Dw launches (BW) and the Dw launch's dB rows (DB).
# WALK_GRAPHS: an eager step walk whose launches (kernels, grids, every argument) are those
# of an earlier call is replayed from a CUDA graph recorded at their second occurrence
# (``graphs.py``); 0 makes every launch. Environment: SDM_INDUCTOR_WALK_GRAPHS.
# DELTA_BF16: the forward step walk's ``delta = X u`` scratch in bf16 for bf16 banks (the
# write launch reads it for every run member: half the L2 traffic; NOTES.md run 18,
# graph-timed: no-grad 0.924 A C=64, 0.914 A C=128, 0.941 B, forward + backward 0.97-0.98).
# The written rows are stored in bf16 anyway; the sum over a run's members stays fp32
# (the oracle tests pass at the bf16 tolerance). 0 keeps fp32; fp32 banks always do.
# MIX_ROWS: the forward's product launch loads each token block's rows of X and QKX whole,
# before waiting for the gather launch, then one product each (``step._mix_block_rows``);
# 0: blocks of TB_MIX columns, one L2 round trip each, all after the wait. MIX_ROWS_B: the
# same for the backward's two product launches (``step_backward._mix1_rows``, ``_mix2_rows``).
# Both only up to C = 128 (sm_90 at C = 256: 255 registers and spills). NOTES.md run 18,
# graph-timed, 3 rounds: MIX_ROWS no-grad 0.923 (A C=64), 0.911 (A C=128), 0.909 (B C=128);
# both, forward + backward 0.926 / 0.896 / 0.894.
# KEEP: a training forward of the step walks in one window hands its Phase 1 and its
# ``v - r0`` to the backward (``Kept``), which then skips its own Phase 1 and gather launch.
# PRELUDE: a training forward that keeps its Phase 1 (KEEP) also makes what its backward's
# step walk needs before its first launch, from Phase 1 alone (``backward.prelude``: the
# groups, the chunk-start sources): 2 on the side stream beside the forward's walk, whose
# latency-bound launches leave SMs idle (``pipeline.beside``), 1 inline before the walk,
# 0 (the default) in the backward. Bitwise the same values either way. Autograd at C=128
# (NOTES.md run 26): in-process A/Bs gave 0 against 2 1.004 (A) / 1.011 (B), then 0.999 /
# 0.998, and 1 against 2 1.004 / 1.005; but session 25's tree against the same with 2, a
# process per side and round, 1.004 (A, slower in all three rounds) and 1.003 (B): the
# side stream's kernels slow the forward's walk about as much as they take off the
# backward. Kept as an option for work that changes the forward walk's occupancy.
# BD_DW / WARPS_DW (0: BD_STEP_B / WARPS_STEP_B): columns and warps of the backward's Dw
# launch, whose [W, BD] tiles of dB and chunk-start rows fill the registers.


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
    kind = walk_kind(C, bank, P, W, R)
    if kind == "grid":
        _grid_walk(bank, pl, v, out, saved_arg, saved is not None)
        return out
    if kind == "step":
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
           SAVE=saved is not None, PREC=_prec(bank.dtype), PASSES=7,
           GATHER_STAGES=CONFIG["GATHER_STAGES"], ROWS_AHEAD=CONFIG["ROWS_AHEAD"], KW=CONFIG["KW"],
           HEAD_AHEAD=CONFIG["HEAD_AHEAD"], num_warps=CONFIG["WARPS"])
    return out


# the grid walk keeps a C x C matrix and C x BD tiles per item in shared memory: up to
# C = 128 on an H200 (196 KB at BD=128); longer chunks take the column walk
GRID_WALK_MAX_C = 128


def walk_kind(C: int, bank: Tensor, P: int, W: int, R: int) -> str:
    """The Phase 2 walk of a call on ``bank`` with ``P`` streams and ``W`` / ``R`` slots per
    token. A traced call (Inductor's generated code, AOTInductor) needs one launch whose
    compilation serves every ``T``: the column walk; eager calls (and CUDA graphs of them)
    loop over the chunks on the host: the step walk, except for the small shapes where the
    column walk measured faster (``launch.step_walks``, the backward's rule too)."""
    if CONFIG["WALK"] == "grid" and C <= GRID_WALK_MAX_C:
        return "grid"
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
    low = CONFIG["DELTA_BF16"] and bank.dtype == torch.bfloat16
    delta = torch.empty(P, CP, hd, dtype=torch.bfloat16 if low else torch.float32,
                        device=bank.device)
    ru = pl.runs
    mix_in_gather = bool(CONFIG["MIX_STEP"])
    tickets = torch.zeros(NC * P * NCB if mix_in_gather else 1, dtype=torch.int32,
                          device=bank.device)
    TB, MBM = min(64, CP), CONFIG["MB_MIX"]
    TBM = min(CONFIG["TB_MIX"], CP)
    prec = _prec(bank.dtype)
    pd = pdl(CONFIG, bank)
    gather = Relaunch(_step_gather_kernel, (P * C, NCB), "c", bank, pl.slot, pl.ev, v, pl.beta,
                      pl.X, pl.QKX, out, u, inter, delta, tickets, u if keep is None else keep,
                      0, P, pl.T, hd, NC, C=C, W=W,
                      R=R, BD=BD, WP=pow2(W), RP=pow2(R), CP=CP,
                      MB=min(CONFIG["MB_STEP"], BD), TB=TB, PREC=prec, MIX=mix_in_gather,
                      EV_W=EVICT[CONFIG["EV_GW"]], EV_R=EVICT[CONFIG["EV_GR"]],
                      KEEP=keep is not None,
                      num_warps=CONFIG["WARPS_STEP"], num_stages=1, **pd,
                      **({"maxnreg": CONFIG["MAXNREG_STEP"]} if CONFIG["MAXNREG_STEP"] else {}))
    mix = Relaunch(_step_mix_kernel, (P * (CP // TBM), -(-hd // MBM)), "c", pl.X, pl.QKX, u,
                   inter, delta, out, 0, pl.T, hd, NC, C=C, MB=MBM, TB=TBM, CP=CP, PREC=prec,
                   ROWS=bool(CONFIG["MIX_ROWS"]) and CP <= ROWS_MAX_CP,
                   num_warps=CONFIG["WARPS_MIX"], num_stages=1, **pd)
    CLW = min(CONFIG["CL_WRITE"], NCBW)   # column blocks per write program
    write = Relaunch(_step_write_kernel, (P * nrt, -(-NCBW // CLW)), "c", bank, delta, ru.slot,
                     ru.length, ru.decay, ru.tok, ru.coef, saved, 0, P, hd, NC, C=C, W=W, BD=BDW,
                     NG=NG, KW=CONFIG["KW_STEP"], CP=CP, SAVE=save, EV=EVICT[CONFIG["EV_WO"]],
                     CL=CLW,
                     num_warps=CONFIG["WARPS_STEP_W"],
                     num_stages=1, **pd)
    def body():
        for c in range(NC):   # kernel boundaries order the chunks
            gather(c)
            if not mix_in_gather:
                mix(c)
            write(c)

    # the same launches as an earlier call: replayed from its CUDA graph (graphs.py)
    graphs.run(("forward", NC, mix_in_gather, gather.key, mix.key, write.key), body,
               bank.device, CONFIG["WALK_GRAPHS"])


def _walk_block_cols(hd: int) -> int:
    """Bank columns per item of the grid walk (tl.dot needs at least 16)."""
    return min(CONFIG["BD_WALK"], max(16, pow2(hd)))


def grid_size(device: torch.device) -> int:
    """Programs of the grid walk: one per SM, so all are resident (the grid barrier needs
    that); one under the interpreter, which runs programs one after another."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _grid_walk(bank: Tensor, pl, v: Tensor, out: Tensor, saved: Tensor, save: bool):
    P, C, W, R, NC = pl.P, pl.C, pl.W, pl.R, pl.NC
    hd = bank.shape[1]
    CP = pow2(C)
    BD = _walk_block_cols(hd)
    NCB = -(-hd // BD)
    NG = CONFIG["NG_WALK"]
    NRT = -(-C * W // NG)
    u = torch.empty(P, CP, hd, dtype=torch.float32, device=bank.device)
    inter = torch.empty(P, CP, hd, dtype=torch.float32, device=bank.device)
    counter = torch.zeros(1, dtype=torch.int32, device=bank.device)
    ru = pl.runs
    nprog = grid_size(bank.device)
    launch(_walk_kernel, (nprog,), bank, pl.slot, pl.ev, pl.X, pl.QKX, v,
           pl.beta, out, ru.slot, ru.length, ru.decay, ru.tok, ru.coef, u, inter,
           counter, saved, P, pl.T, hd, NC, NCB, NRT, C=C, W=W, R=R, BD=BD,
           EW=min(CONFIG["EW_WALK"], pow2(W + R)), NG=NG, CP=CP, SAVE=save,
           PREC=_prec(bank.dtype), PREC_G=_prec(bank.dtype), ONE_PROGRAM=nprog == 1,
           STAGES=CONFIG["STAGES_WALK"], num_warps=CONFIG["WARPS_WALK"])


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

    # a no-grad call's windows replay their Phase 1 from CUDA graphs in two alternating
    # buffer slots (plan_graph.py); a training call's plan is handed to its backward
    plan_graphs = bool(CONFIG["PLAN_GRAPH"]) and not save and bank.device.type == "cuda"

    def make(item):
        k, win = item
        sl = slice(*win)
        if plan_graphs:   # the graph's static inputs are copies: no contiguous copies first
            return plan_graph.plan(S, k_idx[:, sl], k_val[:, sl], beta[:, sl], g[:, sl],
                                   q_idx[:, sl], q_val[:, sl], C, gate_params, k % 2)
        # raw gate inputs ([Bg, T, GH], any strides) are read through their strides
        b, a = (beta[:, sl], g[:, sl]) if gate_params else _contig(beta[:, sl], g[:, sl])
        return plan(S, *_contig(k_idx[:, sl], k_val[:, sl]), b, a,
                    *_contig(q_idx[:, sl], q_val[:, sl]), C, gate_params)

    from .. import kept, ops
    whole = len(wins) == 1
    keep = None
    for (_, (t0, t1)), pl in ahead(list(enumerate(wins)), make, bank.device,
                                   CONFIG["PLAN_AHEAD"], reuse=plan_graphs):
        out = readings if whole else bank.new_empty(P, t1 - t0, hd)
        saved = raw[t0 // C * P * C:-(-t1 // C) * P * C] if save else dummy
        # not while a CUDA graph records the call (a compiled graph's extern call: nothing
        # takes the offer there, and it would pin memory of the graph's pool)
        pre, join = None, lambda: None
        if save and whole and CONFIG["KEEP"] and not ops.capturing(bank):
            if CONFIG["PRELUDE"]:   # the backward's prelude, beside this walk
                pre, join = beside(lambda: bwd.prelude(pl, S, snapshot_quant, CONFIG),
                                   bank.device, CONFIG["PRELUDE"] == 2)
            keep = Kept(pl, torch.empty(pl.NC, P, pow2(C), hd, dtype=torch.float32,
                                        device=bank.device), pre)
        _step_walk(bank, pl, v if whole else v[:, t0:t1].contiguous(), out, saved, save,
                   None if keep is None else keep.vmr)
        join()
        if not whole:
            readings[:, t0:t1] = out
    if rows is None:
        rows, scales = pack_log(raw, snapshot_quant, bank.dtype)
    if keep is not None:
        kept.keep_for_backward(readings, keep)
    return readings, rows, scales


@dataclasses.dataclass(frozen=True)
class Kept:
    """What a training forward's step walk hands to its backward (``kept.keep_for_backward``):
    its Phase 1 (``phase1.plan``) and ``v - r0`` of every chunk (``[NC, P, CP, hd]`` fp32),
    which the backward would otherwise recompute (a plan, and a gather of every write row
    per chunk). About 0.2 GiB at config A, beside the undo log's 1.6 GiB. ``prelude``
    (``backward.Prelude`` or None): the backward's groups and chunk-start sources, made
    by the forward when ``CONFIG["PRELUDE"]`` asks for it."""
    plan: object
    vmr: Tensor
    prelude: object = None


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
    bd = {"grid": _walk_block_cols(bank.shape[1]), "step": CONFIG["BD_STEP"]}.get(walk, CONFIG["BD"])
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
