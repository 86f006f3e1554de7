"""Static SASS of one step kernel for sm_90, compiled here without a GPU: instructions by
opcode (for launches that Nsight Compute finds issue-bound, such as the backward's dB
launch, the instruction count is the figure to cut). Usage:

    python benchmarks/tools/sass_stats.py group|gather|dw|write|dev [KEY=INT ...] [SAVE=0]

(C = 128, W = R = 64, a bf16 bank; kernels and launch parameters as
``aot_compile_check.step_specs``, ``KEY=INT`` overriding ``host.CONFIG``.)
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
from sdm_inductor.kernels.host import CONFIG as CFG

NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")


def sass(ck) -> list[str]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        open(path, "wb").write(ck.asm["cubin"])
        out = subprocess.run([NVDISASM, "-c", path], capture_output=True, text=True).stdout
    return [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", out)]


def main():
    name = sys.argv[1]
    over = dict(a.split("=") for a in sys.argv[2:])
    save = bool(int(over.pop("SAVE", 1)))   # the write launch with the undo log (training)
    CFG.update({k: int(v) for k, v in over.items()})
    ck = acc.compile_one(*acc.step_specs(128, "*bf16", "tf32", save)[name])
    ops = sass(ck)
    by = collections.Counter(op.split(".")[0] for op in ops)
    print(f"{len(ops)} instructions;", ", ".join(f"{k} {v}" for k, v in by.most_common(18)))


if __name__ == "__main__":
    main()
