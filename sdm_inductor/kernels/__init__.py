"""Chunked Triton kernels for the sdm ops (CUDA; also run under TRITON_INTERPRET=1).

Importing this package registers, when Triton is importable (no GPU needed to import):

- ``sdm_inductor.ops.IMPLS['cuda'] = host`` (the eager ops' CUDA implementation);
- the ``triton_op``s ``sdm::triton_write_read``, ``sdm::triton_write_read_gated``,
  ``sdm::triton_write_read_`` and ``sdm::triton_write_read_backward`` that the lowerings
  put into Inductor's code.

Modules: ``phase1`` (dense keys, groups of equal slots, decays, Gram matrices, solve),
``step`` / ``step_backward`` (the walks over the chunks as launches per chunk: eager
calls), ``phase2`` (the forward walk in one launch: traced calls), ``walk`` (the grid
walk, opt-in), ``decode`` (short sequences), ``backward`` (the reverse column walk and
Phase 1 backwards), ``solve`` (the chunks' triangular inverses), ``pipeline`` (Phase 1
of token windows on a side stream), ``plan_graph`` (Phase 1 replayed from CUDA graphs,
opt-in), ``quantize`` (the undo log's packing), ``launch`` (traceable launches,
``Relaunch``), ``host`` (buffers, launch parameters, the IMPLS interface), ``triton_ops``.
"""
try:
    import triton  # noqa: F401
except ImportError:  # no Triton: the CPU path only
    AVAILABLE = False
else:
    AVAILABLE = True
    from .. import ops as _ops
    from . import host, triton_ops  # noqa: F401

    _ops.IMPLS["cuda"] = host
