"""Pattern rewrites: reference token-loop code -> the fused sdm op (issue 5).

On by import: the torch-level pass (Dynamo graph, before AOTAutograd) and the aten-level
pass (post-grad graphs) are installed into Inductor's config, next to any passes already
there. Switches: ``disable_rewrites()`` / ``enable_rewrites()`` / ``with rewrites(False):``;
``rewrites(True, assume_distinct_write_slots=True)`` takes the user's word that no token
writes a slot twice. ``explain(fn, *args)`` reports what is rewritten and why not;
``rewrite_exported(ep)`` rewrites an ExportedProgram; ``TORCH_LOGS="sdm"`` (or
``torch._logging.set_logs(sdm=True)``) logs the decisions while compiling.
"""
from . import checks, log  # noqa: F401  (registers sdm::check_distinct_write_slots, the log artifact)
from . import config
from .aten_frontend import rewrite_exported
from .backend import sdm_backend
from .checks import RepeatedWriteSlotError
from .explain import explain
from .passes import (AtenLevelPass, TorchLevelPass, disable_rewrites, enable_rewrites, install,
                     last_report, rewrites, uninstall)
from .report import Report

__all__ = ["enable_rewrites", "disable_rewrites", "rewrites", "explain", "rewrite_exported",
           "sdm_backend", "last_report", "Report", "RepeatedWriteSlotError", "config",
           "TorchLevelPass", "AtenLevelPass", "install", "uninstall"]

log.refresh_from_env()
install()
