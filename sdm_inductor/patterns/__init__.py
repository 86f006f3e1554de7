"""Pattern rewrites: reference token-loop code -> the fused sdm op.

On by import: the torch-level pass (Dynamo graph, before AOTAutograd) and the aten-level
pass (post-grad graphs) are installed into Inductor's config, next to any passes already
there. Switches: ``disable_rewrites()`` / ``enable_rewrites()`` / ``with rewrites(False):``;
``rewrites(True, assume_distinct_write_slots=True)`` takes the user's word that no token
writes a slot twice. ``explain(fn, *args)`` reports what is rewritten and why not;
``rewrite_exported(ep)`` rewrites an ExportedProgram; the ``sdm`` torch._logging artifact
logs the decisions while compiling: ``torch._logging.set_logs(modules={"sdm": True})``, or
``TORCH_LOGS="sdm"`` (torch parses that variable at its import, before this package
registers the artifact, so the environment form needs the ``torch.backends`` entry point
``sdm_logs = "sdm_inductor_logging:register"`` in the package metadata).

What is recognised (one canonical token step, docs/spec.md section 1, checked in a symbolic
normal form, so spellings do not matter): chains of steps whose bank flows from each step
into the next, unrolled Python loops or ``scan``, one stream or B streams per step (a
``[B, S, hd]`` bank indexed per batch, a ``[B, H, S, hd]`` bank indexed per batch and
head, slots shared by every stream, or a flat bank with per-stream rows), reads and
writes by indexing / index_select / gather / index_put / setitem / index_copy / scatter /
index_add / scatter_add, contractions by mul+sum / matmul / bmm / einsum / outer, gates
per token, per write or absent, beta absent, one write or read slot per token (W = 1,
R = 1, rows squeezed or not), per-token inputs computed in the loop (hoisted; in a
``scan`` body by ``vmap`` of that part of the body over ``xs``). Anything else is left as
written, with the reason in ``explain``'s report.
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
