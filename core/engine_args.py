"""EngineArgs: the user's engine options, from Python keywords or CLI flags named as in vLLM.

Every option defaults to None, meaning "not given": only given options reach the config
as explicit values, so levels and platforms never override them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import click

from core.config import (
    LOAD_FORMATS,
    CUDAGraphMode,
    EngineConfig,
    LoRAConfig,
    PoolerConfig,
    SpeculativeConfig,
    UsageContext,
    parse_size,
)
from core.plugins.components import parse_json_object
from core.pooling.runner import CheckpointPooling, resolve_runner, settle_pooling_compilation
from core.quantization.selector import (
    StoredQuantization,
    packed_weights_pay_off,
    resolve_quantization,
)
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
        "branch, tag or commit of a hub id, found in the local Hugging Face cache",
    )  # fmt: skip
    download_dir: str | None = _option(
        "model", "download_dir", "--download-dir",
        "the Hugging Face cache directory to find hub ids in (default: Hugging Face's)",
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
        "share of device memory for weights, activations and KV cache (GPUs; default 0.9)",
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
    kv_cache_dtype: str | None = _option("cache", "kv_cache_dtype", "--kv-cache-dtype", "dtype")
    max_num_seqs: int | None = _option(
        "scheduler", "max_num_seqs", "--max-num-seqs", "most running requests", type=int
    )
    max_num_batched_tokens: int | None = _option(
        "scheduler", "max_num_batched_tokens", "--max-num-batched-tokens", "token budget",
        type=int,
    )  # fmt: skip
    burst_token_budget: int | None = _option(
        "scheduler", "burst_token_budget", "--burst-token-budget",
        "token budget of a step admitting a burst of arrivals", type=int,
    )  # fmt: skip
    long_prefill_token_threshold: int | None = _option(
        "scheduler", "long_prefill_token_threshold", "--long-prefill-token-threshold",
        "chunk prompts longer than this", type=int,
    )  # fmt: skip
    enable_chunked_prefill: bool | None = _option(
        "scheduler", "enable_chunked_prefill",
        "--enable-chunked-prefill/--no-enable-chunked-prefill", "chunked prefill", default=None,
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
    kv_transfer_config: str | dict | None = _option(
        "kv_transfer", "", "--kv-transfer-config", "KV connector JSON (none is built yet)"
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
        "lora", "implementation", "--lora-implementation", "core.lora entry (default: default)"
    )
    metrics_prefix: str | None = _option(
        "observability", "metrics_prefix", "--metrics-prefix",
        "prefix of the /metrics families: vllm (vLLM's dashboards work unchanged) or core",
        type=click.Choice(["vllm", "core"]),
    )  # fmt: skip

    def config_sections(self) -> dict[str, dict[str, Any]]:
        """{section: {field: value}} holding only the options the user gave."""
        sections: dict[str, dict[str, Any]] = {name: {} for name in EngineConfig.model_fields}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                _CONVERTERS.get(f.name, _assign)(sections, f.metadata, value)
        return sections

    def create_engine_config(
        self,
        platform: Platform,
        hooks: Any = None,
        model_max_len: int | None = None,
        usage: UsageContext = UsageContext.OFFLINE,
        stored_quantization: StoredQuantization | None = None,
        pooling: CheckpointPooling | None = None,
    ) -> EngineConfig:
        """Explicit options, then the model, the platform (with its -O level) and hooks fill
        the rest; a flag this build or platform cannot honour is a ValueError naming it.

        `model_max_len` is the checkpoint's context length: the default max_model_len and
        the most a user may ask for. `usage` picks the platform's default token budget.
        `stored_quantization` (how the checkpoint stores its weights) turns --quantization
        into the method the model runs with (None: float weights). `pooling` (what the
        checkpoint says about pooling) resolves --runner and the pooler config.
        """
        sections = self.config_sections()
        speculative = sections.pop("speculative")
        pooler = sections.pop("pooler")
        lora = _lora_config(self, sections.pop("lora"))
        config = EngineConfig(
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
            lora=lora,
            pooler=None if self.pooler_config is None else PoolerConfig.model_validate(pooler),
        )
        _refuse_unbuilt(config)
        tp_size = config.parallel.tensor_parallel_size
        if stored_quantization is not None:
            dtype = config.model.torch_dtype(platform)
            config.model.quantization = resolve_quantization(
                config.model.quantization,
                stored_quantization,
                # Packed blocks cannot be split across ranks yet: dequantize under TP.
                keep_blocks=packed_weights_pay_off(platform.device_type, dtype) and tp_size == 1,
            )

        if pooling is not None:
            resolve_runner(config, pooling)
        if model_max_len is not None:
            budget = platform.default_max_num_batched_tokens(usage)
            burst = platform.default_burst_token_budget(usage)
            _apply_model_limits(config, model_max_len, budget, burst)
        platform.check_and_update_config(config)
        if hooks is not None:
            hooks.hook.core_adjust_config(config=config)
            # A hook may change anything; what it leaves must pass the same checks as flags.
            _refuse_unbuilt(config)
            platform.check_and_update_config(config)
        if config.speculative is not None:
            check_speculative_config(config.speculative)
        settle_pooling_compilation(config)
        _refuse_compiled_combinations(config)
        return config.freeze()

    @classmethod
    def from_cli(cls, options: dict[str, Any]) -> EngineArgs:
        """EngineArgs from click's parsed options (extra keys are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in names})


def _refuse_compiled_combinations(config: EngineConfig) -> None:
    """Compiled or captured runs that were never built: the LoRA layers and pipeline stages
    read per-step state that a compiled graph would freeze; FULL graphs of mixed batches
    are not captured; PIECEWISE graphs are pieces of the compiled forward."""
    compilation = config.compilation
    mode = compilation.cudagraph_mode
    if mode is CUDAGraphMode.FULL:
        raise ValueError(
            "compilation_config.cudagraph_mode FULL (mixed batches in full graphs) is not "
            "implemented yet: use FULL_AND_PIECEWISE, FULL_DECODE_ONLY or PIECEWISE"
        )
    if mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE) and not (
        compilation.compile_model
    ):
        raise ValueError(
            f"compilation_config.cudagraph_mode {mode.value} captures pieces of the compiled "
            "model, but compilation is off: use -O2 or FULL_DECODE_ONLY"
        )
    if compilation.capture_graphs:
        compilation.resolve_capture_sizes(config.scheduler.max_num_seqs)
    if not (compilation.compile_model or compilation.capture_graphs):
        return
    for flag, enabled in (
        ("--enable-lora", config.lora is not None),
        ("--pipeline-parallel-size > 1", config.parallel.pipeline_parallel_size > 1),
    ):
        if enabled:
            raise ValueError(
                f"-O{compilation.level} compiles the model or captures graphs, which {flag} "
                "does not support yet: use -O0 or --enforce-eager"
            )


def _refuse_unbuilt(config: EngineConfig) -> None:
    """Refuse, naming the flag, what vLLM users may ask for but this build does not have;
    fill the executor backend (uni for one rank, mp for more)."""
    parallel = config.parallel
    world_size = parallel.tensor_parallel_size * parallel.pipeline_parallel_size
    parallel.set_default("distributed_executor_backend", "uni" if world_size == 1 else "mp")
    if parallel.pipeline_parallel_size > 1:
        for flag, enabled in (
            ("--speculative-config", config.speculative is not None),
            ("--enable-lora", config.lora is not None),
        ):
            if enabled:
                raise ValueError(f"{flag} with pipeline parallelism is not built yet; use 1 stage")
    local = parallel.local_data_parallel_ranks
    if local.stop > parallel.data_parallel_size:
        raise ValueError(
            f"--data-parallel-start-rank {local.start} + --data-parallel-size-local "
            f"{len(local)} exceeds --data-parallel-size {parallel.data_parallel_size}"
        )
    backend = parallel.distributed_executor_backend
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError("--distributed-executor-backend ray needs Ray: pip install 'core[ray]'")
    if backend == "uni" and world_size > 1:
        raise ValueError(
            f"--distributed-executor-backend uni runs one worker, but --tensor-parallel-size "
            f"{parallel.tensor_parallel_size} x --pipeline-parallel-size "
            f"{parallel.pipeline_parallel_size} needs {world_size}; use mp"
        )
    if config.kv_transfer.model_fields_set:
        raise ValueError(
            "--kv-transfer-config: no KV connector is wired into the scheduler and worker yet"
        )


def _lora_config(args: EngineArgs, options: dict[str, Any]) -> LoRAConfig | None:
    """The LoRA section when --enable-lora is given; its limits alone are refused (they
    would be ignored)."""
    if not args.enable_lora:
        if options:
            flags = [
                f.metadata["flag"]
                for f in fields(args)
                if f.metadata["section"] == "lora" and getattr(args, f.name) is not None
            ]
            raise ValueError(f"{', '.join(flags)}: LoRA options need --enable-lora")
        return None
    config = LoRAConfig.model_validate(options)
    config.resolve()
    return config


def _apply_model_limits(
    config: EngineConfig, model_max_len: int, budget: int, burst: int | None
) -> None:
    requested = config.model.max_model_len
    if requested is not None and requested > model_max_len:
        raise ValueError(
            f"max_model_len {requested} exceeds the model's context length {model_max_len}"
        )
    config.model.set_default("max_model_len", model_max_len)
    max_len = config.model.max_model_len
    scheduler = config.scheduler
    default = budget if scheduler.enable_chunked_prefill else max_len
    # A budget the user set is every step's: the platform's bursts come with its own budget.
    if burst is not None and not scheduler.is_user_set("max_num_batched_tokens"):
        scheduler.set_default("burst_token_budget", burst)
    scheduler.set_default("max_num_batched_tokens", max(default, scheduler.max_num_seqs))
    burst_budget = scheduler.burst_token_budget
    if burst_budget is not None and burst_budget < scheduler.max_num_batched_tokens:
        raise ValueError(
            f"burst_token_budget {burst_budget} must be >= max_num_batched_tokens "
            f"{scheduler.max_num_batched_tokens}"
        )
    if not scheduler.enable_chunked_prefill and scheduler.max_num_batched_tokens < max_len:
        raise ValueError(
            f"max_num_batched_tokens {scheduler.max_num_batched_tokens} must be >= "
            f"max_model_len {max_len} when chunked prefill is disabled"
        )


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
    --kv-cache-memory's field, so giving both is refused rather than one silently winning."""
    cache = sections[meta["section"]]
    if meta["key"] in cache:
        raise ValueError(f"{meta['flag']} and --kv-cache-memory set the same budget: give one")
    bare = isinstance(value, int) or str(value).strip().isdigit()
    cache[meta["key"]] = int(value) if bare else parse_size(value)


def _set_load_format(sections: dict[str, dict[str, Any]], meta: Any, value: str) -> None:
    """vLLM's other formats (pt, npcache, dummy, tensorizer, bitsandbytes...) are refused by
    name: core reads safetensors directories and GGUF files only."""
    if value not in LOAD_FORMATS:
        raise ValueError(
            f"{meta['flag']} {value}: not a format core reads; use {', '.join(LOAD_FORMATS)}"
        )
    _assign(sections, meta, value)


def _flag_only(sections: dict[str, dict[str, Any]], meta: Any, value: Any) -> None:
    """A switch read by create_engine_config itself (--enable-lora), no config key."""


_CONVERTERS: dict[str, Callable[..., None]] = {
    "enable_lora": _flag_only,
    "enforce_eager": _set_eager,
    "compilation_config": _set_compilation,
    "attention_backend_config": _set_json,
    "sampler_config": _set_json,
    "kv_transfer_config": _set_section,
    "speculative_config": _set_section,
    "pooler_config": _set_section,
    "kv_cache_memory": _set_size,
    "kv_cache_memory_bytes": _set_bytes,
    "load_format": _set_load_format,
}


def engine_options(command: Callable) -> Callable:
    """Decorate a click command with one option per EngineArgs field."""
    for f in reversed(fields(EngineArgs)):
        meta = f.metadata
        command = click.option(meta["flag"], f.name, help=meta["help"], **meta["click"])(command)
    return command


__all__ = ["EngineArgs", "engine_options"]
