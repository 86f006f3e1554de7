"""sdm_inductor: Sparse Delta Memory as torch.library ops, Triton kernels, Inductor
lowerings and pattern rewrites.

``import sdm_inductor`` registers the ``torch.ops.sdm`` library (CPU always, CUDA whenever
Triton is importable: no GPU is needed to register it).
"""
from . import ops, reference
from .api import sdm_write_read, to_streams, write_read
from .ops import count_repeated_write_slots, last_dispatch, repeated_write_slots
from .validation import SDMArgumentError

# Each subpackage registers itself on import: CUDA kernels (when Triton is there), the
# Inductor lowerings, and the pattern-rewrite passes (on by import).
from . import kernels, lowerings, patterns  # noqa: E402
from . import nn  # noqa: E402
from .patterns import (RepeatedWriteSlotError, disable_rewrites, enable_rewrites,  # noqa: E402
                       explain, rewrite_exported, rewrites)

__version__ = "0.1.0"

__all__ = [
    "sdm_write_read", "write_read", "to_streams", "repeated_write_slots",
    "count_repeated_write_slots", "last_dispatch", "SDMArgumentError", "ops", "reference",
    "nn", "explain", "rewrite_exported", "enable_rewrites", "disable_rewrites", "rewrites",
    "RepeatedWriteSlotError",
]
