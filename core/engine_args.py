"""EngineArgs: the user's engine options, from Python keywords or CLI flags named as in vLLM.

Every option defaults to None, meaning "not given": only given options reach the config
as explicit values, so levels and platforms never override them; where a default
conflicts with one of them, the default yields (core.config_rules).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, get_args

import click
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from core import envs
from core.config import (
    LOAD_FORMATS,
    EngineConfig,
    LoRAConfig,
    PoolerConfig,
    SpeculativeConfig,
    UsageContext,
    parse_size,
)
from core.config_rule import ConfigFacts
from core.config_rules import validate, yield_defaults
from core.plugins.components import parse_json_object
from core.pooling.runner import CheckpointPooling, resolve_runner
from core.quantization.selector import (
    StoredQuantization,
    keeps_blocks,
    resolve_quantization,
)
from core.reasoning.selector import reasoning_parser_class
from core.spec_decode.selector import check_speculative_config

if TYPE_CHECKING:
    from core.platforms.interface import Platform


def _option(section: str, key: str, flag: str, help: str, **click_kwargs: Any) -> Any:
    meta = {"section": section, "key": key, "flag": flag, "help": help, "click": click_kwargs}
    return field(default=None, metadata=meta)


@dataclass
class EngineArgs:
    model: str | None = _option("model", "model", "--model", "model directory, .gguf or hub id")
    tokenizer: str | None = _option("model", "tokenizer", "--tokenizer", "tokenizer path")
    served_model_name: str | None = _option(
        "model", "served_model_name", "--served-model-name", "model id the server reports"
    )
    dtype: str | None = _option(
        "model", "dtype", "--dtype", "model dtype",
        type=click.Choice(["auto", "float32", "float16", "bfloat16"]),
    )  # fmt: skip
    max_model_len: int | None = _option(
        "model", "max_model_len", "--max-model-len", "context length", type=int
    )
    quantization: str | None = _option("model", "quantization", "--quantization", "method")
    seed: int | None = _option("model", "seed", "--seed", "random seed", type=int)
    chat_template: str | None = _option(
        "model", "chat_template", "--chat-template", "chat template file or string"
    )
    generation_config: str | None = _option(
        "model", "generation_config", "--generation-config", "'auto', 'none' or a directory"
    )
    max_logprobs: int | None = _option(
        "model", "max_logprobs", "--max-logprobs", "most logprobs a request may ask", type=int
    )
    revision: str | None = _option(
        "model", "revision", "--revision",
        "branch, tag or commit of a hub id to download (or read from the cache)",
    )  # fmt: skip
    download_dir: str | None = _option(
        "model", "download_dir", "--download-dir",
        "the Hugging Face cache that hub ids download into (default: Hugging Face's)",
    )  # fmt: skip
    load_format: str | None = _option(
        "model", "load_format", "--load-format",
        f"the weights' format: {', '.join(LOAD_FORMATS)} (refused when the model is not)",
    )  # fmt: skip
    trust_remote_code: bool | None = _option(
        "model", "trust_remote_code", "--trust-remote-code",
        "accepted for vLLM commands; core never runs a checkpoint's own code",
        is_flag=True, default=None,
    )  # fmt: skip
    runner: str | None = _option(
        "model", "runner", "--runner",
        "generate (sample tokens) or pooling (embed); default: from the checkpoint",
        type=click.Choice(["auto", "generate", "pooling"]),
    )  # fmt: skip
    pooler_config: str | dict | None = _option(
        "pooler", "", "--pooler-config",
        'pooling JSON as vLLM\'s, e.g. {"pooling_type": "MEAN", "normalize": false}',
    )  # fmt: skip
    limit_mm_per_prompt: str | dict | None = _option(
        "model", "limit_mm_per_prompt", "--limit-mm-per-prompt",
        'most multimodal items per prompt, JSON per modality, e.g. {"image": 2}',
    )  # fmt: skip
    allowed_local_media_path: str | None = _option(
        "model", "allowed_local_media_path", "--allowed-local-media-path",
        "the directory whose files file:// media URLs may read (default: none)",
    )  # fmt: skip
    io_processor_plugin: str | None = _option(
        "model", "io_processor_plugin", "--io-processor-plugin",
        "the core.io_processors plugin turning raw request data into prompts and responses",
    )  # fmt: skip
    enable_sleep_mode: bool | None = _option(
        "model", "enable_sleep_mode", "--enable-sleep-mode",
        "allow sleep (LLM.sleep, POST /sleep): free the KV cache and offload or drop the "
        "weights until woken",
        is_flag=True, default=None,
    )  # fmt: skip
    batch_invariant: bool | None = _option(
        "model", "batch_invariant", "--batch-invariant",
        "every kernel reduces in an order fixed by the model's shapes, so a request's tokens "
        "and logprobs do not depend on its batch, chunks, prefix-cache hits or speculation "
        "(slower; also CORE_BATCH_INVARIANT=1)",
        is_flag=True, default=None,
    )  # fmt: skip
    block_size: int | None = _option(
        "cache", "block_size", "--block-size", "tokens per KV block", type=int
    )
    kv_cache_memory: str | None = _option(
        "cache", "kv_cache_memory_bytes", "--kv-cache-memory", "KV budget, e.g. 4GiB (bare: GiB)"
    )
    kv_cache_memory_bytes: int | str | None = _option(
        "cache", "kv_cache_memory_bytes", "--kv-cache-memory-bytes",
        "KV budget in bytes, as vLLM's flag (or with a unit, e.g. 4GiB); --kv-cache-memory's field",
    )  # fmt: skip
    gpu_memory_utilization: float | None = _option(
        "cache", "gpu_memory_utilization", "--gpu-memory-utilization",
        "share of device memory for weights, activations and KV cache (GPUs)",
        type=float,
    )  # fmt: skip
    enable_prefix_caching: bool | None = _option(
        "cache", "enable_prefix_caching", "--enable-prefix-caching/--no-enable-prefix-caching",
        "automatic prefix caching", default=None,
    )  # fmt: skip
    prefix_caching_hash_algo: str | None = _option(
        "cache", "prefix_caching_hash_algo", "--prefix-caching-hash-algo", "block hash",
        type=click.Choice(["sha256", "fast"]),
    )  # fmt: skip
    kv_cache_dtype: str | None = _option(
        "cache", "kv_cache_dtype", "--kv-cache-dtype",
        "what the KV cache stores: auto (the model's dtype), fp8 (= fp8_e4m3) or fp8_e5m2",
        type=click.Choice(["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]),
    )  # fmt: skip
    max_num_seqs: int | None = _option(
        "scheduler", "max_num_seqs", "--max-num-seqs", "most running requests", type=int
    )
    max_num_batched_tokens: int | None = _option(
        "scheduler", "max_num_batched_tokens", "--max-num-batched-tokens", "token budget",
        type=int,
    )  # fmt: skip
    burst_token_budget: int | None = _option(
        "scheduler", "burst_token_budget", "--burst-token-budget",
        "most tokens a step may take; set, steps are sized from measured step times", type=int,
    )  # fmt: skip
    long_prefill_token_threshold: int | None = _option(
        "scheduler", "long_prefill_token_threshold", "--long-prefill-token-threshold",
        "chunk prompts longer than this", type=int,
    )  # fmt: skip
    enable_chunked_prefill: bool | None = _option(
        "scheduler", "enable_chunked_prefill",
        "--enable-chunked-prefill/--no-enable-chunked-prefill", "chunked prefill", default=None,
    )  # fmt: skip
    max_num_encoder_input_tokens: int | None = _option(
        "scheduler", "max_num_encoder_input_tokens", "--max-num-encoder-input-tokens",
        "multimodal encoder embeddings one step may compute (default: the token budget)",
        type=int,
    )  # fmt: skip
    encoder_cache_size: int | None = _option(
        "scheduler", "encoder_cache_size", "--encoder-cache-size",
        "encoder embeddings the encoder cache holds (default: the encoder budget)", type=int,
    )  # fmt: skip
    async_scheduling: bool | None = _option(
        "scheduler", "async_scheduling", "--async-scheduling/--no-async-scheduling",
        "schedule each step while the previous one runs", default=None,
    )  # fmt: skip
    scheduling_policy: str | None = _option(
        "scheduler", "policy", "--scheduling-policy", "victim and admission order",
        type=click.Choice(["fcfs", "priority"]),
    )  # fmt: skip
    tensor_parallel_size: int | None = _option(
        "parallel", "tensor_parallel_size", "--tensor-parallel-size", "TP ranks", type=int
    )
    pipeline_parallel_size: int | None = _option(
        "parallel", "pipeline_parallel_size", "--pipeline-parallel-size", "PP ranks", type=int
    )
    data_parallel_size: int | None = _option(
        "parallel", "data_parallel_size", "--data-parallel-size",
        "engine cores behind one server, each with its own TP x PP ranks", type=int,
    )  # fmt: skip
    data_parallel_size_local: int | None = _option(
        "parallel", "data_parallel_size_local", "--data-parallel-size-local",
        "engine cores on this node (default: all)", type=int,
    )  # fmt: skip
    data_parallel_start_rank: int | None = _option(
        "parallel", "data_parallel_start_rank", "--data-parallel-start-rank",
        "the first data-parallel rank on this node (a headless node's)", type=int,
    )  # fmt: skip
    data_parallel_address: str | None = _option(
        "parallel", "data_parallel_address", "--data-parallel-address",
        "the primary node's address, which remote engine cores connect to",
    )  # fmt: skip
    data_parallel_rpc_port: int | None = _option(
        "parallel", "data_parallel_rpc_port", "--data-parallel-rpc-port",
        "first TCP port of the remote engine cores (two each)", type=int,
    )  # fmt: skip
    enable_expert_parallel: bool | None = _option(
        "parallel", "enable_expert_parallel", "--enable-expert-parallel",
        "mixtures of experts: each tensor-parallel rank holds a share of the experts whole",
        is_flag=True, default=None,
    )  # fmt: skip
    enable_eplb: bool | None = _option(
        "parallel", "enable_eplb", "--enable-eplb",
        "rearrange and replicate experts across ranks by their measured load (needs "
        "--enable-expert-parallel)",
        is_flag=True, default=None,
    )  # fmt: skip
    eplb_config: str | dict | None = _option(
        "parallel", "eplb", "--eplb-config",
        "EPLB JSON: window_size, step_interval, num_redundant_experts, log_balancedness",
    )  # fmt: skip
    distributed_executor_backend: str | None = _option(
        "parallel", "distributed_executor_backend", "--distributed-executor-backend",
        "executor: uni (one worker, in the engine core) or mp (a process per rank); "
        "default: uni for one rank, mp for more",
        type=click.Choice(["uni", "mp", "ray"]),
    )  # fmt: skip
    device: str | None = _option("device", "device", "--device", "platform entry name")
    optimization_level: int | None = _option(
        "compilation", "level", "-O", "optimization level 0-3 (default: the platform's)",
        type=click.IntRange(0, 3),
    )  # fmt: skip
    compilation_config: int | str | dict | None = _option(
        "compilation", "", "--compilation-config",
        'compilation JSON as vLLM\'s (e.g. {"cudagraph_capture_sizes": [1, 2, 4]}) or a level',
    )  # fmt: skip
    enforce_eager: bool | None = _option(
        "compilation", "enforce_eager", "--enforce-eager", "never compile or capture graphs",
        is_flag=True, default=None,
    )  # fmt: skip
    attention_backend: str | None = _option(
        "components", "attention_backend", "--attention-backend", "force this backend"
    )
    attention_backend_config: str | dict | None = _option(
        "components", "attention_backend_config", "--attention-backend-config", "JSON kwargs"
    )
    sampler: str | None = _option("components", "sampler", "--sampler", "force this sampler")
    sampler_config: str | dict | None = _option(
        "components", "sampler_config", "--sampler-config", "JSON kwargs"
    )
    logits_processors: list[str | type] | None = _option(
        "components", "logits_processors", "--logits-processors",
        "LogitsProcessor classes (module.path:Class or module.path.Class) run besides the "
        "core.logits_processors plugins; several after one flag, or the flag repeated",
        multiple=True, metavar="CLASS...",
    )  # fmt: skip
    kv_transfer_config: str | dict | None = _option(
        "kv_transfer",
        "",
        "--kv-transfer-config",
        "KV connector JSON: kv_connector, kv_role, kv_connector_extra_config",
    )
    speculative_config: str | dict | None = _option(
        "speculative", "", "--speculative-config",
        'speculative decoding JSON, e.g. {"method": "ngram", "num_speculative_tokens": 4}',
    )  # fmt: skip
    enable_lora: bool | None = _option(
        "lora", "", "--enable-lora", "serve LoRA adapters (needs core-lora)",
        is_flag=True, default=None,
    )  # fmt: skip
    max_loras: int | None = _option(
        "lora", "max_loras", "--max-loras", "adapters in one step (weight slots)", type=int
    )
    max_lora_rank: int | None = _option(
        "lora", "max_lora_rank", "--max-lora-rank", "highest adapter rank", type=int
    )
    max_cpu_loras: int | None = _option(
        "lora", "max_cpu_loras", "--max-cpu-loras", "adapters kept in host memory", type=int
    )
    lora_implementation: str | None = _option(
        "lora", "implementation", "--lora-implementation", "the core.lora entry serving adapters"
    )
    metrics_prefix: str | None = _option(
        "observability", "metrics_prefix", "--metrics-prefix",
        "prefix of the /metrics families: vllm (vLLM's dashboards work unchanged) or core",
        type=click.Choice(["vllm", "core"]),
    )  # fmt: skip
    reasoning_parser: str | None = _option(
        "structured_outputs", "reasoning_parser", "--reasoning-parser",
        "how a reasoning model's thinking is read from its output: deepseek_r1, qwen3, or a "
        "plugin's (core.reasoning_parsers); chat answers carry it as reasoning_content, and "
        "structured outputs constrain only what follows it",
        metavar="NAME",
    )  # fmt: skip

    def config_sections(self) -> dict[str, dict[str, Any]]:
        """{section: {field: value}} holding only the options the user gave."""
        sections: dict[str, dict[str, Any]] = {name: {} for name in EngineConfig.model_fields}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                _CONVERTERS.get(f.name, _assign)(sections, f.metadata, value)
        return sections

    def given_flags(self) -> dict[str, str]:
        """{flag: its config section} of the options the user gave, in declaration order."""
        return {
            f.metadata["flag"].split("/")[0]: f.metadata["section"]
            for f in fields(self)
            if getattr(self, f.name) is not None
        }

    def create_engine_config(
        self,
        platform: Platform,
        hooks: Any = None,
        model_max_len: int | None = None,
        usage: UsageContext = UsageContext.OFFLINE,
        stored_quantization: StoredQuantization | None = None,
        pooling: CheckpointPooling | None = None,
        num_layers: int | None = None,
        multimodal: bool = False,
    ) -> EngineConfig:
        """The EngineConfig of these options, in phases that each run once: the sections of
        the flags given; the defaults (the platform's with its -O level, the plugins'
        `core_adjust_config` hooks, then what derives from them, where a default that
        conflicts with an explicit choice yields); validation (the platform's
        `check_config`, then core.config_rules), which refuses with a ValueError naming
        the flags; freezing.

        `model_max_len` is the checkpoint's context length: the default max_model_len and
        the most a user may ask for; `num_layers` its decoder layers (at least one per
        pipeline stage), `multimodal` whether it takes images. `usage` picks the platform's
        default token budget.
        `stored_quantization` (how the checkpoint stores its weights) turns --quantization
        into the method the model runs with (None: float weights). `pooling` (what the
        checkpoint says about pooling) resolves --runner and the pooler config.
        """
        config = self._explicit_config()
        config.model.set_default("multimodal", multimodal)
        facts = ConfigFacts(self.given_flags(), model_max_len, num_layers, pooling)
        platform.apply_config_defaults(config)
        if hooks is not None:
            hooks.hook.core_adjust_config(config=config)
        _derive_defaults(config, platform, facts, usage, stored_quantization)
        platform.check_config(config)
        validate(config, facts)
        if config.speculative is not None:
            check_speculative_config(config.speculative)
        if config.structured_outputs.reasoning_parser is not None:
            reasoning_parser_class(config.structured_outputs.reasoning_parser)
        return config.freeze()

    def _explicit_config(self) -> EngineConfig:
        """An EngineConfig holding the options given and nothing derived."""
        sections = self.config_sections()
        speculative = sections.pop("speculative")
        pooler = sections.pop("pooler")
        lora = sections.pop("lora")
        return EngineConfig(
            **{
                name: info.annotation.model_validate(sections[name])  # type: ignore[union-attr]
                for name, info in EngineConfig.model_fields.items()
                if name in sections
            },
            speculative=(
                None
                if self.speculative_config is None
                else SpeculativeConfig.from_json(speculative)
            ),
            lora=LoRAConfig.model_validate(lora) if self.enable_lora else None,
            pooler=None if self.pooler_config is None else PoolerConfig.model_validate(pooler),
        )

    @classmethod
    def from_cli(cls, options: dict[str, Any]) -> EngineArgs:
        """EngineArgs from click's parsed options (extra keys are ignored)."""
        names = {f.name for f in fields(cls)}
        # A repeatable flag not given parses as (): not given, like every other option.
        return cls(**{k: v for k, v in options.items() if k in names and v != ()})


def _derive_defaults(
    config: EngineConfig,
    platform: Platform,
    facts: ConfigFacts,
    usage: UsageContext,
    stored_quantization: StoredQuantization | None,
) -> None:
    """Fill what derives from the flags, the platform's defaults and the hooks, where
    nobody chose it, in dependency order: the quantization method, the runner, what the
    -O level turns on, the defaults that yield to explicit choices (config_rules), the
    model's limits and token budgets, the executor, the graph capture sizes, LoRA's."""
    if envs.batch_invariant() and not config.model.is_user_set("batch_invariant"):
        config.model.set_default("batch_invariant", True)
    if stored_quantization is not None:
        _resolve_quantization(config, platform, stored_quantization)
    if facts.pooling is not None:
        resolve_runner(config, facts.pooling)
    config.compilation.fill_from_level()
    yield_defaults(config, facts)
    if facts.model_max_len is not None:
        budget = platform.default_max_num_batched_tokens(usage)
        burst = platform.default_burst_token_budget(usage)
        _fill_model_limits(config, facts.model_max_len, budget, burst)
    parallel = config.parallel
    parallel.fill("distributed_executor_backend", "uni" if parallel.world_size == 1 else "mp")
    if config.compilation.capture_graphs:
        config.compilation.resolve_capture_sizes(config.scheduler.max_num_seqs)
    if config.lora is not None:
        config.lora.fill_defaults()


def _resolve_quantization(
    config: EngineConfig, platform: Platform, stored: StoredQuantization
) -> None:
    """--quantization and the checkpoint's storage -> the method the model runs with."""
    config.model.quantization = resolve_quantization(
        config.model.quantization,
        stored,
        # Packed blocks cannot be split across ranks yet: dequantize under TP.
        keep_blocks=keeps_blocks(platform.device_type)
        and config.parallel.tensor_parallel_size == 1,
    )


def _fill_model_limits(
    config: EngineConfig, model_max_len: int, budget: int, burst: int | None
) -> None:
    """max_model_len from the model; the step budget: the platform's `budget` with chunked
    prefill, else a whole context, at least max_num_seqs; the platform's `burst` budget."""
    config.model.fill("max_model_len", model_max_len)
    scheduler = config.scheduler
    default = budget if scheduler.enable_chunked_prefill else config.model.max_model_len
    if scheduler.enable_chunked_prefill and scheduler.burst_token_budget is not None:
        # The default yields to a burst budget the user set (rule burst-covers-budget).
        default = min(default, scheduler.burst_token_budget)
    scheduler.fill("max_num_batched_tokens", max(default, scheduler.max_num_seqs))
    # A budget the user set is every step's: the platform's bursts come with its own budget,
    # and only where they are bursts (above the step budget).
    if burst is not None and not scheduler.is_user_set("max_num_batched_tokens"):
        if burst >= scheduler.max_num_batched_tokens:
            scheduler.fill("burst_token_budget", burst)


def _assign(sections: dict[str, dict[str, Any]], meta: Any, value: Any) -> None:
    sections[meta["section"]][meta["key"]] = value


def _set_eager(sections: dict[str, dict[str, Any]], meta: Any, value: bool) -> None:
    if value:
        sections["compilation"].update(
            compile_model=False, capture_graphs=False, cudagraph_mode="NONE"
        )


def _set_compilation(sections: dict[str, dict[str, Any]], meta: Any, value: Any) -> None:
    """--compilation-config: a level (vLLM accepts `-O3` as `--compilation-config 3`) or
    JSON keys of CompilationConfig; a level that disagrees with -O is refused."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    options = {"level": value} if isinstance(value, int) else parse_json_object(meta["flag"], value)
    section = sections["compilation"]
    level = options.get("level")
    if level is not None and section.get("level", level) != level:
        raise ValueError(f"--compilation-config level {level} contradicts -O{section['level']}")
    section.update(options)


def _set_json(sections: dict[str, dict[str, Any]], meta: Any, value: Any) -> None:
    sections[meta["section"]][meta["key"]] = parse_json_object(meta["flag"], value)


def _set_section(sections: dict[str, dict[str, Any]], meta: Any, value: Any) -> None:
    sections[meta["section"]] = parse_json_object(meta["flag"], value)


def _set_size(sections: dict[str, dict[str, Any]], meta: Any, value: Any) -> None:
    sections[meta["section"]][meta["key"]] = parse_size(value)


def _set_bytes(sections: dict[str, dict[str, Any]], meta: Any, value: Any) -> None:
    """--kv-cache-memory-bytes: a bare number counts bytes (vLLM's unit), not GiB. It sets
    --kv-cache-memory's field; giving both is refused (rule one-kv-budget-flag)."""
    bare = isinstance(value, int) or str(value).strip().isdigit()
    sections[meta["section"]][meta["key"]] = int(value) if bare else parse_size(value)


def _set_load_format(sections: dict[str, dict[str, Any]], meta: Any, value: str) -> None:
    """vLLM's other formats (pt, npcache, dummy, tensorizer, bitsandbytes...) are refused by
    name: core reads safetensors directories and GGUF files only."""
    if value not in LOAD_FORMATS:
        raise ValueError(
            f"{meta['flag']} {value}: not a format core reads; use {', '.join(LOAD_FORMATS)}"
        )
    _assign(sections, meta, value)


def _set_logits_processors(sections: dict[str, dict[str, Any]], meta: Any, value: Any) -> None:
    """--logits-processors: class names as given, and classes (LLM's keyword) by the name
    that imports them again in the worker, which gets the configuration as JSON."""
    if isinstance(value, str | type) or not isinstance(value, list | tuple):
        raise ValueError(f"logits_processors must be a list of classes or names, got {value!r}")
    sections[meta["section"]][meta["key"]] = [_class_name(item) for item in value]


def _class_name(item: Any) -> str:
    if isinstance(item, str):
        return item
    if not isinstance(item, type):
        raise ValueError(f"logits_processors entries must be classes or names, got {item!r}")
    name = f"{item.__module__}:{item.__qualname__}"
    module = sys.modules.get(item.__module__)
    found: Any = module
    for attribute in item.__qualname__.split("."):
        found = getattr(found, attribute, None)
    if found is not item:  # defined in a function: no name finds it
        raise ValueError(
            f"logits_processors: {item.__qualname__} cannot be imported by name ({name}); "
            "define it at the top level of a module"
        )
    return name


def _flag_only(sections: dict[str, dict[str, Any]], meta: Any, value: Any) -> None:
    """A switch read by create_engine_config itself (--enable-lora), no config key."""


_CONVERTERS: dict[str, Callable[..., None]] = {
    "enable_lora": _flag_only,
    "enforce_eager": _set_eager,
    "compilation_config": _set_compilation,
    "attention_backend_config": _set_json,
    "sampler_config": _set_json,
    "eplb_config": _set_json,
    "limit_mm_per_prompt": _set_json,
    "kv_transfer_config": _set_section,
    "speculative_config": _set_section,
    "pooler_config": _set_section,
    "kv_cache_memory": _set_size,
    "kv_cache_memory_bytes": _set_bytes,
    "load_format": _set_load_format,
    "logits_processors": _set_logits_processors,
}


def engine_options(command: Callable) -> Callable:
    """Decorate a click command with one option per EngineArgs field; --help shows the
    default its config field declares (none where it is derived at start)."""
    for f in reversed(fields(EngineArgs)):
        meta = f.metadata
        default = _declared_default(meta["section"], meta["key"])
        shown = {} if default is None else {"show_default": str(default)}
        option = click.option(meta["flag"], f.name, help=meta["help"], **meta["click"], **shown)
        command = option(command)
    return command


def _declared_default(section: str, key: str) -> Any:
    """The static default of config field `section.key`, or None (no such field, or one
    filled at start from the model, the platform or other flags)."""
    info = EngineConfig.model_fields.get(section)
    models = get_args(info.annotation) or (info.annotation,) if info else ()
    model = next((m for m in models if isinstance(m, type) and issubclass(m, BaseModel)), None)
    if model is None or key not in model.model_fields:
        return None
    default = model.model_fields[key].default
    return None if default is PydanticUndefined else getattr(default, "value", default)


__all__ = ["EngineArgs", "engine_options"]
