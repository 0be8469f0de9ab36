"""What one configuration rule is (core.config_rules holds them all): the Rule record,
the facts a rule reads beside the config, and the features rules are about.

A feature is a flag or flag value (`--enable-lora`, `--runner pooling`); `enabled` says
whether a config asks for it, `compile_flag` which setting asked for compilation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from core.config import CompilationConfig, CUDAGraphMode, EngineConfig
from core.pooling.runner import CheckpointPooling

__all__ = [
    "ASYNC_SCHEDULING", "COMPILED", "LORA", "PIPELINE", "POOLING", "SLEEP_MODE", "SPECULATIVE",
    "Check", "ConfigFacts", "Rule", "compile_flag", "compiles", "enabled",
]  # fmt: skip


@dataclass(frozen=True)
class ConfigFacts:
    """What the rules read beside the config: the flags the user gave ({flag: its config
    section}, in EngineArgs order) and what the checkpoint says (None where no model is
    known): its context length, its decoder layers, its pooling."""

    given: Mapping[str, str] = field(default_factory=dict)
    model_max_len: int | None = None
    num_layers: int | None = None
    pooling: CheckpointPooling | None = None


Check = Callable[[EngineConfig, ConfigFacts], "str | None"]


@dataclass(frozen=True)
class Rule:
    """One compatibility rule.

    `features` are the flags (or flag values) it involves: the compatibility table's axes.
    `refuses` says what in words, `remedy` what the user can do instead. `check` returns
    the refusal's message, naming the flags, or None; it changes nothing. `yields`, where a
    side can be a default, makes that default give way before `check` runs and returns
    what it did (for the log) or None; `default` says so for the docs ("": every side of
    the conflict is an explicit choice, or a default that derives from the other side).
    """

    name: str
    features: tuple[str, ...]
    refuses: str
    remedy: str
    check: Check
    yields: Check | None = None
    default: str = ""


LORA = "--enable-lora"
SPECULATIVE = "--speculative-config"
PIPELINE = "--pipeline-parallel-size > 1"
POOLING = "--runner pooling"
COMPILED = "-O1 / -O2 (compile, capture graphs)"
EXPERTS_ACROSS_ENGINES = "--enable-expert-parallel with --data-parallel-size > 1"
KV_TRANSFER = "--kv-transfer-config"
MULTIMODAL = "a multimodal model (images in)"
ASYNC_SCHEDULING = "--async-scheduling"
SLEEP_MODE = "--enable-sleep-mode"
BATCH_INVARIANT = "--batch-invariant"

_ENABLED: dict[str, Callable[[EngineConfig], bool]] = {
    LORA: lambda config: config.lora is not None,
    SPECULATIVE: lambda config: config.speculative is not None,
    PIPELINE: lambda config: config.parallel.pipeline_parallel_size > 1,
    POOLING: lambda config: config.model.runner == "pooling",
    EXPERTS_ACROSS_ENGINES: lambda config: config.parallel.experts_span_engines,
    KV_TRANSFER: lambda config: config.kv_transfer.kv_connector is not None,
    MULTIMODAL: lambda config: config.model.multimodal,
    ASYNC_SCHEDULING: lambda config: config.scheduler.async_scheduling,
    SLEEP_MODE: lambda config: config.model.enable_sleep_mode,
    BATCH_INVARIANT: lambda config: config.model.batch_invariant,
}


_ASKED_BY = {
    "compile_model": ("compile_model", "level"),
    "capture_graphs": ("capture_graphs", "cudagraph_mode", "level"),
}


def enabled(feature: str, config: EngineConfig) -> bool:
    """Whether `config` asks for `feature` (one of the labels above)."""
    return _ENABLED[feature](config)


def compiles(compilation: CompilationConfig) -> bool:
    return bool(compilation.compile_model or compilation.capture_graphs)


def compile_flag(compilation: CompilationConfig) -> str | None:
    """The setting that asked for the compilation or capture that is on, as the user
    spells it, or None when only a default (the platform's -O level) turned it on."""
    for key, sources in _ASKED_BY.items():
        if not getattr(compilation, key):
            continue
        for source in sources:
            if source == "level" and compilation.is_user_set("level"):
                return f"-O{compilation.level}"
            value = getattr(compilation, source)
            # cudagraph_mode NONE asks for no graphs.
            if compilation.is_user_set(source) and value is not CUDAGraphMode.NONE:
                return f"compilation_config.{source} {getattr(value, 'value', value)}"
    return None
