"""Backward of the chunked form: ``dispatch.backward`` picks the reverse walk (``step_walk``
when eager, ``reverse_walk`` when traced), whose chunk-start rows come from ``sources`` or
a restored working bank, then ``phase1_grads``."""
from .dispatch import backward

__all__ = ["backward"]
