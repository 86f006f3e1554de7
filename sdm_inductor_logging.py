"""Registers the ``sdm`` torch._logging artifact while torch imports.

torch calls the ``torch.backends`` entry points before it parses ``TORCH_LOGS`` (torch
2.13: "so backends can register their log names before TORCH_LOGS is parsed"), so
``TORCH_LOGS="sdm"`` is accepted. This module is deliberately tiny and separate from
``sdm_inductor``: importing the package itself while torch is still importing would
be too early. It never raises (a failure here would break ``import torch``).
"""


def register() -> None:
    try:
        from torch._logging import _internal

        if "sdm" not in _internal.log_registry.artifact_names:
            _internal.register_artifact(
                "sdm", "sdm_inductor pattern rewrites: each token loop rewritten or left alone, "
                "and why", visible=True)
        if not _internal.log_registry.is_log("sdm_inductor"):
            _internal.register_log("sdm_inductor", "sdm_inductor")
    except Exception:  # noqa: BLE001 - never break torch's import
        pass
