"""The entry-point groups through which core and third parties register components.

DESIGN.md section 3 pins each group's value shape; it is repeated here, next to the name,
because this is where a plugin author looks it up.
"""

PLATFORMS = "core.platforms"
"""Zero-argument probe -> dotted path of a Platform subclass, or None / raise Unavailable."""

ATTENTION_BACKENDS = "core.attention_backends"
"""The AttentionBackend class."""

SAMPLERS = "core.samplers"
"""The Sampler class."""

QUANTIZATION = "core.quantization"
"""The QuantizationConfig class."""

MODELS = "core.models"
"""The model class, named for the HF architecture it implements."""

KV_CONNECTORS = "core.kv_connectors"
"""The KVConnector class."""

KV_CACHE_SPECS = "core.kv_cache_specs"
"""A `register(registry)` callable that registers spec classes and their managers."""

GENERAL = "core.general"
"""A zero-argument, re-entrant callable run once in every process."""

ENDPOINTS = "core.endpoints"
"""A zero-argument callable returning a FastAPI APIRouter; denied unless allowlisted."""

HOOKS = "core.hooks"
"""A module holding pluggy `@hookimpl` functions for the specs in core.plugins.hookspecs."""

SPEC_PROPOSERS = "core.spec_proposers"
"""The Proposer class of a speculative-decoding method (`ngram`, `draft_model`...)."""

TOOL_PARSERS = "core.tool_parsers"
"""The ToolParser class that extracts tool calls from generated text (`hermes`...)."""

REASONING_PARSERS = "core.reasoning_parsers"
"""The ReasoningParser class that tells a model's reasoning from its answer (`deepseek_r1`...)."""

LORA = "core.lora"
"""The LoRAManager class (core.lora.interface) that serves `--enable-lora` ("default":
the `core-lora` plugin's)."""

IO_PROCESSORS = "core.io_processors"
"""The IOProcessor class (core.io_processors.interface) named by `--io-processor-plugin` or
the checkpoint's config.json `io_processor_plugin`; loaded in the frontend process only."""

LOGITS_PROCESSORS = "core.logits_processors"
"""A LogitsProcessor class (core.sample.logits_processor); every one installed runs in every
engine that samples, its per-request arguments in SamplingParams.extra_args."""

STAT_LOGGERS = "core.stat_loggers"
"""A StatLoggerBase class (core.engine.stat_logger), or a `(config, engine_index)` factory of
one; every one installed gets the stats of every engine, in the frontend process."""

NOUNS: dict[str, str] = {
    PLATFORMS: "platform",
    ATTENTION_BACKENDS: "attention backend",
    SAMPLERS: "sampler",
    QUANTIZATION: "quantization method",
    MODELS: "model architecture",
    KV_CONNECTORS: "KV connector",
    KV_CACHE_SPECS: "KV-cache spec plugin",
    GENERAL: "general plugin",
    ENDPOINTS: "endpoint plugin",
    HOOKS: "hooks module",
    SPEC_PROPOSERS: "speculative proposer",
    TOOL_PARSERS: "tool parser",
    REASONING_PARSERS: "reasoning parser",
    LORA: "LoRA implementation",
    IO_PROCESSORS: "IO processor",
    LOGITS_PROCESSORS: "logits processor",
    STAT_LOGGERS: "stat logger",
}
"""What one entry of each group is called in messages ("sampler 'x' is not installed")."""

ALL_GROUPS = tuple(NOUNS)
