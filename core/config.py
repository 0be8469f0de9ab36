"""Engine configuration: pydantic models whose validation errors name the field.

Each sub-config records which fields the user set explicitly (pydantic's
`model_fields_set`); defaults from optimization levels and platforms fill only the rest,
so explicit user flags always win. EngineArgs.create_engine_config fills the defaults in
one pass (the platform's, the `core_adjust_config` hooks', then what derives from them),
validates once (core.config_rules and the platform) and freezes the result.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal, get_args

import torch
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_UNITS = {"": 1 << 30, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: str | int | float) -> int:
    """Bytes from "4GiB", "512MiB", "1.5G" or a bare number of GiB."""
    if isinstance(value, int | float):
        return int(value * _UNITS[""])
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", value.lower())
    if match is None:
        raise ValueError(f"size {value!r} is not a number with an optional unit like 4GiB")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


class UsageContext(str, enum.Enum):
    """Who drives the engine; some defaults differ (vLLM's usage context)."""

    OFFLINE = "offline"  # LLM / LLMEngine: whole batches, throughput first
    SERVING = "serving"  # AsyncLLM / core serve: streams, inter-token latency matters


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    _frozen: bool = PrivateAttr(default=False)

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen and not name.startswith("_"):
            raise ValueError(f"configuration is frozen; cannot set {name}")
        super().__setattr__(name, value)

    def is_user_set(self, field: str) -> bool:
        """Whether `field` was given explicitly (then no default may override it)."""
        return field in self.model_fields_set

    def set_default(self, field: str, value: Any) -> None:
        """Set `field` unless the user set it; does not mark it as user-set."""
        if not self.is_user_set(field):
            super().__setattr__(field, value)
            self.model_fields_set.discard(field)

    def fill(self, field: str, value: Any) -> None:
        """Set `field` when nobody chose it yet (it is still None): a value derived from
        others, which leaves what the user, the platform or a hook set alone."""
        if getattr(self, field) is None:
            self.set_default(field, value)


QUANTIZATION_NONE = "none"
"""--quantization none: weights dequantized where the format allows it (GGUF), else as stored."""

LoadFormat = Literal["auto", "safetensors", "gguf"]
LOAD_FORMATS: tuple[str, ...] = get_args(LoadFormat)
"""--load-format values: the weight formats core reads (auto: whichever the model is)."""


class ModelConfig(_Config):
    model: str | None = None  # a directory, a .gguf file or a hub id; None: the default
    tokenizer: str | None = None
    served_model_name: str | None = None
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    max_model_len: int | None = Field(default=None, ge=1)
    quantization: str | None = None
    seed: int = 0
    chat_template: str | None = None
    generation_config: str = "auto"
    max_logprobs: int = Field(default=20, ge=-1)  # -1: no cap (vLLM's)
    revision: str | None = None  # a hub id's branch, tag or commit (downloaded, or cached)
    download_dir: str | None = None  # the HF cache hub ids download into (None: HF's)
    load_format: LoadFormat = "auto"  # the format the weights must be in
    trust_remote_code: bool = False  # core never runs a checkpoint's code (load_checks)
    # generate: sample tokens; pooling: embed (one pooled vector per prompt, no sampling).
    # "auto" is resolved from the checkpoint before the config is frozen (core.pooling.runner).
    runner: Literal["auto", "generate", "pooling"] = "auto"
    # The most items of each modality one prompt may carry ({"image": 2}); a modality not
    # named keeps core.multimodal.processing.DEFAULT_ITEM_LIMIT, and 0 refuses it.
    limit_mm_per_prompt: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    # The directory whose files `file://` media URLs may name (None: no local files).
    allowed_local_media_path: str | None = None
    # The core.io_processors entry that turns raw request data into prompts and outputs
    # into responses (None: the checkpoint's config.json `io_processor_plugin`, if any).
    io_processor_plugin: str | None = None
    # Sleep mode (vLLM's): LLM.sleep / POST /sleep free the KV cache and offload or drop the
    # weights until woken (core.worker.sleep_mode).
    enable_sleep_mode: bool = False
    # Every kernel reduces in an order fixed by the model's shapes, never by the batch
    # (core.batch_invariant): a request's tokens and logprobs do not depend on what else runs.
    batch_invariant: bool = False
    # Whether the checkpoint's model takes images: read from it at start, not a flag.
    multimodal: bool = False

    def torch_dtype(self, platform: Any) -> torch.dtype:
        """--dtype, or for "auto" the platform's `default_dtype` (read only then: the CPU
        platform may measure it)."""
        return platform.default_dtype if self.dtype == "auto" else _DTYPES[self.dtype]


class CacheConfig(_Config):
    block_size: int = Field(default=16, ge=1)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1)
    # Platforms that profile memory (Platform.memory_profiling): the share of the device's
    # total memory the engine may use, weights and activations included; the KV cache gets
    # the rest of that share. Refused elsewhere; --kv-cache-memory replaces it.
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: Literal["sha256", "fast"] = "sha256"
    # What the KV cache stores (core.attention.kv_cache_dtype): "auto" the model's dtype,
    # or an FP8 format with per-layer scales; vLLM's "fp8" is e4m3, and is resolved to it
    # so that backends declare one name per format.
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    watermark: float = Field(default=0.01, ge=0.0, lt=1.0)

    @field_validator("kv_cache_dtype")
    @classmethod
    def _fp8_is_e4m3(cls, value: str) -> str:
        return "fp8_e4m3" if value == "fp8" else value


class SchedulerConfig(_Config):
    max_num_seqs: int = Field(default=64, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    # Set: steps are sized from their measured cost and the pending prompt tokens
    # (core/scheduler/step_budget.py), up to this many tokens; max_num_batched_tokens is
    # then only the budget before any step is measured. None: every step keeps
    # max_num_batched_tokens. At least that budget.
    burst_token_budget: int | None = Field(default=None, ge=1)
    long_prefill_token_threshold: int = Field(default=0, ge=0)
    enable_chunked_prefill: bool = True
    policy: Literal["fcfs", "priority"] = "fcfs"
    # Multimodal models: the encoder embeddings one step may compute, and how many the
    # encoder cache holds (None: the step's token budget, and at least one image's worth).
    max_num_encoder_input_tokens: int | None = Field(default=None, ge=1)
    encoder_cache_size: int | None = Field(default=None, ge=1)
    # Schedule step N+1 while step N runs (core/scheduler/scheduler.py's placeholders).
    async_scheduling: bool = False

    def max_step_tokens(self, max_model_len: int) -> int:
        """The most tokens one step may schedule: what the model runner's buffers hold."""
        return max(self.max_num_batched_tokens or max_model_len, self.burst_token_budget or 0)


class EPLBConfig(_Config):
    """`--eplb-config`, vLLM's keys: the steps whose expert loads are counted
    (`window_size`), how often the experts are rearranged (`step_interval`, in forward
    steps), the extra expert slots for replicas of hot experts (`num_redundant_experts`),
    and whether each rearrangement logs the load balance (`log_balancedness`)."""

    window_size: int = Field(default=1000, ge=1)
    step_interval: int = Field(default=3000, ge=1)
    num_redundant_experts: int = Field(default=0, ge=0)
    log_balancedness: bool = False


class ParallelConfig(_Config):
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int = Field(default=1, ge=1)  # engine cores behind one frontend
    # Which of them this engine core is (set by the frontend for each): its workers use
    # the devices after those of the engine cores before it.
    data_parallel_rank: int = Field(default=0, ge=0)
    # Several nodes: this node runs engine cores start_rank .. start_rank + size_local - 1
    # (None: all of them); the others connect to the primary node's address, over TCP from
    # rpc_port on (two ports per remote engine core).
    data_parallel_size_local: int | None = Field(default=None, ge=1)
    data_parallel_start_rank: int = Field(default=0, ge=0)
    data_parallel_address: str = "127.0.0.1"
    data_parallel_rpc_port: int = Field(default=13345, ge=1, le=65535)

    @property
    def local_data_parallel_ranks(self) -> range:
        """The data-parallel ranks whose engine cores run on this node."""
        local = self.data_parallel_size_local or self.data_parallel_size
        return range(self.data_parallel_start_rank, self.data_parallel_start_rank + local)

    @property
    def world_size(self) -> int:
        """The worker ranks of one engine core: tensor x pipeline parallel."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def experts_span_engines(self) -> bool:
        """Expert parallelism over several data-parallel engine cores: their workers form
        one world (DP x TP ranks share the experts) and the engines step in lock-step."""
        return self.enable_expert_parallel and self.data_parallel_size > 1

    @property
    def data_parallel_master_port(self) -> int:
        """Where the shared world of `experts_span_engines` meets, on the data-parallel
        address: the port after the remote engine cores' pairs (rpc_port + 2 * size)."""
        return self.data_parallel_rpc_port + 2 * self.data_parallel_size

    distributed_executor_backend: Literal["uni", "mp", "ray"] | None = None
    # Mixtures of experts: each rank holds whole experts, a share of them, rather than a
    # slice of every expert (the ranks: every engine's with --data-parallel-size > 1, the
    # tensor-parallel ones of the one engine otherwise); EPLB rearranges them by load.
    enable_expert_parallel: bool = False
    enable_eplb: bool = False
    eplb: EPLBConfig = Field(default_factory=EPLBConfig)


class DeviceConfig(_Config):
    device: str | None = None  # a `core.platforms` entry name; None: automatic


# The lowest -O level that turns each optimization on (DESIGN.md section 6); 3 is reserved.
COMPILE_LEVEL = 1
GRAPH_CAPTURE_LEVEL = 2


class CUDAGraphMode(str, enum.Enum):
    """vLLM's `cudagraph_mode`: which batches run as captured device graphs.

    FULL captures the whole forward, attention included (the backend must declare
    `graph_support`); PIECEWISE captures the compiled pieces between attention layers
    (attention runs eagerly between them). The *_DECODE_ONLY / *_AND_PIECEWISE forms pick
    FULL for pure-decode batches and the other (none / PIECEWISE) for mixed ones.
    """

    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"


# vLLM's default capture sizes: 1, 2, 4, then every multiple of 8 up to the largest.
_SMALL_CAPTURE_SIZES = (1, 2, 4)
_CAPTURE_SIZE_STEP = 8
_MAX_DEFAULT_CAPTURE_SIZE = 512


class CompilationConfig(_Config):
    """-O levels (DESIGN.md section 6) and `--compilation-config` (vLLM's keys).

    `level` 0 eager, 1 torch.compile of the model, 2 adds graph capture of decode batches,
    3 reserved; None means "the platform's default", which the platform fills in
    (Platform.apply_config_defaults). compile_model / capture_graphs (and the JSON keys)
    the user sets win over the level's defaults.
    """

    level: int | None = Field(default=None, ge=0, le=3)
    compile_model: bool | None = None
    capture_graphs: bool | None = None
    # torch.compile backend: inductor generates kernels; "eager" traces with Dynamo and
    # runs the traced graph as is (debugging a compile problem without codegen).
    backend: Literal["inductor", "eager"] = "inductor"
    cudagraph_mode: CUDAGraphMode | None = None
    cudagraph_capture_sizes: list[int] | None = None
    max_cudagraph_capture_size: int | None = Field(default=None, ge=1)
    # Where compiled artifacts persist across starts (default: core's cache directory).
    cache_dir: str | None = None

    @field_validator("cudagraph_capture_sizes")
    @classmethod
    def _sorted_positive_sizes(cls, sizes: list[int] | None) -> list[int] | None:
        if sizes is not None and (not sizes or min(sizes) < 1):
            raise ValueError(f"must be a non-empty list of positive batch sizes, got {sizes}")
        return None if sizes is None else sorted(set(sizes))

    def fill_from_level(self) -> None:
        """Fill compile_model / capture_graphs from the level where nobody chose them."""
        self.fill("compile_model", self.level >= COMPILE_LEVEL)
        # Naming a graph mode asks for graphs whatever the level.
        asks_graphs = self.cudagraph_mode not in (None, CUDAGraphMode.NONE)
        self.fill("capture_graphs", asks_graphs or self.level >= GRAPH_CAPTURE_LEVEL)
        if not self.capture_graphs:
            self.fill("cudagraph_mode", CUDAGraphMode.NONE)

    def resolve_capture_sizes(self, max_num_seqs: int) -> None:
        """Fill cudagraph_capture_sizes from max_cudagraph_capture_size, itself
        min(max_num_seqs, 512) by default."""
        if self.cudagraph_capture_sizes is not None:
            return
        largest = self.max_cudagraph_capture_size or min(max_num_seqs, _MAX_DEFAULT_CAPTURE_SIZE)
        sizes = [s for s in _SMALL_CAPTURE_SIZES if s <= largest]
        sizes += list(range(_CAPTURE_SIZE_STEP, largest + 1, _CAPTURE_SIZE_STEP))
        if largest not in sizes:
            sizes.append(largest)
        self.fill("cudagraph_capture_sizes", sizes)


class ComponentConfig(_Config):
    """Explicit component choices and their constructor keyword arguments."""

    attention_backend: str | None = None
    attention_backend_config: dict[str, Any] = Field(default_factory=dict)
    sampler: str | None = None
    sampler_config: dict[str, Any] = Field(default_factory=dict)
    # --logits-processors: LogitsProcessor classes ("module.path:Class") run besides the
    # core.logits_processors plugins (core.sample.logits_processor_selector)
    logits_processors: list[str] = Field(default_factory=list)


class KVTransferConfig(_Config):
    kv_connector: str | None = None
    kv_role: Literal["kv_producer", "kv_consumer", "kv_both"] | None = None
    kv_connector_extra_config: dict[str, Any] = Field(default_factory=dict)


class SpeculativeConfig(_Config):
    """`--speculative-config`: the method (a `core.spec_proposers` entry), how many tokens
    it drafts per step, and the method's own keys (checked by its Proposer.options_model).

    vLLM's JSON is flat ({"method": "ngram", "num_speculative_tokens": 4,
    "prompt_lookup_max": 5}); `from_json` splits it.
    """

    method: str = Field(min_length=1)
    num_speculative_tokens: int = Field(ge=1)
    options: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> SpeculativeConfig:
        """Split vLLM's flat JSON; a "model" without a "method" means "draft_model", as
        in vLLM. ValueError naming the field when one is missing or out of range."""
        options = dict(value)
        method = options.pop("method", None)
        if method is None and "model" in options:
            method = "draft_model"
        if method is None:
            raise ValueError('speculative_config.method is required (e.g. "ngram")')
        if "num_speculative_tokens" not in options:
            raise ValueError("speculative_config.num_speculative_tokens is required")
        k = options.pop("num_speculative_tokens")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(
                f"speculative_config.num_speculative_tokens must be an integer >= 1, got {k!r}"
            )
        return cls(method=method, num_speculative_tokens=k, options=options)


class LoRAConfig(_Config):
    """`--enable-lora` and its limits (vLLM's names and defaults).

    `max_loras` adapters can be in the weight buffers at once (so at most that many
    distinct adapters run in one step); `max_cpu_loras` loaded adapters are kept in host
    memory (default: `max_loras`); no adapter may have a rank above `max_lora_rank`.
    `implementation` is the `core.lora` entry that serves them.
    """

    max_loras: int = Field(default=1, ge=1)
    max_lora_rank: int = Field(default=16, ge=1)
    max_cpu_loras: int | None = Field(default=None, ge=1)
    implementation: str = "default"

    def fill_defaults(self) -> None:
        """Fill max_cpu_loras: as many adapters in host memory as in the weight buffers."""
        self.fill("max_cpu_loras", self.max_loras)


class PoolerConfig(_Config):
    """`--pooler-config` (vLLM's keys): how a pooling model makes its vectors. Fields left
    None are filled from the checkpoint (its sentence-transformers config, else the
    architecture's default pooling and normalization on) by core.pooling.runner."""

    pooling_type: Literal["CLS", "MEAN", "LAST"] | None = None
    normalize: bool | None = None


class StructuredOutputsConfig(_Config):
    """How structured outputs are constrained (vLLM's `structured_outputs_config`)."""

    # The core.reasoning_parsers entry of --reasoning-parser: a grammar then constrains
    # only the tokens after the model's reasoning ends (None: from the first token).
    reasoning_parser: str | None = None


class ObservabilityConfig(_Config):
    """What the server reports about itself."""

    # The prefix of every Prometheus family on /metrics: "vllm" (vllm:num_requests_running...)
    # so dashboards and autoscalers built for vLLM read core unchanged, or "core".
    metrics_prefix: Literal["vllm", "core"] = "vllm"


class EngineConfig(_Config):
    model: ModelConfig = Field(default_factory=ModelConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    device: DeviceConfig = Field(default_factory=DeviceConfig)
    compilation: CompilationConfig = Field(default_factory=CompilationConfig)
    components: ComponentConfig = Field(default_factory=ComponentConfig)
    kv_transfer: KVTransferConfig = Field(default_factory=KVTransferConfig)
    speculative: SpeculativeConfig | None = None
    lora: LoRAConfig | None = None  # None: LoRA adapters are not enabled
    pooler: PoolerConfig | None = None  # None: --runner generate
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)
    structured_outputs: StructuredOutputsConfig = Field(default_factory=StructuredOutputsConfig)

    def freeze(self) -> EngineConfig:
        """A deep copy that refuses changes (assignments were validated as they happened)."""
        frozen = self.model_copy(deep=True)
        for part in (frozen, *(getattr(frozen, name) for name in EngineConfig.model_fields)):
            if part is not None:
                part._frozen = True
        return frozen
