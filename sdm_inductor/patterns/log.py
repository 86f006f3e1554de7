"""The ``sdm`` torch._logging artifact: ``TORCH_LOGS="sdm"`` prints rewrite decisions."""
from __future__ import annotations

import logging

import torch._logging
from torch._logging import _internal

NAME = "sdm"
DESCRIPTION = "sdm_inductor pattern rewrites: each token loop rewritten or left alone, and why"


def register() -> None:
    """Register the artifact (idempotent): what the ``torch.backends`` autoload hook
    (``sdm_inductor_logging.register``) does while torch imports, so that ``TORCH_LOGS=sdm``
    is accepted when torch parses it."""
    if NAME not in _internal.log_registry.artifact_names:
        _internal.register_artifact(NAME, DESCRIPTION, visible=True)
    if not _internal.log_registry.is_log("sdm_inductor"):
        # our loggers get torch's handler and format (TORCH_LOGS="sdm_inductor" works too)
        _internal.register_log("sdm_inductor", "sdm_inductor")


register()
log = torch._logging.getArtifactLogger("sdm_inductor.patterns", NAME)


def refresh_from_env() -> None:
    """Re-read TORCH_LOGS now that the artifact exists (it may name ``sdm``)."""
    import os
    settings = os.environ.get("TORCH_LOGS", "")
    if NAME in [s.strip().lstrip("+-") for s in settings.split(",")]:
        _internal._init_logs()


def emit(report) -> None:
    if log.isEnabledFor(logging.DEBUG):
        for line in str(report).splitlines():
            log.debug("%s", line)
