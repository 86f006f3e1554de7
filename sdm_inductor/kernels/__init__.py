"""Chunked Triton kernels for the sdm ops (CUDA; also run under TRITON_INTERPRET=1).

Owned by the CUDA-kernels work (issue 3). Importing this package registers the CUDA
implementation in ``sdm_inductor.ops.IMPLS['cuda']`` when Triton is importable.
"""
