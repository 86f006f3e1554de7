"""Inductor ``CustomGraphPass``es that run the rewrites, and their installation.

Two passes: the torch-level one on Dynamo's graph (``pre_grad_custom_pass``, before
AOTAutograd: compile time is won there) and the aten-level one on post-grad graphs
(``post_grad_custom_pre_pass``, for what reaches Inductor unrewritten). Their uuids hash
the settings in ``config`` and ``lowerings.cache_key.lowering_state`` (this package's
sources and the lowerings' ``EMIT_KERNELS``), so the FX graph cache keys change whenever
what the passes would do changes. Installing keeps passes already set
by the user or other libraries: ours are appended (a list where Inductor takes one, a
composed pass on torch versions that take a single callable).
"""
from __future__ import annotations

import contextlib
import hashlib

from torch._inductor.custom_graph_pass import CustomGraphPass

from .. import inductor_slots
from ..lowerings.cache_key import lowering_state
from . import config
from .log import emit
from .report import Report

__all__ = ["TorchLevelPass", "AtenLevelPass", "install", "uninstall", "installed",
           "enable_rewrites", "disable_rewrites", "rewrites", "last_report"]

class _State:
    last = Report()


def last_report() -> Report:
    """The report of the most recent graph a pass recorded (each recorded graph replaces
    the one before)."""
    return _State.last


def _record(report: Report):
    _State.last = report
    emit(report)


class _SdmPass(CustomGraphPass):
    LEVEL = ""

    def uuid(self):
        h = hashlib.sha256(lowering_state().encode())
        h.update(repr((self.LEVEL, config.snapshot())).encode())
        return h.hexdigest()

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))


class TorchLevelPass(_SdmPass):
    """Pre-grad: token loops in Dynamo's torch-level graph -> the fused op."""
    LEVEL = "torch"

    def __call__(self, graph):
        from .torch_frontend import rewrite_dynamo_graph
        _record(rewrite_dynamo_graph(graph))


class AtenLevelPass(_SdmPass):
    """Post-grad: token loops left in an aten graph -> the fused op."""
    LEVEL = "aten"

    def __call__(self, graph):
        from .aten_frontend import rewrite_aten_graph
        report = rewrite_aten_graph(graph)
        if report.rewritten or report.rejected:
            _record(report)


_PASSES = {"pre_grad_custom_pass": TorchLevelPass(), "post_grad_custom_pre_pass": AtenLevelPass()}


def installed() -> bool:
    return all(inductor_slots.has(slot, p) for slot, p in _PASSES.items())


def install() -> None:
    """Add the passes to Inductor's config, after any passes already there."""
    for slot, ours in _PASSES.items():
        inductor_slots.add(slot, ours)


def uninstall() -> None:
    """Remove only our passes, leaving the others as they were."""
    for slot, ours in _PASSES.items():
        inductor_slots.remove(slot, ours)


def enable_rewrites(assume_distinct_write_slots: bool | None = None) -> None:
    """Turn the rewrites on (the default after ``import sdm_inductor``)."""
    config.enabled = True
    if assume_distinct_write_slots is not None:
        config.assume_distinct_write_slots = bool(assume_distinct_write_slots)
    install()


def disable_rewrites() -> None:
    """Turn the rewrites off: ``torch.compile`` compiles token loops as written."""
    config.enabled = False
    uninstall()


@contextlib.contextmanager
def rewrites(enabled: bool = True, *, assume_distinct_write_slots: bool | None = None):
    """``with sdm_inductor.rewrites(False): ...`` compiles without the rewrites;
    ``rewrites(True, assume_distinct_write_slots=True)`` takes the user's word that no
    token writes a slot twice (no runtime check)."""
    saved = (config.enabled, config.assume_distinct_write_slots, installed())
    try:
        if enabled:
            enable_rewrites(assume_distinct_write_slots)
        else:
            disable_rewrites()
            if assume_distinct_write_slots is not None:
                config.assume_distinct_write_slots = bool(assume_distinct_write_slots)
        yield
    finally:
        config.enabled, config.assume_distinct_write_slots = saved[0], saved[1]
        install() if saved[2] else uninstall()
