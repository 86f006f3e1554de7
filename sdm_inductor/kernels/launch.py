"""How the kernels are launched: through ``torch.library.wrap_triton`` so that a
``triton_op`` body that calls them is traced into Inductor's generated code."""
from __future__ import annotations

import triton
from torch.library import wrap_triton


def pow2(n: int) -> int:
    """Smallest power of two >= n (Triton block sizes)."""
    return triton.next_power_of_2(max(1, int(n)))


def launch(kernel, grid, *args, **meta):
    """``kernel[grid](*args, **meta)``, traceable inside a ``triton_op``."""
    wrap_triton(kernel)[grid](*args, **meta)
