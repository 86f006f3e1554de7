"""Backward of the chunked form: ``dispatch.backward`` picks the reverse walk (``step_walk``
when eager, ``queue_walk`` when traced, ``reverse_walk`` for small shapes and traced
calls' fp8 / int4 undo logs), whose chunk-start rows come from ``sources`` or a restored
working bank, then
``phase1_grads``."""
from .dispatch import Kept, backward, raw_log

__all__ = ["Kept", "backward", "raw_log"]
