"""Choosing the attention backend: the platform's preference list, filtered by capability."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from core.attention.interface import AttentionBackend, AttentionRequirements
from core.platforms.interface import Platform
from core.plugins.groups import ATTENTION_BACKENDS
from core.plugins.registry import PluginLookupError, PluginRegistry, get_registry

logger = logging.getLogger(__name__)


@dataclass
class BackendChoice:
    name: str
    backend: type[AttentionBackend]
    rejected: dict[str, str] = field(default_factory=dict)


def select_attention_backend(
    platform: Platform,
    req: AttentionRequirements,
    forced: str | None = None,
    registry: PluginRegistry | None = None,
) -> BackendChoice:
    """The first backend of the platform's preferences (or `forced`) that can serve `req`;
    for multi-head latent attention (`req.use_mla`), a candidate's `mla_backend` in its place.

    Raises ValueError listing every candidate and why it was rejected when none can; a
    forced backend that cannot be had raises the registry's PluginLookupError, which lists
    the installed backends.
    """
    registry = registry or get_registry()
    candidates = (forced,) if forced else platform.preferred_attention_backends
    rejected: dict[str, str] = {}
    for name in candidates:
        try:
            backend = registry.require(ATTENTION_BACKENDS, name, AttentionBackend)
        except PluginLookupError as exc:
            if forced:
                raise
            rejected[name] = exc.reason
            continue
        if req.use_mla and backend.mla_backend is not None:
            backend = backend.mla_backend  # the family's own backend for MLA layers
        reason = backend.supports_combination(req)
        if reason is None:
            for other, why in rejected.items():
                logger.info("attention backend %s rejected: %s", other, why)
            serving = "" if backend.name == name else f" (its {backend.name})"
            logger.info("attention backend %s selected%s", name, serving)
            return BackendChoice(name, backend, rejected)
        rejected[name] = reason
    details = "; ".join(f"{n}: {why}" for n, why in rejected.items()) or "no candidates"
    which = f"attention backend {forced!r} cannot serve" if forced else "no attention backend for"
    raise ValueError(f"{which} {req}: {details}")
