"""Inductor lowerings for the sdm ops.

Importing this package registers rules that rewrite the sdm ops while AOTDispatcher
functionalizes a graph for a backend (torch.compile, AOTInductor), the hook
``torch.library.triton_op`` uses for itself:

- ``write_read``: ``sdm::write_read`` / ``write_read_gated`` / ``write_read_`` /
  ``write_read_backward``: casts hoisted into the graph; on CUDA the Triton kernels'
  triton_ops (traced into Inductor's output code) where ``EMIT_KERNELS`` says so (by
  default AOTInductor only); otherwise one extern call of the eager implementation per op
  call.
- ``layout``: ``sdm::split_heads`` / ``merge_heads`` / ``expand_bank`` as view + copy
  graph ops that Inductor fuses with their neighbours.
- ``offset_views``: a post-grad pass that keeps the in-place op correct for banks that are
  views at a storage offset (a torch 2.13 bug otherwise gives wrong rows).
- ``kernel_source``: the kernels compile from Inductor's output code as they compile
  eagerly: ``noinline`` helpers stay non-inlined (Inductor writes each helper under a plain
  ``@triton.jit``) and register caps stay caps (Inductor drops a ``Config``'s ``maxnreg``).

Eager calls are untouched; ``torch.export`` keeps the ops as they are (AOTInductor
rewrites them when it compiles the exported program).
"""
from . import kernel_source, layout, offset_views, write_read  # noqa: F401  (registration on import)

kernel_source.install()
