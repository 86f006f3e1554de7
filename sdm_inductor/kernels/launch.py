"""How the kernels are launched: through ``torch.library.wrap_triton`` so that a
``triton_op`` body that calls them is traced into Inductor's generated code."""
from __future__ import annotations

import triton
from torch.library import wrap_triton
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction


def pow2(n: int) -> int:
    """Smallest power of two >= n (Triton block sizes)."""
    return triton.next_power_of_2(max(1, int(n)))


def launch(kernel, grid, *args, **meta):
    """``kernel[grid](*args, **meta)``, traceable inside a ``triton_op``."""
    if isinstance(kernel, (JITFunction, Autotuner)):
        wrap_triton(kernel)[grid](*args, **meta)
    else:
        # TRITON_INTERPRET=1 makes kernels InterpretedFunctions, which torch 2.11's
        # wrap_triton refuses; the interpreter only runs eagerly, so launch directly
        kernel[grid](*args, **meta)
