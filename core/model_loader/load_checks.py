"""What the user's load options ask of the checkpoint found: --load-format and
--trust-remote-code, checked once in the frontend as soon as the checkpoint is found,
before its architecture is looked up and before any engine process starts.

Core reads safetensors directories and GGUF files, and builds every model from its own
classes (the `core.models` group): it never imports code shipped with a checkpoint.
vLLM users pass --trust-remote-code out of habit, so the flag is accepted, and the log says
what it did; a checkpoint whose architecture exists only as remote code (config.json
`auto_map`) is refused, naming that class, whether or not the flag was given.
"""

from __future__ import annotations

import logging

from core.model_loader.checkpoint import Checkpoint
from core.model_loader.gguf_loader import GGUFCheckpoint
from core.model_loader.safetensors_loader import SafetensorsCheckpoint
from core.models.registry import resolve_model_class
from core.plugins.registry import PluginRegistry

__all__ = ["check_load_options"]

logger = logging.getLogger(__name__)

_FORMATS = {"safetensors": SafetensorsCheckpoint, "gguf": GGUFCheckpoint}


def check_load_options(
    checkpoint: Checkpoint,
    load_format: str | None,
    trust_remote_code: bool,
    registry: PluginRegistry | None = None,
) -> None:
    """ValueError naming --load-format when the checkpoint is in another format, or naming
    the remote-code class when its architecture is not one core serves. `load_format`
    None or "auto" takes either format (a name core does not read is EngineArgs' error)."""
    _check_load_format(checkpoint, load_format)
    _check_remote_code(checkpoint, trust_remote_code, registry)


def _check_load_format(checkpoint: Checkpoint, load_format: str | None) -> None:
    expected = _FORMATS.get(load_format or "auto")
    if expected is None or isinstance(checkpoint, expected):
        return
    found = next(name for name, cls in _FORMATS.items() if isinstance(checkpoint, cls))
    raise ValueError(f"--load-format {load_format}: {checkpoint.path} is a {found} checkpoint")


def _check_remote_code(
    checkpoint: Checkpoint, trust_remote_code: bool, registry: PluginRegistry | None
) -> None:
    auto_map = checkpoint.hf_config.get("auto_map") or {}
    architectures = checkpoint.hf_config.get("architectures") or []
    if not auto_map:
        if trust_remote_code:
            logger.info(
                "--trust-remote-code: %s has no auto_map (no remote code): nothing to trust",
                checkpoint.path,
            )
        return
    try:
        resolve_model_class(architectures, registry)
    except ValueError as exc:
        classes = ", ".join(f"{auto} -> {ref}" for auto, ref in auto_map.items())
        raise ValueError(
            f"model {checkpoint.path}: architecture {architectures} is implemented by code "
            f"shipped with the checkpoint ({classes}), which core never runs, with or without "
            f"--trust-remote-code ({exc})"
        ) from exc
    if trust_remote_code:
        logger.info(
            "--trust-remote-code: core serves %s with its own implementation; the "
            "checkpoint's auto_map code is not run",
            architectures,
        )
