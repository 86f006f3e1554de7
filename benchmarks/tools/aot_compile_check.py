"""Compile every kernel for sm_90 on a machine without a GPU (Triton's bundled ptxas):
catches compile errors before device time is spent, and prints registers / stack / spills /
shared memory of each variant (launch parameters of ``host.CONFIG``, overridable).
Usage: python benchmarks/tools/aot_compile_check.py [bf16|fp32] [--code] [--ptxas=PATH ...]
[KEY=INT ...]

``--ptxas=PATH`` adds the report of another ptxas for the same PTX, e.g. the one a torch
build ships (``torch/bin/ptxas``), which Inductor's compile workers put on
``TRITON_PTXAS_PATH``: the kernels that torch.compile and AOTInductor emit are assembled by
it, except the capped ones, which are assembled by Triton's own as eager launches are
(lowerings/kernel_source.py; docs/performance.md, "Traced walks"). A register cap that one
ptxas meets without spilling may spill under the other.

``--code`` adds to each line a hash of the kernel's PTX instructions without debug
information: the output of two trees, diffed, tells whether a source change altered
any instruction of the kernels as launched.
"""
from __future__ import annotations

import hashlib
import inspect
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sdm_inductor.kernels.backward import phase1_grads, reverse_walk, sources
from sdm_inductor.kernels.backward import queue_walk as queue_reverse
from sdm_inductor.kernels.backward import step_walk as step_reverse
from sdm_inductor.kernels.common.tiles import ROWS_MAX_CP
from sdm_inductor.kernels.config import CONFIG as CFG
from sdm_inductor.kernels.forward import column_walk, decode, queue_walk, quantize, step_walk
from sdm_inductor.kernels.phase1 import entries, groups, headers, pairs, solve

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


PTXAS_OTHER: list[str] = []   # --ptxas=PATH


def _ptxas_report(ptx: str) -> str:
    """registers, the entry's cumulative stack and the spill stores summed over the kernel's
    functions (non-inlined helpers spill on their own), from ``ptxas -v`` of each ptxas."""
    out, exes = [], [PTXAS] + PTXAS_OTHER
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        open(path, "w").write(ptx)
        logs = [subprocess.run([exe, "-v", "--gpu-name", "sm_90a", path, "-o",
                                os.path.join(d, "k.cubin")], capture_output=True, text=True)
                for exe in exes]
    for i, (exe, res) in enumerate(zip(exes, logs)):
        regs = re.findall(r"Used (\d+) registers", res.stderr)
        # the entry's stack: cumulative over the calls of non-inlined helpers, else its frame
        stack = (re.findall(r"(\d+) bytes cumulative stack size", res.stderr)
                 or re.findall(r"(\d+) bytes stack frame", res.stderr)[:1])
        spill = sum(int(x) for x in re.findall(r"(\d+) bytes spill stores", res.stderr))
        tag = "" if i == 0 else f"[{exe}] "
        out.append(f"{tag}regs={regs[-1] if regs else '?'} stack={stack[-1] if stack else '?'} "
                   f"spill_stores={spill}")
    return " | ".join(out)


# integer arguments that are multiples of 16 at the configs (Triton's launcher marks such
# values, and 16-byte aligned pointers, ``tt.divisibility = 16``, which enables vector
# loads: without the marks the kernels compile to other code than the GPU runs)
DIV16_INTS = ("hd", "width")


CODE = False   # --code


def _code_hash(ptx: str) -> str:
    """A hash of the PTX's instructions: without line records, comments, labels' debug
    names and the DWARF sections (``.b8`` data), which move with the source's lines."""
    skip = re.compile(r"\s*(\.loc|\.file|//|\.section|\.b8|\.b16|\.b32|\.b64)")
    tmp = re.compile(r"\$L__tmp\d+:$")   # inlined functions' debug labels
    lines = [ln for ln in ptx.splitlines()
             if not skip.match(ln) and not tmp.match(ln) and "DW_" not in ln
             and "debug" not in ln]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


def compile_one(kernel, types: dict, consts: dict, num_warps=4, maxnreg=None):
    if "PDL" in kernel.arg_names:   # the step kernels as launched on sm_90: with PDL
        consts = dict(consts, PDL=max(1, int(CFG["PDL"])))
    # constexpr parameters left out take their defaults, as a launch does (not i32 args)
    consts = {**{q.name: q.default for q in kernel.params
                 if q.is_constexpr and q.default is not inspect.Parameter.empty}, **consts}
    sig, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        else:
            sig[name] = types.get(name, "i32")
            if sig[name].startswith("*") or name in DIV16_INTS:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(kernel, sig, constexprs={k: v for k, v in consts.items()}, attrs=attrs)
    opts = dict(num_warps=num_warps, launch_pdl=consts.get("PDL", False))
    if maxnreg:   # (a launch's register cap, as host.CONFIG's MAXNREG_* pass it)
        opts["maxnreg"] = maxnreg
    ck = triton.compile(src, target=TARGET, options=opts)
    shown = {k: v for k, v in consts.items() if k in ("C", "BD", "QMODE", "SAVE", "MB", "TB", "ROWS")}
    code = f" code={_code_hash(ck.asm['ptx'])}" if CODE else ""
    print(f"{kernel.fn.__name__:20s} warps={num_warps} smem={ck.metadata.shared} {shown} "
          f"{_ptxas_report(ck.asm['ptx'])}{code}")
    return ck


def step_specs(C: int, bank: str, prec: str, save: bool) -> dict:
    """``(kernel, argument types, constexprs, warps)`` of the step walks' row launches at
    W = R = 64 and chunk ``C``, with ``host.CONFIG``'s launch parameters: the forward's
    gather and write, the backward's Dw, ``d ev`` and dB (also ``sass_stats.py``'s)."""
    f32, i32 = "*fp32", "*i32"
    W = R = 64
    BDB, wg = CFG["BD_STEP_B"], CFG["WARPS_STEP_B"]
    # the backward's chunk-start rows from the final bank and a raw undo log
    src = True
    src_ptrs = dict(log_ptr=bank, scale_ptr=f32, src_ptr=i32)
    return {
        "gather": (step_walk._step_gather_kernel,
                   dict(bank_ptr=bank, slot_ptr=i32, ev_ptr=f32, v_ptr=bank, beta_ptr=f32,
                        u_ptr=f32, i_ptr=f32, keep_ptr=f32),
                   dict(C=C, W=W, R=R, BD=CFG["BD_STEP"], WP=64, RP=64, CP=C,
                        KEEP=bool(CFG["KEEP"])),
                   CFG["WARPS_STEP"]),
        "write": (step_walk._step_write_kernel,
                  dict(bank_ptr=bank, d_ptr=f32, run_slot_ptr=i32, run_len_ptr=i32,
                       run_decay_ptr=f32, run_tok_ptr=i32, run_coef_ptr=f32, log_ptr=bank),
                  dict(C=C, W=W, BD=CFG["BD_STEP_W"], NG=CFG["NG_STEP"], KW=CFG["KW_STEP"],
                       CP=C, SAVE=save, CL=CFG["CL_WRITE"]),
                  CFG["WARPS_STEP_W"]),
        "dw": (step_reverse._step_bwd_dw_kernel,
               dict(dB_ptr=bank, work_ptr=bank, **src_ptrs, slot_ptr=i32, coef_ptr=f32,
                    d_ptr=f32, dd_ptr=f32, pc_ptr=f32, pm_ptr=f32),
               dict(C=C, W=W, R=R, BD=BDB, WP=W, CP=C, CG="", SRC=src, QMODE=0), wg),
        # d ev and dB as one grid (at A / B, C = 128: periods of 3 and 8 programs)
        "dev_group": (step_reverse._step_bwd_dev_group_kernel,
                      dict(work_ptr=bank, **src_ptrs, slot_ptr=i32, pe_ptr=f32, dB_ptr=bank,
                           g_slot_ptr=i32, g_len_ptr=i32, g_nw_ptr=i32, g_decay_ptr=f32,
                           g_pos_ptr=i32, g_tok_ptr=i32, g_ev_ptr=f32, g_tok0_ptr=i32,
                           g_ev0_ptr=f32, dr_ptr=f32, dy_ptr=bank),
                      dict(C=C, W=W, R=R, BD=BDB, WP=W, RP=R, CP=C, NCB=6,
                           BDG=CFG["BD_GROUP"], NG=CFG["NG_GROUP"], KW=CFG["KW_GROUP"],
                           CL=CFG["CL_GROUP"], NCBG=4, ND=3, NGP=8, PDLG=2, CG="", SRC=src,
                           QMODE=0),
                      CFG["WARPS_DEV_DB"]),
    }


def main(dtype="bf16"):
    bank = "*bf16" if dtype == "bf16" else "*fp32"
    f32, i32, i64 = "*fp32", "*i32", "*i64"

    def cap(maxnreg):   # the queue walks' register caps reach 2-byte banks only (register_cap)
        return maxnreg if dtype == "bf16" else None
    W, R, C = 64, 64, 64
    for gated in (False, True):   # gated: beta and g from the raw projections (bf16)
        compile_one(entries._prep_kernel,
                    dict(kidx_ptr=i64, kval_ptr=bank, g_ptr=bank if gated else f32,
                         qidx_ptr=i64, qval_ptr=bank, beta_ptr=bank if gated else f32,
                         alog_ptr=f32, dtb_ptr=f32, slot_ptr=i32, val_ptr=f32, gate_ptr=f32,
                         key_ptr=i32 if gated else i64, first_ptr=i32, bout_ptr=f32),
                    dict(W=W, R=R, G=1, WP=64, RP=64, GATED=gated))
    for kt in (i32, i64):   # sort keys: int32 when they fit, else int64
        blk = groups.GROUPS_BLK
        compile_one(groups._block_writes_kernel,
                    dict(skey_ptr=kt, sperm_ptr=i64, perm_ptr=i32, cnt_ptr=i32, gate_ptr=f32,
                         val_ptr=f32, sgate_ptr=f32, sval_ptr=f32, stok_ptr=i32),
                    dict(E=W + R, BLK=blk, FLAT=kt == i32))
        compile_one(groups._group_bounds_kernel,
                    dict(skey_ptr=kt, cnt_ptr=i32, wex_ptr=i32, gsp_ptr=i32, gep_ptr=i32),
                    dict(BLK=blk, NBP=16))
        compile_one(groups._group_sizes_kernel,
                    dict(skey_ptr=kt, perm_ptr=i32, slot_ptr=i32, gs_ptr=i32, nw_ptr=i32,
                         na_ptr=i32, rslot_ptr=i32, rlen_ptr=i32, rtok_ptr=i32, rent_ptr=i32,
                         wex_ptr=i32, gsp_ptr=i32, gep_ptr=i32), dict(E=W + R, BLK=blk))
    compile_one(headers._group_counts_kernel,
                dict(perm_ptr=i32, gs_ptr=i32, na_ptr=i32, cnt_ptr=i32),
                dict(BLOCK=headers.GROUPS_BLOCK), 4)
    compile_one(headers._entry_groups_kernel,
                dict(perm_ptr=i32, gs_ptr=i32, slot_ptr=i32, na_ptr=i32, nw_ptr=i32,
                     decay_ptr=f32, ev_ptr=f32, cnt_ptr=i32, o_slot_ptr=i32, o_len_ptr=i32,
                     o_nw_ptr=i32, o_decay_ptr=f32, o_pos_ptr=i32, o_tok_ptr=i32,
                     o_ev_ptr=f32, o_tok0_ptr=i32, o_ev0_ptr=f32),
                dict(E=W + R, BLOCK=headers.GROUPS_BLOCK, NBP=16), 4)
    compile_one(solve._inverse_kernel, dict(A_ptr=f32, QK_ptr=f32, beta_ptr=f32, X_ptr=f32,
                                            QKX_ptr=f32),
                dict(C=64, CP=64, PREC="tf32x3", LOG=6))
    for CC in (96, 128):
        mats = dict(A_ptr=f32, QK_ptr=f32, beta_ptr=f32, X_ptr=f32, QKX_ptr=f32)
        compile_one(solve._inverse_diag_kernel, mats, dict(C=CC, H=64, PREC="tf32x3", LOG=6),
                    solve.BLOCKED_WARPS)
        compile_one(solve._inverse_low_kernel, mats, dict(C=CC, H=64, PREC="tf32x3"),
                    solve.BLOCKED_WARPS)
    for CC, split in ((64, True), (128, True), (128, False), (256, True)):
        # the split form as eager calls launch it (sorted members, its entry blocks and
        # warps); the single form as calls with no writes or no reads do
        compile_one(pairs._pairs_kernel,
                    dict(val_ptr=f32, sgate_ptr=f32, sval_ptr=f32, stok_ptr=i32, gs_ptr=i32,
                         nw_ptr=i32, gam_ptr=f32, gend_ptr=f32, ev_ptr=f32, coef_ptr=f32,
                         decay_ptr=f32, A_ptr=f32, QK_ptr=f32, lx_ptr=f32, lt_ptr=i32),
                    dict(W=W, R=R, CP=CC, KM=pairs.PAIR_MEMBERS, SPLIT=split,
                         **dict(zip(("EB", "LMAX"),
                                    pairs._pair_launch_blocks(CC, W, R, split)))),
                    pairs._pair_warps(CC) if split else 4)
    # C = 128 twice: the no-grad forward (configs A and B) and the training forward
    for CC, train in ((64, False), (128, False), (128, True), (256, True)):
        compile_one(queue_walk._queue_walk_kernel,
                    dict(bank_ptr=bank, slot_ptr=i32, ev_ptr=f32, v_ptr=bank, beta_ptr=f32,
                         X_ptr=f32, QKX_ptr=f32, out_ptr=bank, run_slot_ptr=i32,
                         run_len_ptr=i32, run_decay_ptr=f32, run_tok_ptr=i32,
                         run_coef_ptr=f32, u_ptr=f32, i_ptr=f32, d_ptr=bank, log_ptr=bank,
                         keep_ptr=f32, sync_ptr=i32),
                    dict(C=CC, W=W, R=R, BD=CFG["BD_STEP"], CP=CC,
                         TB=CFG["TB_MIX"], MB=CFG["MB_MIX"], NG=CFG["NG_STEP"],
                         KW=CFG["KW_STEP"], SAVE=train, PREC="tf32",
                         LINE=queue_walk.LINE, KG=CFG["QUEUE_GATHER_TOKENS"],
                         KT=CFG["QUEUE_WRITE_TILES"], ES=CFG["QUEUE_GATHER_ENTRIES"],
                         KEEP=train,    # a training forward keeps v - r0
                         ROWS=bool(CFG["MIX_ROWS"]) and CC <= ROWS_MAX_CP, HD16=True),
                    num_warps=CFG["WARPS_QUEUE"], maxnreg=cap(CFG["MAXNREG_QUEUE"]))
        if CC == 128 and not train:
            continue   # the backward walks once per chunk size
        compile_one(queue_reverse._queue_reverse_kernel,
                    dict(dB_ptr=bank, fin_ptr=bank, log_ptr=bank, scale_ptr=f32, src_ptr=i32,
                         slot_ptr=i32, ev_ptr=f32, coef_ptr=f32, v_ptr=bank, X_ptr=f32,
                         QK_ptr=f32, beta_ptr=f32, dy_ptr=bank, vmr_ptr=f32, d_ptr=f32,
                         dd_ptr=f32, dr_ptr=f32, dv_ptr=bank, pc_ptr=f32, pm_ptr=f32,
                         pqk_ptr=f32, pl_ptr=f32, pb_ptr=f32, pe_ptr=f32, g_slot_ptr=i32,
                         g_len_ptr=i32, g_nw_ptr=i32, g_decay_ptr=f32, g_pos_ptr=i32,
                         g_tok_ptr=i32, g_ev_ptr=f32, g_tok0_ptr=i32, g_ev0_ptr=f32,
                         sync_ptr=i32),
                    dict(C=CC, W=W, R=R, BD=CFG["BD_STEP_B"], WP=W, RP=R, CP=CC,
                         MB=min(CFG["MB_QUEUE_B"], CFG["BD_STEP_B"]),
                         TB=min(CFG["TB_QUEUE_B"], CC),
                         BDG=CFG["BD_GROUP"], NG=CFG["NG_GROUP"], KW=CFG["KW_GROUP"],
                         KT=CFG["QUEUE_TOKENS_B"], KB=CFG["QUEUE_DB_TILES"],
                         KEPT=CC != 64, PREC="tf32", LINE=queue_walk.LINE, HD16=True,
                         WIDTH16=True),
                    num_warps=CFG["WARPS_QUEUE"], maxnreg=cap(CFG["MAXNREG_QUEUE_B"]))
        compile_one(column_walk._forward_kernel,
                    dict(bank_ptr=bank, slot_ptr=i32, ev_ptr=f32, X_ptr=f32, QKX_ptr=f32,
                         v_ptr=bank, beta_ptr=f32, out_ptr=bank, run_slot_ptr=i32,
                         run_len_ptr=i32, run_decay_ptr=f32, run_tok_ptr=i32,
                         run_coef_ptr=f32, scratch_ptr=f32, log_ptr=bank),
                    dict(C=CC, W=W, R=R, BD=CFG["BD"], TB=64, EW=CFG["EW"], NG=CFG["NG"], CP=CC,
                         SAVE=CC != 64, PREC="tf32", HD16=True, KW=CFG["KW"]),
                    num_warps=CFG["WARPS"])
    prec = "tf32" if dtype == "bf16" else "ieee"
    for CC in (64, 128, 256):   # the step walk: a gather and a write launch per chunk
        specs = step_specs(CC, bank, prec, save=CC == 64)
        compile_one(*specs["gather"])
        # the product launch as host._step_forward makes it: whole rows before the wait
        # (MIX_ROWS) up to C = 128, blocks after it above
        compile_one(step_walk._step_mix_kernel,
                    dict(X_ptr=f32, QKX_ptr=f32, u_ptr=f32, i_ptr=f32, d_ptr=f32, out_ptr=bank),
                    dict(C=CC, MB=CFG["MB_MIX"], TB=min(CFG["TB_MIX"], CC), CP=CC, PREC=prec,
                         ROWS=bool(CFG["MIX_ROWS"]) and CC <= ROWS_MAX_CP,
                         PDL=CFG["PDL"]), CFG["WARPS_MIX"])
        compile_one(*specs["write"])
    for mode in (1, 2):
        compile_one(quantize._quantize_kernel, dict(raw_ptr=bank, out_ptr="*u8", scale_ptr=f32),
                    dict(MODE=mode, RB=quantize.ROWS_PER_PROGRAM, HP=512, HD16=True,
                         WIDTH16=True))
    compile_one(decode._decode_kernel,
                dict(bank_ptr=bank, slot_ptr=i32, val_ptr=f32, gate_ptr=f32, v_ptr=bank,
                     beta_ptr=f32, out_ptr=bank), dict(W=W, R=R, WP=64, RP=64, BD=16, HD16=True))
    for q in (0, 1, 2):
        compile_one(reverse_walk._reverse_kernel,
                    dict(dB_ptr=bank, work_ptr=bank, log_ptr=(bank if q == 0 else "*u8"),
                         scale_ptr=f32, run_slot_ptr=i32, slot_ptr=i32, ev_ptr=f32, coef_ptr=f32, g_slot_ptr=i32, g_len_ptr=i32,
                         g_nw_ptr=i32, g_decay_ptr=f32, g_pos_ptr=i32, g_tok_ptr=i32,
                         g_ev_ptr=f32,
                         X_ptr=f32, QK_ptr=f32,
                         beta_ptr=f32, v_ptr=bank, dy_ptr=bank, dv_ptr=bank, pe_ptr=f32,
                         pc_ptr=f32, pm_ptr=f32, pb_ptr=f32, pqk_ptr=f32, pl_ptr=f32,
                         scratch_ptr=f32),
                    dict(C=C, W=W, R=R, BD=CFG["BD_BWD"], TB=64, EW=CFG["EW_BWD"], NG=CFG["NG_BWD"],
                         CP=C, QMODE=q, PREC="tf32", HD16=True, WIDTH16=True,
                         KW=CFG["KW_BWD"]),
                    num_warps=CFG["WARPS_BWD"])
    sb = step_reverse
    BDB, BDW, NGS = CFG["BD_STEP_B"], CFG["BD_STEP_W"], CFG["NG_STEP"]
    ww = CFG["WARPS_STEP_W"]
    for q in (0, 1):
        compile_one(sb._step_restore_kernel, dict(work_ptr=bank, log_ptr=bank if q == 0 else "*u8",
                    scale_ptr=f32, run_slot_ptr=i32), dict(C=C, W=W, BD=BDW, NG=NGS, QMODE=q), ww)
    # the gather launch reading a raw log itself (sources: raw logs only)
    lg = dict(log_ptr=bank, scale_ptr=f32, src_ptr=i32)
    compile_one(sb._step_bwd_gather_kernel, dict(work_ptr=bank, **lg, slot_ptr=i32,
                ev_ptr=f32, v_ptr=bank, vmr_ptr=f32),
                dict(C=C, W=W, R=R, BD=BDB, WP=W, CP=C, QMODE=0, SRC=True), CFG["WARPS_STEP"])
    specs = step_specs(C, bank, "tf32", save=True)
    compile_one(*specs["dw"])
    for CC in (64, 128, 256):   # the two products as step_reverse launches them: whole
        # rows before the wait (MIX_ROWS_B) up to C = 128, blocks (*_WIDE) above
        rows = bool(CFG["MIX_ROWS_B"]) and CC <= ROWS_MAX_CP
        wide = "" if rows else "_WIDE"
        shape = dict(C=CC, MB=CFG["MB_MIX_B" + wide], TB=min(CFG["TB_MIX_B" + wide], CC), CP=CC,
                     PREC="tf32", ROWS=rows,
                     PDL=CFG["PDL"] if CC <= CFG["PDL3_MAX_C"] else min(CFG["PDL"], 2))
        compile_one(sb._step_bwd_mix1_kernel, dict(X_ptr=f32, QK_ptr=f32, beta_ptr=f32,
                    vmr_ptr=f32, dy_ptr=bank, d_ptr=f32, dd_ptr=f32), shape, CFG["WARPS_MIX_B"])
        compile_one(sb._step_bwd_mix2_kernel, dict(X_ptr=f32, beta_ptr=f32, vmr_ptr=f32,
                    d_ptr=f32, dd_ptr=f32, dr_ptr=f32, dy_ptr=bank, dv_ptr=bank, pqk_ptr=f32,
                    pl_ptr=f32, pb_ptr=f32), shape, CFG["WARPS_MIX_B"])
    cap = CFG["MAXNREG_DEV_DB"]
    compile_one(*specs["dev_group"])
    compile_one(*specs["dev_group"], maxnreg=cap)
    for kt in (i32, "*i64"):   # the backward's chunk-start sources
        compile_one(sources._run_keys_kernel, dict(run_slot_ptr=i32, key_ptr=kt),
                    dict(CW=C * W, BLOCK=sources.BLOCK))
        compile_one(sources._ranges_kernel, dict(skey_ptr=kt, lo_ptr=i32, hi_ptr=i32),
                    dict(BLOCK=sources.BLOCK))
        compile_one(sources._search_kernel, dict(slot_ptr=i32, lo_ptr=i32, hi_ptr=i32,
                                                 order_ptr="*i64", src_ptr=i32, skey_ptr=kt),
                    dict(CE=C * (W + R), CW=C * W, BLOCK=sources.BLOCK))
    compile_one(sources._table_runs_kernel, dict(run_slot_ptr=i32, table_ptr=i32),
                dict(CW=C * W, BLOCK=sources.BLOCK))
    compile_one(sources._table_scan_kernel, dict(table_ptr=i32),
                dict(NONE=sources.NONE, SB=sources.SCAN_SLOTS, CB=sources.SCAN_CHUNKS))
    compile_one(sources._table_gather_kernel, dict(slot_ptr=i32, table_ptr=i32, src_ptr=i32),
                dict(NONE=sources.NONE, CE=C * (W + R), BLOCK=sources.BLOCK))
    compile_one(phase1_grads._pair_grads_kernel,
                dict(val_ptr=f32, gam_ptr=f32, gend_ptr=f32, perm_ptr=i32, gs_ptr=i32,
                     nw_ptr=i32, na_ptr=i32, slot_ptr=i32, decay_ptr=f32, beta_ptr=f32,
                     dev_ptr=f32, dcoef_ptr=f32, dm_ptr=f32, dL_ptr=f32, dQK_ptr=f32,
                     dval_ptr=f32, dgam_ptr=f32, dgend_ptr=f32),
                dict(W=W, R=R, EB=32), phase1_grads.PAIR_GRADS_WARPS)
    compile_one(phase1_grads._gate_grads_kernel,
                dict(perm_ptr=i32, gs_ptr=i32, nw_ptr=i32, na_ptr=i32, dgam_ptr=f32,
                     dgend_ptr=f32, dgate_ptr=f32), dict(W=W, R=R, WB=32),
                phase1_grads.GATE_GRADS_WARPS)


if __name__ == "__main__":
    args = sys.argv[1:]
    for a in [a for a in args if "=" in a and not a.startswith("--")]:   # KEY=INT overrides
        k, v = a.split("=")
        CFG[k] = int(v)
    CODE = "--code" in args
    PTXAS_OTHER += [a.split("=", 1)[1] for a in args if a.startswith("--ptxas=")]
    rest = [a for a in args if "=" not in a and not a.startswith("--")]
    main(rest[0] if rest else "bf16")
