"""Phase 2 forward: the step walk (``step_walk``: launches per chunk, eager calls), the
queue walk (``queue_walk``: the step walk's items in one launch, traced calls), the column
walk (``column_walk``: one launch, a program per column block; small shapes), the token
loop of short sequences (``decode``), and the undo log's packing (``quantize``)."""
