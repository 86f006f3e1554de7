"""What the stages share: Triton helpers (``tiles``) and the queue walks' counts
(``counts``)."""
