"""``CONFIG``: the kernels' launch parameters and the few switches a user or a test needs
(the walk form, CUDA-graph replay, token windows, PDL), one dict read at every call."""
from __future__ import annotations

import os

# Launch parameters and the few switches a user or a test needs, in one dict: tests shrink
# the tiles (the interpreter's shapes are tiny) and the benchmarks may override entries.
# Every default is the measured-best form on an H200 (docs/performance.md).
CONFIG = dict(
    # --- which walk (eager step walk / traced queue walk), and the eager call's extras
    # WALK: "auto" (step walk when eager, queue walk when traced, except the small shapes
    # of ``runtime.launch.column_suits``: column walk), or "step" / "queue" / "column" to
    # force one (a traced call never takes the step walk). Environment: SDM_INDUCTOR_WALK.
    WALK=os.environ.get("SDM_INDUCTOR_WALK", "auto"),
    # WALK_GRAPHS: an eager step walk whose launches (kernels, grids, every argument) are
    # those of an earlier call replays them from a CUDA graph (``runtime/graphs.py``); 0 makes every
    # launch. Environment: SDM_INDUCTOR_WALK_GRAPHS.
    WALK_GRAPHS=int(os.environ.get("SDM_INDUCTOR_WALK_GRAPHS", "1")),
    # PLAN_GRAPHS: at most this many no-grad Phase 1s (plans) replayed from CUDA graphs when
    # a call's inputs are those of an earlier call (``graphs.made``): a lone call at config
    # A 12 % faster. Each graph keeps its plan's memory for as long as it is kept (242 MiB
    # reserved at A, 118 at B); 0: none. Environment: SDM_INDUCTOR_PLAN_GRAPHS.
    PLAN_GRAPHS=int(os.environ.get("SDM_INDUCTOR_PLAN_GRAPHS", "1")),
    # WINDOW_TOKENS: the eager no-grad forward runs the sequence in windows of about this
    # many tokens, so its working memory (Phase 1 of a window) does not grow with T.
    # TRAIN_WINDOW_TOKENS (0: the whole sequence): the same for the step walks' training
    # calls; each window's Phase 1 then runs on a side stream one window ahead
    # (``runtime/pipeline.py``). Off by default: Phase 1's kernels are latency-bound and each window
    # costs host time, so one window is faster; windows bound the memory of long sequences.
    WINDOW_TOKENS=8192, TRAIN_WINDOW_TOKENS=0,
    # KEEP: a training forward in one window hands its Phase 1 and (after a step or queue
    # walk) its ``v - r0`` to the backward (``Kept``; a traced forward through the graph),
    # which then skips its own Phase 1 and gathers (0: the backward recomputes them, as it
    # must after token windows).
    KEEP=1,
    # PDL: programmatic dependent launch of the step walks' launches on sm_90+
    # (``runtime.launch.pdl``); 2: the row kernels also issue their early loads (Phase 1's arrays,
    # inputs, the undo log) before waiting for the launch before them
    # (``tiles._grid_dependency``); 3: the backward also does work that needs nothing of the
    # launch just before (2-2.5 % faster than 2), up to chunks of PDL3_MAX_C (at C = 256, 2
    # is 3 % faster); the forward treats 3 as 2. Environment: SDM_INDUCTOR_PDL.
    PDL=int(os.environ.get("SDM_INDUCTOR_PDL", "3")), PDL3_MAX_C=128,
    # --- the column walks (forward/column_walk.py, backward/reverse_walk.py): BD bank columns per
    # program (16 bf16 columns = one 32-byte sector per gathered row), TB tokens per tile,
    # EW entries per gather tile, NG write positions per tile of the write pass, KW run
    # members gathered with the run header (longer runs loop). BWD_WINDOWS: the backward runs the
    # chunks in this many launches, so its per-column-block partial sums hold a window of
    # chunks (2 against 4: as fast, half the partial sums' memory).
    BD=16, BD_DECODE=16, BD_BWD=16, TB=64, EW=16, EW_BWD=8, NG=256, WARPS=8, WARPS_BWD=8,
    KW=4, NG_BWD=256, KW_BWD=4, BWD_WINDOWS=2,
    # --- the forward step walk (forward/step_walk.py): the gather launch (BD_STEP columns per program
    # in WARPS_STEP warps: one warp sums a token's entries in registers and shuffles, where
    # four crossed warps through shared memory with bank conflicts, 5-12 % slower), the
    # product launch (MB_MIX columns x TB_MIX tokens, WARPS_MIX warps; blocks of 32 tokens
    # give twice the programs of 64 at C = 128), the write launch (BD_STEP_W columns, NG_STEP
    # positions, KW_STEP inline members, WARPS_STEP_W warps, CL_WRITE column blocks per
    # program). MIX_ROWS: the product launch loads each token block's rows of X and QKX
    # whole before waiting for the gather launch (``_mix_rows_load``), up to C = 128
    # (above it the rows forms spill); 0 takes the blocks form at every C.
    BD_STEP=128, WARPS_STEP=1, BD_STEP_W=128, NG_STEP=32, KW_STEP=2, WARPS_STEP_W=4,
    CL_WRITE=1, MB_MIX=32, TB_MIX=32, WARPS_MIX=4, MIX_ROWS=1,
    # --- the queue walk (forward/queue_walk.py: traced calls): the step walk's items in one
    # launch of QUEUE_PROGRAMS_PER_SM programs per SM of WARPS_QUEUE warps; a gather item
    # takes QUEUE_GATHER_TOKENS tokens at once (a power of two; one per warp at 4), summing
    # QUEUE_GATHER_ENTRIES (a power of two) of each token's entries a step (1: 6 % faster
    # than 2 at A and B no-grad, 4 as 2); a write item takes QUEUE_WRITE_TILES tiles (one
    # wait and one count per item: 4 and 4 were 8 % faster than 1 and 1, 8 and 8 slower).
    # The reverse queue walk (backward/queue_walk.py) takes the same grid; its gather, dw
    # and dev items QUEUE_TOKENS_B tokens each (2: 1-2 % faster than 4 and than 1 at A and
    # B), its product items MB_QUEUE_B columns x TB_QUEUE_B tokens (32 x 16: 152 registers,
    # three programs per SM; 32 x 32 needs 208 and is 14 % slower at A and B, 16 x 16 8 %),
    # its dB items QUEUE_DB_TILES tiles each (4: 7 % faster than 1 at A and B, 2 and 8
    # 1.5-4 % slower)
    QUEUE_PROGRAMS_PER_SM=8, WARPS_QUEUE=4, QUEUE_GATHER_TOKENS=4, QUEUE_GATHER_ENTRIES=1,
    QUEUE_WRITE_TILES=4, QUEUE_TOKENS_B=2, MB_QUEUE_B=32, TB_QUEUE_B=16, QUEUE_DB_TILES=4,
    # Register caps of the forward and reverse queue walks (each kind of item a non-inlined
    # function but the reverse walk's dB tiles, so a cap binds the largest one), 2-byte
    # banks only (``register_cap``): 168 and 128 compile without spills and fit 3 and 4
    # programs per SM; 0: no cap
    MAXNREG_QUEUE=168, MAXNREG_QUEUE_B=128,
    # --- the backward step walk (backward/step_walk.py): BD_STEP_B columns of its gather, dw
    # and d ev programs, the dw launch in WARPS_STEP_B warps (the gather in WARPS_STEP, the
    # restore with the forward write's BD_STEP_W, NG_STEP, WARPS_STEP_W); its two product
    # launches MB_MIX_B columns x TB_MIX_B tokens in WARPS_MIX_B warps (64 x 16: half the partial sums of 32 x 32, 1.5-2 % faster), *_WIDE
    # above C = 128 (the blocks form, where 64 x 16 is 5 % slower); MIX_ROWS_B as MIX_ROWS.
    # The d ev and dB launch (one grid of both kinds of programs): the dB programs take
    # BD_GROUP columns, NG_GROUP positions, KW_GROUP inline members, CL_GROUP column blocks
    # per program (the group headers load once: 3 is 2.5 % faster than 1); the launch runs
    # in WARPS_DEV_DB warps, registers capped at MAXNREG_DEV_DB (four programs of 8 warps
    # per SM, not three).
    BD_STEP_B=128, WARPS_STEP_B=4, MB_MIX_B=64, TB_MIX_B=16, WARPS_MIX_B=4,
    MB_MIX_B_WIDE=32, TB_MIX_B_WIDE=32, MIX_ROWS_B=1,
    BD_GROUP=64, NG_GROUP=32, KW_GROUP=2, CL_GROUP=3, WARPS_DEV_DB=8, MAXNREG_DEV_DB=64,
)
