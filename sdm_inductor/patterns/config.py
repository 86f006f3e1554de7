"""Switches of the pattern rewrites (part of the passes' uuid, so the FX graph cache
never serves a graph compiled under other settings)."""
from __future__ import annotations

# Rewrite token loops under torch.compile (the passes are installed while this is True).
enabled: bool = True

# The user's word that no token writes one slot twice (SDM_SPEC section 1). When False,
# loops whose write slots are not proven distinct from the graph get a runtime check
# that raises naming the loop; when True, they are rewritten without it.
assume_distinct_write_slots: bool = False

# Chunk size of the fused op the loops are rewritten into.
chunk_size: int = 64


def snapshot() -> tuple:
    return (enabled, assume_distinct_write_slots, chunk_size)
