"""What the stages share: Triton helpers (``tiles``)."""
