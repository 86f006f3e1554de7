"""Switches of the pattern rewrites (part of the passes' uuid, so the FX graph cache
never serves a graph compiled under other settings)."""
from __future__ import annotations

# The last enable_rewrites / disable_rewrites (set it through those: assigning it installs
# or removes nothing; it is part of the passes' uuid through ``snapshot``).
enabled: bool = True

# The user's word that no token writes one slot twice (docs/spec.md section 1). When False,
# loops whose write slots are not proven distinct from the graph get a runtime check
# that raises naming the loop; when True, they are rewritten without it.
assume_distinct_write_slots: bool = False

# Chunk size of the fused op the loops are rewritten into.
chunk_size: int = 64

# Streams run one after the other (``for p: for t:`` over ``x[p, t]``, like the naive loop
# of sdm_inductor.nn) become P parallel streams of the op instead of one stream of P*T
# tokens. Exact when no row written by one stream is touched by another, which the op
# checks at run time -- and refuses otherwise, where the loop would have run. Off by
# default for that reason: the rewrites never change what a program does.
split_sequential_streams: bool = False


def snapshot() -> tuple:
    return (enabled, assume_distinct_write_slots, chunk_size, split_sequential_streams)
