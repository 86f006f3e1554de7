"""Static SASS of one step kernel for sm_90, compiled here without a GPU: instructions by
opcode (the dB launch measured issue-bound in Nsight Compute, session 12, so its
instruction count is the figure to cut). Usage:

    python benchmarks/sass_stats.py group|gather|dw|write|dev [KEY=INT ...]
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton

import aot_compile_check as acc
from sdm_inductor.kernels import step, step_backward as sb
from sdm_inductor.kernels.host import CONFIG as CFG

NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")


def kernels(bank="*bf16"):
    f32, i32 = "*fp32", "*i32"
    W = R = 64
    C = 128
    return {
        "group": (sb._step_bwd_group_kernel, dict(dB_ptr=bank, g_slot_ptr=i32, g_len_ptr=i32,
                  g_nw_ptr=i32, g_decay_ptr=f32, g_tok_ptr=i32, g_ev_ptr=f32, dr_ptr=f32,
                  dy_ptr=bank), dict(C=C, E=W + R, BD=CFG["BD_GROUP"], NG=CFG["NG_GROUP"],
                                     KW=CFG["KW_GROUP"], CP=C, CL=CFG["CL_GROUP"]), CFG["WARPS_GROUP"]),
        "gather": (step._step_gather_kernel,
                   dict(bank_ptr=bank, slot_ptr=i32, ev_ptr=f32, v_ptr=bank, beta_ptr=f32,
                        X_ptr=f32, QKX_ptr=f32, out_ptr=bank, u_ptr=f32, i_ptr=f32, d_ptr=f32,
                        cnt_ptr=i32, keep_ptr=f32),
                   dict(C=C, W=W, R=R, BD=CFG["BD_STEP"], WP=64, RP=64, CP=C, MB=CFG["MB_STEP"],
                        TB=64, PREC="tf32", MIX=0, KEEP=bool(CFG["KEEP"]), EV_W="", EV_R=""), CFG["WARPS_STEP"]),
        "dw": (sb._step_bwd_dw_kernel, dict(dB_ptr=bank, work_ptr=bank, slot_ptr=i32,
               coef_ptr=f32, d_ptr=f32, dd_ptr=f32, pc_ptr=f32, pm_ptr=f32),
               dict(C=C, W=W, R=R, BD=CFG["BD_DW"] or CFG["BD_STEP_B"], WP=W, CP=C, EV="", EV_DB=""),
               CFG["WARPS_DW"] or CFG["WARPS_STEP_B"]),
        "dev": (sb._step_bwd_dev_kernel, dict(work_ptr=bank, slot_ptr=i32, dr_ptr=f32,
                dy_ptr=bank, pe_ptr=f32), dict(C=C, W=W, R=R, BD=CFG["BD_STEP_B"], WP=W, RP=R,
                                                CP=C), CFG["WARPS_STEP_B"]),
        "write": (step._step_write_kernel, dict(bank_ptr=bank, d_ptr=f32, run_slot_ptr=i32,
                  run_len_ptr=i32, run_decay_ptr=f32, run_tok_ptr=i32, run_coef_ptr=f32,
                  log_ptr=bank), dict(C=C, W=W, BD=CFG["BD_STEP_W"], NG=CFG["NG_STEP"],
                                      KW=CFG["KW_STEP"], CP=C, SAVE=bool(CFG.get("SAVE", 1)), EV="",
                                      CL=CFG["CL_WRITE"]),
                  CFG["WARPS_STEP_W"]),
    }


def sass(ck) -> list[str]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        open(path, "wb").write(ck.asm["cubin"])
        out = subprocess.run([NVDISASM, "-c", path], capture_output=True, text=True).stdout
    return [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", out)]


def main():
    name = sys.argv[1]
    for a in sys.argv[2:]:
        k, v = a.split("=")
        CFG[k] = int(v)
    kern, types, consts, warps = kernels()[name]
    ck = acc.compile_one(kern, types, consts, warps)
    ops = sass(ck)
    by = collections.Counter(op.split(".")[0] for op in ops)
    print(f"{len(ops)} instructions;", ", ".join(f"{k} {v}" for k, v in by.most_common(18)))


if __name__ == "__main__":
    main()
