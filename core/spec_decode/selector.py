"""Choosing the proposer of `--speculative-config` and checking the method's own options."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from core.config import SpeculativeConfig
from core.plugins.groups import SPEC_PROPOSERS
from core.plugins.registry import PluginLookupError, PluginRegistry, get_registry
from core.spec_decode.interface import Proposer

__all__ = ["check_speculative_config", "proposer_class", "validate_options"]

PROVIDER = "core-spec-decode"
"""The distribution that provides core's speculative-decoding methods."""


def proposer_class(config: SpeculativeConfig, registry: PluginRegistry | None = None) -> type:
    """The Proposer class of `config.method`; ValueError naming the field and, when the
    method is not installed, the package that provides core's methods."""
    registry = registry or get_registry()
    try:
        return registry.require(SPEC_PROPOSERS, config.method, Proposer)
    except PluginLookupError as exc:
        hint = ""
        if exc.reason == "not installed":
            hint = f" (core's methods ngram, draft_model and layer_skip: pip install {PROVIDER})"
        raise ValueError(f"speculative_config.method: {exc}{hint}") from exc


def validate_options(cls: type[Proposer], config: SpeculativeConfig) -> BaseModel:
    """`config.options` checked by the method's options model; ValueError naming the key."""
    try:
        return cls.options_model.model_validate(config.options)
    except ValidationError as exc:
        problems = "; ".join(
            f"speculative_config.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"{problems} (method {config.method!r})") from None


def check_speculative_config(
    config: SpeculativeConfig, registry: PluginRegistry | None = None
) -> type[Proposer]:
    """The config's Proposer class, once its method and options are known to be valid."""
    cls = proposer_class(config, registry)
    validate_options(cls, config)
    return cls
