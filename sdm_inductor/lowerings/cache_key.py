"""What Inductor's caches must key on besides a graph of the sdm ops: this package's sources
(a cached graph holds the ops' fake shapes and the lowerings' output: a changed saved-tensor
layout replayed a stale graph's size asserts) and ``EMIT_KERNELS`` (whether the graph
launches the kernels or calls the eager op). The always-installed post-grad pass
(``offset_views.RestoreViewClones``) and the rewrite passes put it in their ``uuid``, which
the FX graph and AOTAutograd caches' keys hash: with the rewrites on or off, a changed
package or setting compiles afresh.
"""
from __future__ import annotations

import glob
import hashlib
import os

from torch._inductor import custom_graph_pass as cgp

__all__ = ["lowering_state"]

_SOURCES = tuple(sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                               "**", "*.py"), recursive=True)))


def lowering_state() -> str:
    """A digest of the package's sources and the lowerings' ``EMIT_KERNELS``."""
    from . import write_read as lowering
    h = hashlib.sha256(cgp.get_hash_for_files(_SOURCES))
    h.update(repr(lowering.EMIT_KERNELS).encode())
    return h.hexdigest()
