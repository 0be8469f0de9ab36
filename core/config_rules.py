"""Which combinations of settings a start may ask for: every rule (core.config_rule) in
one registry, `RULES`.

Each Rule names the features (flags) it involves, what it refuses and the remedy. They run
inside EngineArgs.create_engine_config, each once:

- `yield_defaults`, the last step of the defaults pass: where one side of a conflict is a
  default (the platform's -O level, what a pooling checkpoint turns off), that default
  yields to the other side, logged at INFO. A default never refuses.
- `validate`, after the defaults and the plugins' hooks: what still conflicts was asked for
  explicitly and is refused with a ValueError naming both flags. Checks change nothing.

core.compatibility_table renders the registry as docs/reference/compatibility.md.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

from core.config import CUDAGraphMode, EngineConfig
from core.config_rule import (
    ASYNC_SCHEDULING,
    BATCH_INVARIANT,
    COMPILED,
    EXPERTS_ACROSS_ENGINES,
    KV_TRANSFER,
    LORA,
    MULTIMODAL,
    PIPELINE,
    POOLING,
    SLEEP_MODE,
    SPECULATIVE,
    Check,
    ConfigFacts,
    Rule,
    compile_flag,
    compiles,
    enabled,
)
from core.models.pipeline import too_many_stages
from core.pooling.runner import whole_prompt_reason

__all__ = ["RULES", "validate", "yield_defaults"]

logger = logging.getLogger(__name__)

_RULES: list[Rule] = []  # in the order they are checked: the first broken one is reported
_PIECEWISE_MODES = (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE)


def yield_defaults(config: EngineConfig, facts: ConfigFacts) -> None:
    """Let every default that conflicts with another setting give way, logging why."""
    for rule in RULES:
        done = None if rule.yields is None else rule.yields(config, facts)
        if done is not None:
            logger.info("%s (rule %s)", done, rule.name)


def validate(config: EngineConfig, facts: ConfigFacts) -> None:
    """ValueError with the message of the first rule `config` breaks; changes nothing."""
    for rule in RULES:
        message = rule.check(config, facts)
        if message is not None:
            raise ValueError(message)


def _rule(
    name: str, features: tuple[str, ...], refuses: str, remedy: str, default: str = ""
) -> Callable[[Check], Check]:
    """Register the decorated check as a Rule whose sides are always explicit, or whose
    default side (`default`) is derived so that it does not conflict."""

    def register(check: Check) -> Check:
        _RULES.append(Rule(name, features, refuses, remedy, check, default=default))
        return check

    return register


def _not_built(name: str, feature: str, partner: str, remedy: str, message: str) -> None:
    """Register: `partner` with `feature` was never built; both are explicit choices."""

    def check(config: EngineConfig, facts: ConfigFacts) -> str | None:
        both = enabled(feature, config) and enabled(partner, config)
        return message.format(flag=partner, remedy=remedy) if both else None

    _RULES.append(Rule(name, (feature, partner), f"{partner} with {feature}", remedy, check))


# -- parallelism -----------------------------------------------------------------------------

_PIPELINE_MESSAGE = (
    "{flag} with pipeline parallelism (--pipeline-parallel-size > 1) is not built yet; {remedy}"
)
_not_built("pipeline-speculative", PIPELINE, SPECULATIVE, "use 1 stage", _PIPELINE_MESSAGE)
_not_built("pipeline-lora", PIPELINE, LORA, "use 1 stage", _PIPELINE_MESSAGE)


@_rule(
    "data-parallel-local-ranks",
    ("--data-parallel-start-rank", "--data-parallel-size-local", "--data-parallel-size"),
    "local engine cores past the last data-parallel rank",
    "lower --data-parallel-start-rank or --data-parallel-size-local",
)
def _check_local_ranks(config: EngineConfig, facts: ConfigFacts) -> str | None:
    parallel = config.parallel
    local = parallel.local_data_parallel_ranks
    if local.stop <= parallel.data_parallel_size:
        return None
    return (
        f"--data-parallel-start-rank {local.start} + --data-parallel-size-local "
        f"{len(local)} exceeds --data-parallel-size {parallel.data_parallel_size}"
    )


@_rule(
    "ray-installed", ("--distributed-executor-backend ray",), "the Ray executor without Ray",
    "pip install 'core[ray]'",
)  # fmt: skip
def _check_ray(config: EngineConfig, facts: ConfigFacts) -> str | None:
    if config.parallel.distributed_executor_backend != "ray":
        return None
    if importlib.util.find_spec("ray") is not None:
        return None
    return "--distributed-executor-backend ray needs Ray: pip install 'core[ray]'"


@_rule(
    "one-worker-one-rank",
    ("--distributed-executor-backend uni", "--tensor-parallel-size > 1", PIPELINE),
    "one in-process worker for several ranks",
    "--distributed-executor-backend mp",
    default="the default executor is uni for one rank, mp for more",
)
def _check_one_worker(config: EngineConfig, facts: ConfigFacts) -> str | None:
    parallel = config.parallel
    if parallel.distributed_executor_backend != "uni" or parallel.world_size == 1:
        return None
    return (
        f"--distributed-executor-backend uni runs one worker, but --tensor-parallel-size "
        f"{parallel.tensor_parallel_size} x --pipeline-parallel-size "
        f"{parallel.pipeline_parallel_size} needs {parallel.world_size}; use mp"
    )


@_rule(
    "kv-transfer-names-a-connector", ("--kv-transfer-config",),
    "a KV transfer config without its kv_connector", "name one: {\"kv_connector\": ...}",
)  # fmt: skip
def _check_kv_connector_named(config: EngineConfig, facts: ConfigFacts) -> str | None:
    transfer = config.kv_transfer
    if not transfer.model_fields_set or transfer.kv_connector is not None:
        return None
    return '--kv-transfer-config: kv_connector is required (name one: {"kv_connector": ...})'


@_rule(
    "kv-transfer-no-pipeline", ("--kv-transfer-config", "--pipeline-parallel-size"),
    "a KV connector with pipeline stages (several steps in flight: each rank's transfer "
    "reports would have to be matched to their step)",
    "--pipeline-parallel-size 1 (tensor parallelism is fine)",
)  # fmt: skip
def _check_kv_transfer_no_pipeline(config: EngineConfig, facts: ConfigFacts) -> str | None:
    size = config.parallel.pipeline_parallel_size
    if config.kv_transfer.kv_connector is None or size == 1:
        return None
    return (
        f"--kv-transfer-config is not available with --pipeline-parallel-size {size}: use "
        "--pipeline-parallel-size 1 (--tensor-parallel-size may be larger)"
    )


@_rule(
    "eplb-needs-expert-parallel", ("--enable-eplb", "--eplb-config", "--enable-expert-parallel"),
    "expert load balancing without expert parallelism (or its options without it)",
    "add --enable-expert-parallel (and --enable-eplb for --eplb-config)",
)  # fmt: skip
def _check_eplb(config: EngineConfig, facts: ConfigFacts) -> str | None:
    parallel = config.parallel
    if parallel.enable_eplb and not parallel.enable_expert_parallel:
        return "--enable-eplb rearranges experts across ranks: add --enable-expert-parallel"
    if "--eplb-config" in facts.given and not parallel.enable_eplb:
        return "--eplb-config: its options need --enable-eplb"
    return None


@_rule(
    "experts-across-engines-executor",
    (EXPERTS_ACROSS_ENGINES, "--distributed-executor-backend ray", "--data-parallel-rpc-port"),
    "the Ray executor for engines that share experts (their workers meet on the "
    "data-parallel address), or a master port past 65535",
    "--distributed-executor-backend mp (or uni), a lower --data-parallel-rpc-port",
)  # fmt: skip
def _check_experts_across_engines(config: EngineConfig, facts: ConfigFacts) -> str | None:
    parallel = config.parallel
    if not parallel.experts_span_engines:
        return None
    if parallel.distributed_executor_backend == "ray":
        return (
            f"--distributed-executor-backend ray is not available with {EXPERTS_ACROSS_ENGINES}"
            " (the engines' workers join one world on the data-parallel address): use mp"
        )
    if parallel.data_parallel_master_port > 65535:
        return (
            f"--data-parallel-rpc-port {parallel.data_parallel_rpc_port}: engines sharing "
            f"experts meet on port rpc_port + 2 x --data-parallel-size "
            f"({parallel.data_parallel_master_port}), past 65535; choose a lower port"
        )
    return None


_ACROSS_ENGINES_MESSAGE = (
    "{flag} with experts shared across data-parallel engines (--enable-expert-parallel, "
    "--data-parallel-size > 1: the engines step in lock-step) is not built yet; {remedy}"
)
_not_built(
    "experts-across-engines-pipeline", EXPERTS_ACROSS_ENGINES, PIPELINE,
    "use 1 stage", _ACROSS_ENGINES_MESSAGE,
)  # fmt: skip
_not_built(
    "experts-across-engines-speculative", EXPERTS_ACROSS_ENGINES, SPECULATIVE,
    "serve without it", _ACROSS_ENGINES_MESSAGE,
)  # fmt: skip
_not_built(
    "experts-across-engines-kv-transfer", EXPERTS_ACROSS_ENGINES, KV_TRANSFER,
    "serve without it or with --data-parallel-size 1", _ACROSS_ENGINES_MESSAGE,
)  # fmt: skip


# -- LoRA, memory, token budgets, the model's size -------------------------------------------


@_rule(
    "lora-options-need-lora", ("--max-loras and the other LoRA options", LORA),
    "LoRA limits without LoRA (they would be ignored)", "add --enable-lora",
)  # fmt: skip
def _check_lora_options(config: EngineConfig, facts: ConfigFacts) -> str | None:
    given = [flag for flag, section in facts.given.items() if section == "lora"]
    options = [flag for flag in given if flag != LORA]
    if config.lora is not None or not options:
        return None
    return f"{', '.join(options)}: LoRA options need --enable-lora"


@_rule(
    "lora-host-slots", ("--max-cpu-loras", "--max-loras"),
    "fewer adapters in host memory than in the weight buffers", "--max-cpu-loras >= --max-loras",
    default="--max-cpu-loras defaults to --max-loras",
)  # fmt: skip
def _check_lora_slots(config: EngineConfig, facts: ConfigFacts) -> str | None:
    lora = config.lora
    if lora is None or lora.max_cpu_loras >= lora.max_loras:
        return None
    return f"max_cpu_loras ({lora.max_cpu_loras}) must be >= max_loras ({lora.max_loras})"


@_rule(
    "one-kv-budget-flag", ("--kv-cache-memory", "--kv-cache-memory-bytes"),
    "two flags for the same KV-cache budget", "give one",
)  # fmt: skip
def _check_two_kv_budgets(config: EngineConfig, facts: ConfigFacts) -> str | None:
    # Read from the flags given, not the field they share: whichever is declared first.
    if not {"--kv-cache-memory", "--kv-cache-memory-bytes"} <= facts.given.keys():
        return None
    return "--kv-cache-memory-bytes and --kv-cache-memory set the same budget: give one"


@_rule(
    "one-kv-budget", ("--gpu-memory-utilization", "--kv-cache-memory"),
    "two ways to size the KV cache", "give one",
)  # fmt: skip
def _check_utilization_and_budget(config: EngineConfig, facts: ConfigFacts) -> str | None:
    cache = config.cache
    if not cache.is_user_set("gpu_memory_utilization") or cache.kv_cache_memory_bytes is None:
        return None
    return "--gpu-memory-utilization and --kv-cache-memory both size the KV cache; give one"


@_rule(
    "model-context", ("--max-model-len",), "a context longer than the model's",
    "--max-model-len at most the model's",
    default="--max-model-len defaults to the model's context length",
)  # fmt: skip
def _check_model_len(config: EngineConfig, facts: ConfigFacts) -> str | None:
    requested = config.model.max_model_len
    if facts.model_max_len is None or requested is None or requested <= facts.model_max_len:
        return None
    return f"max_model_len {requested} exceeds the model's context length {facts.model_max_len}"


@_rule(
    "burst-covers-budget", ("--burst-token-budget", "--max-num-batched-tokens"),
    "a burst budget under the step budget", "--burst-token-budget >= the step budget",
    default="a default step budget stays under --burst-token-budget (chunked prefill on); "
    "the platform's burst budget applies only above the step budget",
)  # fmt: skip
def _check_burst(config: EngineConfig, facts: ConfigFacts) -> str | None:
    scheduler = config.scheduler
    burst, budget = scheduler.burst_token_budget, scheduler.max_num_batched_tokens
    if burst is None or budget is None or burst >= budget:
        return None
    return f"burst_token_budget {burst} must be >= max_num_batched_tokens {budget}"


@_rule(
    "whole-prompt-budget",
    ("--max-num-batched-tokens", "--no-enable-chunked-prefill", "--max-model-len"),
    "a step budget under the context without chunked prefill",
    "a larger --max-num-batched-tokens or chunked prefill",
    default="without chunked prefill the default budget is max_model_len",
)
def _check_whole_prompt_budget(config: EngineConfig, facts: ConfigFacts) -> str | None:
    scheduler = config.scheduler
    budget, max_len = scheduler.max_num_batched_tokens, config.model.max_model_len
    if scheduler.enable_chunked_prefill or budget is None or max_len is None or budget >= max_len:
        return None
    return (
        f"max_num_batched_tokens {budget} must be >= max_model_len {max_len} when chunked "
        "prefill is disabled"
    )


@_rule(
    "pipeline-stages", ("--pipeline-parallel-size",), "more stages than decoder layers",
    "at most one stage per decoder layer",
)  # fmt: skip
def _check_stages(config: EngineConfig, facts: ConfigFacts) -> str | None:
    if facts.num_layers is None:
        return None
    return too_many_stages(facts.num_layers, config.parallel.pipeline_parallel_size)


# -- async scheduling ------------------------------------------------------------------------


def _async_scheduling_rule(name: str, partner: str, reason: str) -> None:
    """Register: async scheduling with `partner` is refused, saying why."""

    def check(config: EngineConfig, facts: ConfigFacts) -> str | None:
        if not (enabled(ASYNC_SCHEDULING, config) and enabled(partner, config)):
            return None
        return f"--async-scheduling with {partner}: {reason}; use --no-async-scheduling"

    refuses = f"{ASYNC_SCHEDULING} with {partner}"
    _RULES.append(Rule(name, (ASYNC_SCHEDULING, partner), refuses, "--no-async-scheduling", check))


_async_scheduling_rule(
    "async-scheduling-pipeline", PIPELINE, "pipeline stages already run one step each at once"
)
_async_scheduling_rule(
    "async-scheduling-kv-transfer", KV_TRANSFER, "a KV connector's steps do not overlap yet"
)
_async_scheduling_rule(
    "async-scheduling-experts-across-engines", EXPERTS_ACROSS_ENGINES,
    "engines in lock-step cannot run ahead of each other",
)  # fmt: skip


# -- pooling ---------------------------------------------------------------------------------


@_rule(
    "generate-needs-head", ("--runner generate",),
    "generating with a model without a language-model head", "--runner pooling",
)  # fmt: skip
def _check_generate_head(config: EngineConfig, facts: ConfigFacts) -> str | None:
    pooling = facts.pooling
    if config.model.runner != "generate" or pooling is None or not pooling.pooling_only:
        return None
    return (
        f"--runner generate: {pooling.architecture} has no language-model head; "
        "it can only embed (--runner pooling)"
    )


@_rule(
    "pooler-config-pools", ("--pooler-config", "--runner generate"),
    "a pooler config for a generating model", "--runner pooling",
)  # fmt: skip
def _check_pooler_for_generate(config: EngineConfig, facts: ConfigFacts) -> str | None:
    if config.model.runner != "generate" or config.pooler is None:
        return None
    return "--pooler-config applies to --runner pooling only"


_POOLING_MESSAGE = "{flag} with --runner pooling is not built yet; {remedy}"
_not_built("pooling-speculative", POOLING, SPECULATIVE, "serve without it", _POOLING_MESSAGE)
_not_built("pooling-lora", POOLING, LORA, "serve without it", _POOLING_MESSAGE)
_not_built("pooling-pipeline", POOLING, PIPELINE, "use 1 stage", _POOLING_MESSAGE)

# -- multimodal models -----------------------------------------------------------------------

_MULTIMODAL_MESSAGE = "{flag} with a multimodal model (images in) is not built yet; {remedy}"
_not_built("multimodal-pipeline", MULTIMODAL, PIPELINE, "use 1 stage", _MULTIMODAL_MESSAGE)
_not_built(
    "multimodal-speculative", MULTIMODAL, SPECULATIVE, "serve without it", _MULTIMODAL_MESSAGE
)
_not_built("multimodal-lora", MULTIMODAL, LORA, "serve without it", _MULTIMODAL_MESSAGE)
_not_built("multimodal-pooling", MULTIMODAL, POOLING, "use --runner generate", _MULTIMODAL_MESSAGE)


def _whole_prompt_rule(name: str, section: str, key: str) -> None:
    """Register: pooling that needs whole prompts (whole_prompt_reason) turns `key` off by
    default and refuses it when asked for."""
    flag = "--" + key.replace("_", "-")
    off = f"--no-{flag[2:]}"

    def check(config: EngineConfig, facts: ConfigFacts) -> str | None:
        reason = whole_prompt_reason(config, facts.pooling)
        if reason is None or not getattr(getattr(config, section), key):
            return None
        return f"{flag}: {reason} needs every prompt token computed in one forward; use {off}"

    def yields(config: EngineConfig, facts: ConfigFacts) -> str | None:
        part = getattr(config, section)
        reason = whole_prompt_reason(config, facts.pooling)
        if reason is None or part.is_user_set(key) or not getattr(part, key):
            return None
        part.set_default(key, False)
        return f"{off}: {reason} needs every prompt token computed in one forward"

    refuses = f"{flag} where the pooling needs whole prompts (CLS, MEAN, an encoder, token-wise)"
    default = f"the pooling runner turns {flag[2:]} off"
    _RULES.append(Rule(name, (POOLING, flag), refuses, off, check, yields, default))


_whole_prompt_rule("pooling-prefix-caching", "cache", "enable_prefix_caching")
_whole_prompt_rule("pooling-chunked-prefill", "scheduler", "enable_chunked_prefill")


# -- compilation -----------------------------------------------------------------------------


@_rule(
    "full-graphs-unbuilt", ("compilation_config.cudagraph_mode FULL",),
    "full graphs of mixed batches (not implemented yet)",
    "FULL_AND_PIECEWISE, FULL_DECODE_ONLY or PIECEWISE",
)  # fmt: skip
def _check_full_graphs(config: EngineConfig, facts: ConfigFacts) -> str | None:
    if config.compilation.cudagraph_mode is not CUDAGraphMode.FULL:
        return None
    return (
        "compilation_config.cudagraph_mode FULL (mixed batches in full graphs) is not "
        "implemented yet: use FULL_AND_PIECEWISE, FULL_DECODE_ONLY or PIECEWISE"
    )


def _check_piecewise(config: EngineConfig, facts: ConfigFacts) -> str | None:
    compilation = config.compilation
    mode = compilation.cudagraph_mode
    if mode not in _PIECEWISE_MODES or compilation.compile_model:
        return None
    return (
        f"compilation_config.cudagraph_mode {mode.value} captures pieces of the compiled "
        "model, but compilation is off: use -O2 or FULL_DECODE_ONLY"
    )


def _compile_for_pieces(config: EngineConfig, facts: ConfigFacts) -> str | None:
    compilation = config.compilation
    mode = compilation.cudagraph_mode
    asked_off = compilation.is_user_set("compile_model") or compilation.is_user_set("level")
    if mode not in _PIECEWISE_MODES or compilation.compile_model or asked_off:
        return None
    compilation.set_default("compile_model", True)
    return (
        f"compilation_config.cudagraph_mode {mode.value}: compiling the model, which the "
        f"platform's default -O{compilation.level} leaves off, to capture its pieces"
    )


_RULES.append(
    Rule(
        "pieces-need-compilation",
        ("compilation_config.cudagraph_mode PIECEWISE", "-O0 / compile_model false"),
        "capturing pieces of a model that is not compiled",
        "-O2 or FULL_DECODE_ONLY",
        _check_piecewise,
        _compile_for_pieces,
        "a default -O level that does not compile yields: the model is compiled",
    )
)


def _eager_only(name: str, feature: str, message: str) -> None:
    """Register: `feature` runs eagerly only; a default -O level yields, an explicit
    compilation or capture is refused."""

    def check(config: EngineConfig, facts: ConfigFacts) -> str | None:
        compilation = config.compilation
        if not (enabled(feature, config) and compiles(compilation)):
            return None
        flag = compile_flag(compilation) or f"-O{compilation.level}"
        return message.format(flag=flag, feature=feature)

    def yields(config: EngineConfig, facts: ConfigFacts) -> str | None:
        compilation = config.compilation
        if not enabled(feature, config) or not compiles(compilation) or compile_flag(compilation):
            return None
        compilation.set_default("compile_model", False)
        compilation.set_default("capture_graphs", False)
        compilation.set_default("cudagraph_mode", CUDAGraphMode.NONE)
        return (
            f"{feature}: running eagerly; the platform's default -O{compilation.level} would "
            "compile the model or capture graphs, which it does not support yet"
        )

    refuses = f"compiling the model or capturing graphs with {feature}"
    default = "the platform's default -O level yields: the engine runs eagerly"
    remedy = "-O0 or --enforce-eager"
    _RULES.append(Rule(name, (COMPILED, feature), refuses, remedy, check, yields, default))


_UNCOMPILED_MESSAGE = (
    "{flag} compiles the model or captures graphs, which {feature} does not support yet: "
    "use -O0 or --enforce-eager"
)
_eager_only(
    "pooling-eager",
    POOLING,
    "{flag}: pooling models (--runner pooling) run eagerly; use -O0 or --enforce-eager",
)
_eager_only("lora-eager", LORA, _UNCOMPILED_MESSAGE)
# A step's forward takes token embeddings with the items' merged in, not token ids.
_eager_only("multimodal-eager", MULTIMODAL, _UNCOMPILED_MESSAGE)
_eager_only("pipeline-eager", PIPELINE, _UNCOMPILED_MESSAGE)
# The experts' all-to-all exchange has sizes that depend on each step's routing.
_eager_only("experts-across-engines-eager", EXPERTS_ACROSS_ENGINES, _UNCOMPILED_MESSAGE)
# Sleep regrows the weights' and the KV cache's storages: captured graphs would keep reading
# the old addresses (core.worker.sleep_mode).
_eager_only("sleep-mode-eager", SLEEP_MODE, _UNCOMPILED_MESSAGE)

_SLEEP_MESSAGE = "{flag} with sleep mode (--enable-sleep-mode) is not built yet; {remedy}"
# A draft model's weights are not the target's: sleep would leave them in memory.
_not_built("sleep-mode-speculative", SLEEP_MODE, SPECULATIVE, "drop one of them", _SLEEP_MESSAGE)
# A sleeping engine would leave the other engines waiting in their lock-step forwards.
_not_built(
    "sleep-mode-experts-across-engines", SLEEP_MODE, EXPERTS_ACROSS_ENGINES, "drop one of them",
    _SLEEP_MESSAGE,
)  # fmt: skip

# -- batch-invariant mode --------------------------------------------------------------------

# torch.compile fuses the model's ops into kernels of its own, whose reduction orders are
# inductor's choice per shape (core.batch_invariant).
_eager_only("batch-invariant-eager", BATCH_INVARIANT, _UNCOMPILED_MESSAGE)
_BATCH_INVARIANT_MESSAGE = (
    "{flag} with batch-invariant mode (--batch-invariant) is not built yet: its kernels sum "
    "over the rows of a batch in an order that depends on the batch; {remedy}"
)
# core-lora's shrink and expand multiply a step's rows together, by slot.
_not_built(
    "batch-invariant-lora", BATCH_INVARIANT, LORA, "serve without one of them",
    _BATCH_INVARIANT_MESSAGE,
)  # fmt: skip


@_rule(
    "batch-invariant-tensor-parallel", (BATCH_INVARIANT, "--tensor-parallel-size > 2"),
    "batch-invariant mode over more than two tensor-parallel ranks",
    "--tensor-parallel-size 1 or 2 (or data parallelism)",
)  # fmt: skip
def _check_invariant_ranks(config: EngineConfig, facts: ConfigFacts) -> str | None:
    # Two ranks' shares add in either order to the same bits; three or more are summed by
    # the all-reduce in segments whose order depends on the tensor's size, so on the batch.
    size = config.parallel.tensor_parallel_size
    if not config.model.batch_invariant or size <= 2:
        return None
    return (
        f"--batch-invariant with --tensor-parallel-size {size}: the all-reduce sums more than "
        "two ranks' shares in an order that depends on the batch; use 1 or 2 ranks, or "
        "--data-parallel-size for more engines"
    )


RULES: tuple[Rule, ...] = tuple(_RULES)
