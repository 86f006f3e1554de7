"""Phase 2 forward: the step walk (``step_walk``: launches per chunk, eager calls), the
column walk (``column_walk``: one launch for all chunks, traced calls), the token loop of
short sequences (``decode``), and the undo log's packing (``quantize``)."""
