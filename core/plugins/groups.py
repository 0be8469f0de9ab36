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

ALL_GROUPS = (
    PLATFORMS,
    ATTENTION_BACKENDS,
    SAMPLERS,
    QUANTIZATION,
    MODELS,
    KV_CONNECTORS,
    KV_CACHE_SPECS,
    GENERAL,
    ENDPOINTS,
    HOOKS,
)
