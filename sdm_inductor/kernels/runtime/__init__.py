"""How the kernels run: traceable launches and ``Relaunch`` (``launch``), CUDA-graph replay
of repeated eager step walks (``graphs``), Phase 1 of token windows on a side stream
(``pipeline``)."""
