"""How the kernels are launched: through ``torch.library.wrap_triton`` so that a
``triton_op`` body that calls them is traced into Inductor's generated code."""
from __future__ import annotations

import functools

import triton
from torch._library.triton import set_wrap_triton_enabled
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


def direct_launches(fn):
    """Run ``fn`` (an eager implementation, called with real tensors only) with
    ``wrap_triton`` switched off, as ``triton_op`` does for its own eager calls: every
    launch then goes straight to the kernel instead of through the higher-order op's
    dispatch, which costs ~100 us per launch on the host (the step walk makes hundreds)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with set_wrap_triton_enabled(False):
            return fn(*args, **kwargs)
    return run
