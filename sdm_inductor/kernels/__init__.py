"""Chunked Triton kernels for the sdm ops (CUDA; also run under TRITON_INTERPRET=1).

Importing this package registers, when Triton is importable (no GPU needed to import):

- ``sdm_inductor.ops.IMPLS['cuda'] = host`` (the eager ops' CUDA implementation);
- the ``triton_op``s ``sdm::triton_write_read``, ``sdm::triton_write_read_gated``,
  ``sdm::triton_write_read_`` and ``sdm::triton_write_read_backward`` that the lowerings
  put into Inductor's code.

Layout, in the order a call runs:

- ``host``: dispatch (path, walk, token windows, buffers; the IMPLS interface);
  ``config``: ``CONFIG``, launch parameters and the few switches;
- ``index_ranges``: the eager call's index range check in one launch;
- ``phase1/``: what needs no bank (``plan``): ``entries`` (dense and sort keys),
  ``groups`` (groups and write runs), ``pairs`` (decays, Gram matrices), ``solve`` (the
  chunks' triangular inverses), ``headers`` (the backward's dB groups), ``layout``;
- ``forward/``: ``step_walk`` (launches per chunk: eager calls), ``queue_walk`` (its
  items in one launch: traced calls), ``column_walk`` (one launch, small shapes),
  ``decode`` (short sequences), ``quantize`` (the undo log's packing);
- ``backward/``: ``dispatch``, ``step_walk`` (eager), ``queue_walk`` (traced),
  ``reverse_walk`` (small shapes; traced calls' fp8 / int4 undo logs),
  ``sources`` (chunk-start rows from the final bank and the log), ``phase1_grads``;
- ``runtime/``: ``launch`` (traceable launches, ``Relaunch``, the walk rule), ``graphs``
  (CUDA-graph replay of repeated eager walks and no-grad Phase 1s), ``pipeline``
  (side-stream Phase 1);
- ``common/tiles``: the Triton helpers several stages inline;
- ``triton_ops``: the ``triton_op`` definitions.
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
