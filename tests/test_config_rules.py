"""core.config_rules: every rule refuses an explicit conflict naming both flags, and where a
side can be a default, that default yields (logged) so that the start goes on."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from checkpoint_pooling import BERT, DECODER, LAST_TOKEN_EMBEDDER

from core.config import CUDAGraphMode, EngineConfig, UsageContext
from core.config_rules import RULES
from core.engine_args import EngineArgs
from core.platforms.cpu import CpuPlatform

NGRAM = '{"method": "ngram", "num_speculative_tokens": 2}'
EXPERTS_ACROSS_ENGINES = {"enable_expert_parallel": True, "data_parallel_size": 2}
MULTIMODAL = {"multimodal": True}  # the checkpoint's model takes images


class GraphPlatform(CpuPlatform):
    """Compiles and captures graphs, and starts at -O2 as the GPU platforms do."""

    name = "graphs"
    supported_optimization_levels = (0, 1, 2)
    default_optimization_level = 2


class EagerGraphPlatform(GraphPlatform):
    """Could compile and capture, but starts eagerly."""

    default_optimization_level = 0


class ProfilingPlatform(CpuPlatform):
    name = "profiling"
    memory_profiling = True


@dataclass(frozen=True)
class Case:
    """EngineArgs keywords `flags`, built on `platform` for a model described by `model`
    (create_engine_config's keywords)."""

    flags: dict[str, Any]
    platform: type = CpuPlatform
    model: dict[str, Any] = field(default_factory=dict)

    def build(self) -> EngineConfig:
        return EngineArgs(**self.flags).create_engine_config(self.platform(), **self.model)


# rule -> (a conflict asked for explicitly, what its message must name: both flags at least)
REFUSED: dict[str, tuple[Case, tuple[str, ...]]] = {
    "pipeline-speculative": (
        Case({"pipeline_parallel_size": 2, "speculative_config": NGRAM}),
        ("--speculative-config", "--pipeline-parallel-size", "use 1 stage"),
    ),
    "pipeline-lora": (
        Case({"pipeline_parallel_size": 2, "enable_lora": True}),
        ("--enable-lora", "--pipeline-parallel-size", "use 1 stage"),
    ),
    "data-parallel-local-ranks": (
        Case(
            {"data_parallel_size": 2, "data_parallel_start_rank": 1, "data_parallel_size_local": 2}
        ),
        ("--data-parallel-start-rank 1", "--data-parallel-size-local 2", "--data-parallel-size 2"),
    ),
    "ray-installed": (
        Case({"distributed_executor_backend": "ray"}),
        ("--distributed-executor-backend ray", "pip install 'core[ray]'"),
    ),
    "one-worker-one-rank": (
        Case({"distributed_executor_backend": "uni", "tensor_parallel_size": 2}),
        ("--distributed-executor-backend uni", "--tensor-parallel-size 2", "use mp"),
    ),
    "kv-transfer-names-a-connector": (
        Case({"kv_transfer_config": '{"kv_role": "kv_both"}'}),
        ("--kv-transfer-config", "kv_connector is required"),
    ),
    "kv-transfer-no-pipeline": (
        Case({"kv_transfer_config": '{"kv_connector": "x"}', "pipeline_parallel_size": 2}),
        ("--kv-transfer-config", "--pipeline-parallel-size 2", "--pipeline-parallel-size 1"),
    ),
    "async-scheduling-pipeline": (
        Case({"async_scheduling": True, "pipeline_parallel_size": 2}),
        ("--async-scheduling", "--pipeline-parallel-size > 1", "--no-async-scheduling"),
    ),
    "async-scheduling-kv-transfer": (
        Case({"async_scheduling": True, "kv_transfer_config": '{"kv_connector": "offload"}'}),
        ("--async-scheduling", "--kv-transfer-config", "--no-async-scheduling"),
    ),
    "async-scheduling-experts-across-engines": (
        Case({**EXPERTS_ACROSS_ENGINES, "async_scheduling": True}),
        ("--async-scheduling", "--data-parallel-size > 1", "--no-async-scheduling"),
    ),  # fmt: skip
    "eplb-needs-expert-parallel": (
        Case({"enable_eplb": True}),
        ("--enable-eplb", "--enable-expert-parallel"),
    ),
    "experts-across-engines-executor": (
        Case({**EXPERTS_ACROSS_ENGINES, "data_parallel_rpc_port": 65534}),
        ("--data-parallel-rpc-port 65534", "--data-parallel-size", "65538"),
    ),  # fmt: skip
    "experts-across-engines-pipeline": (
        Case({**EXPERTS_ACROSS_ENGINES, "pipeline_parallel_size": 2}),
        ("--pipeline-parallel-size > 1", "lock-step", "use 1 stage"),
    ),  # fmt: skip
    "experts-across-engines-speculative": (
        Case({**EXPERTS_ACROSS_ENGINES, "speculative_config": NGRAM}),
        ("--speculative-config", "--data-parallel-size > 1"),
    ),  # fmt: skip
    "experts-across-engines-kv-transfer": (
        Case({**EXPERTS_ACROSS_ENGINES, "kv_transfer_config": '{"kv_connector": "offload"}'}),
        ("--kv-transfer-config", "--data-parallel-size > 1"),
    ),  # fmt: skip
    "lora-options-need-lora": (
        Case({"max_lora_rank": 8, "lora_implementation": "x"}),
        ("--max-lora-rank, --lora-implementation", "--enable-lora"),
    ),
    "lora-host-slots": (
        Case({"enable_lora": True, "max_loras": 4, "max_cpu_loras": 2}),
        ("max_cpu_loras (2)", "max_loras (4)"),
    ),
    "one-kv-budget-flag": (
        Case({"kv_cache_memory_bytes": 4096, "kv_cache_memory": "1GiB"}),
        ("--kv-cache-memory-bytes", "--kv-cache-memory ", "give one"),
    ),
    "one-kv-budget": (
        Case({"gpu_memory_utilization": 0.5, "kv_cache_memory": "1GiB"}, ProfilingPlatform),
        ("--gpu-memory-utilization", "--kv-cache-memory", "give one"),
    ),
    "model-context": (
        Case({"max_model_len": 512}, model={"model_max_len": 256}),
        ("max_model_len 512", "the model's context length 256"),
    ),
    "burst-covers-budget": (
        Case(
            {"max_num_batched_tokens": 128, "burst_token_budget": 64}, model={"model_max_len": 256}
        ),
        ("burst_token_budget 64", "max_num_batched_tokens 128"),
    ),
    "whole-prompt-budget": (
        Case(
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 128},
            model={"model_max_len": 256},
        ),
        ("max_num_batched_tokens 128", "max_model_len 256", "chunked prefill is disabled"),
    ),
    "pipeline-stages": (
        Case({"pipeline_parallel_size": 3}, model={"num_layers": 2}),
        ("--pipeline-parallel-size 3", "2 decoder layers"),
    ),
    "generate-needs-head": (
        Case({"runner": "generate"}, model={"pooling": BERT}),
        ("--runner generate", "BertModel", "--runner pooling"),
    ),
    "pooler-config-pools": (
        Case({"pooler_config": "{}"}, model={"pooling": DECODER}),
        ("--pooler-config", "--runner pooling"),
    ),
    "pooling-speculative": (
        Case({"speculative_config": NGRAM}, model={"pooling": LAST_TOKEN_EMBEDDER}),
        ("--speculative-config", "--runner pooling"),
    ),
    "pooling-lora": (
        Case({"enable_lora": True}, model={"pooling": BERT}),
        ("--enable-lora", "--runner pooling"),
    ),
    "pooling-pipeline": (
        Case({"pipeline_parallel_size": 2}, model={"pooling": LAST_TOKEN_EMBEDDER}),
        ("--pipeline-parallel-size > 1", "--runner pooling", "use 1 stage"),
    ),
    "pooling-prefix-caching": (
        Case({"enable_prefix_caching": True}, model={"pooling": BERT}),
        ("--enable-prefix-caching", "BertModel's bidirectional", "--no-enable-prefix-caching"),
    ),
    "pooling-chunked-prefill": (
        Case({"enable_chunked_prefill": True}, model={"pooling": BERT}),
        ("--enable-chunked-prefill", "BertModel's bidirectional", "--no-enable-chunked-prefill"),
    ),
    "full-graphs-unbuilt": (
        Case({"compilation_config": {"cudagraph_mode": "FULL"}}, GraphPlatform),
        ("cudagraph_mode FULL", "FULL_DECODE_ONLY"),
    ),
    "pieces-need-compilation": (
        Case(
            {"optimization_level": 0, "compilation_config": {"cudagraph_mode": "PIECEWISE"}},
            GraphPlatform,
        ),
        ("cudagraph_mode PIECEWISE", "compilation is off", "use -O2"),
    ),
    "multimodal-pipeline": (
        Case({"pipeline_parallel_size": 2}, model=MULTIMODAL),
        ("--pipeline-parallel-size > 1", "a multimodal model", "use 1 stage"),
    ),
    "multimodal-speculative": (
        Case({"speculative_config": NGRAM}, model=MULTIMODAL),
        ("--speculative-config", "a multimodal model"),
    ),
    "multimodal-lora": (
        Case({"enable_lora": True}, model=MULTIMODAL),
        ("--enable-lora", "a multimodal model"),
    ),
    "multimodal-pooling": (
        Case({"runner": "pooling"}, model=MULTIMODAL),
        ("--runner pooling", "a multimodal model", "--runner generate"),
    ),
    "multimodal-eager": (
        Case({"optimization_level": 1}, GraphPlatform, model=MULTIMODAL),
        ("-O1", "a multimodal model", "use -O0 or --enforce-eager"),
    ),
    "pooling-eager": (
        Case({"optimization_level": 2}, GraphPlatform, model={"pooling": LAST_TOKEN_EMBEDDER}),
        ("-O2", "--runner pooling", "use -O0 or --enforce-eager"),
    ),
    "lora-eager": (
        Case({"optimization_level": 2, "enable_lora": True}, GraphPlatform),
        ("-O2", "--enable-lora", "use -O0 or --enforce-eager"),
    ),
    "pipeline-eager": (
        Case({"optimization_level": 1, "pipeline_parallel_size": 2}, GraphPlatform),
        ("-O1", "--pipeline-parallel-size > 1", "use -O0 or --enforce-eager"),
    ),
    "experts-across-engines-eager": (
        Case({"optimization_level": 1, **EXPERTS_ACROSS_ENGINES}, GraphPlatform),
        ("-O1", "--enable-expert-parallel with --data-parallel-size > 1", "use -O0"),
    ),
    "sleep-mode-eager": (
        Case({"optimization_level": 2, "enable_sleep_mode": True}, GraphPlatform),
        ("-O2", "--enable-sleep-mode", "use -O0 or --enforce-eager"),
    ),
    "sleep-mode-speculative": (
        Case({"enable_sleep_mode": True, "speculative_config": NGRAM}),
        ("--speculative-config", "--enable-sleep-mode", "drop one of them"),
    ),
    "sleep-mode-experts-across-engines": (
        Case({"enable_sleep_mode": True, **EXPERTS_ACROSS_ENGINES}),
        ("--enable-expert-parallel with --data-parallel-size > 1", "--enable-sleep-mode"),
    ),
    "batch-invariant-eager": (
        Case({"optimization_level": 1, "batch_invariant": True}, GraphPlatform),
        ("-O1", "--batch-invariant", "use -O0 or --enforce-eager"),
    ),
    "batch-invariant-tensor-parallel": (
        Case({"batch_invariant": True, "tensor_parallel_size": 4}),
        ("--batch-invariant", "--tensor-parallel-size 4", "use 1 or 2 ranks"),
    ),
    "batch-invariant-lora": (
        Case({"batch_invariant": True, "enable_lora": True}),
        ("--enable-lora", "--batch-invariant", "serve without one of them"),
    ),
}


def _eager(config: EngineConfig) -> bool:
    compilation = config.compilation
    return (compilation.compile_model, compilation.capture_graphs) == (False, False) and (
        compilation.cudagraph_mode is CUDAGraphMode.NONE
    )


# rule -> (a start where one side of the conflict is a default, what the default became)
YIELDED: dict[str, tuple[Case, Callable[[EngineConfig], bool]]] = {
    "one-worker-one-rank": (
        Case({"tensor_parallel_size": 2}),
        lambda config: config.parallel.distributed_executor_backend == "mp",
    ),
    "lora-host-slots": (
        Case({"enable_lora": True, "max_loras": 4}),
        lambda config: config.lora.max_cpu_loras == 4,
    ),
    "model-context": (
        Case({}, model={"model_max_len": 256}),
        lambda config: config.model.max_model_len == 256,
    ),
    "burst-covers-budget": (
        # The offline default budget (2048) gives way to the burst budget the user set.
        Case({"burst_token_budget": 1024}, model={"model_max_len": 8192}),
        lambda config: config.scheduler.max_num_batched_tokens == 1024,
    ),
    "whole-prompt-budget": (
        Case({"enable_chunked_prefill": False}, model={"model_max_len": 4096}),
        lambda config: config.scheduler.max_num_batched_tokens == 4096,
    ),
    "pooling-prefix-caching": (
        Case({}, model={"pooling": BERT}),
        lambda config: config.cache.enable_prefix_caching is False,
    ),
    "pooling-chunked-prefill": (
        Case({}, model={"pooling": BERT}),
        lambda config: config.scheduler.enable_chunked_prefill is False,
    ),
    "pieces-need-compilation": (
        Case({"compilation_config": {"cudagraph_mode": "PIECEWISE"}}, EagerGraphPlatform),
        lambda config: config.compilation.compile_model is True,
    ),
    "pooling-eager": (Case({}, GraphPlatform, model={"pooling": LAST_TOKEN_EMBEDDER}), _eager),
    "lora-eager": (Case({"enable_lora": True}, GraphPlatform), _eager),
    "multimodal-eager": (Case({}, GraphPlatform, model=MULTIMODAL), _eager),
    "pipeline-eager": (Case({"pipeline_parallel_size": 2}, GraphPlatform), _eager),
    "experts-across-engines-eager": (Case(EXPERTS_ACROSS_ENGINES, GraphPlatform), _eager),
    "sleep-mode-eager": (Case({"enable_sleep_mode": True}, GraphPlatform), _eager),
    "batch-invariant-eager": (Case({"batch_invariant": True}, GraphPlatform), _eager),
}


def test_every_rule_has_a_refused_case_and_every_default_a_yielding_one():
    assert sorted(REFUSED) == sorted(rule.name for rule in RULES)
    assert sorted(YIELDED) == sorted(rule.name for rule in RULES if rule.default)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_explicit_conflict_is_refused_naming_both_flags(name, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(  # Ray may be installed here: the rule is about a machine without it
        importlib.util, "find_spec", lambda n, *a: None if n == "ray" else real_find_spec(n, *a)
    )
    case, names = REFUSED[name]
    with pytest.raises(ValueError) as refused:
        case.build()
    missing = [part for part in names if part not in str(refused.value)]
    assert not missing, f"{name}: {refused.value} does not name {missing}"


@pytest.mark.parametrize("name", sorted(YIELDED))
def test_a_default_on_one_side_yields_and_the_start_goes_on(name):
    case, became = YIELDED[name]
    assert became(case.build()), name


@pytest.mark.parametrize("flags", [{"enable_lora": True}, {"pipeline_parallel_size": 2}])
def test_a_default_level_that_yields_says_why_at_info(flags, caplog):
    with caplog.at_level(logging.INFO, logger="core.config_rules"):
        Case(flags, GraphPlatform).build()
    assert "running eagerly; the platform's default -O2" in caplog.text


def test_compilation_asked_through_its_own_key_is_refused_naming_that_key():
    flags = {"enable_lora": True, "compilation_config": {"compile_model": True}}
    with pytest.raises(ValueError, match="^compilation_config.compile_model True compiles"):
        Case(flags, GraphPlatform).build()


def test_explicitly_no_graphs_leaves_the_default_compilation_to_yield():
    flags = {"enable_lora": True, "compilation_config": {"cudagraph_mode": "NONE"}}
    assert _eager(Case(flags, GraphPlatform).build())


def test_the_platforms_burst_budget_yields_to_a_larger_step_budget():
    config = EngineArgs(max_num_seqs=10000).create_engine_config(
        CpuPlatform(), model_max_len=8192, usage=UsageContext.SERVING
    )
    assert config.scheduler.max_num_batched_tokens == 10000
    assert config.scheduler.burst_token_budget is None


@pytest.mark.parametrize("declared", [tuple, lambda found: tuple(reversed(found))])
def test_both_kv_budget_flags_are_refused_whatever_their_declaration_order(declared, monkeypatch):
    from core import engine_args

    monkeypatch.setattr(engine_args, "fields", lambda args: declared(dataclasses.fields(args)))
    case = Case({"kv_cache_memory": "1GiB", "kv_cache_memory_bytes": 4096})
    with pytest.raises(ValueError, match="^--kv-cache-memory-bytes and --kv-cache-memory set"):
        case.build()


def test_a_hooks_world_size_derives_the_executor_as_a_flags_would():
    def two_ranks(config):
        config.parallel.tensor_parallel_size = 2

    hooks = SimpleNamespace(hook=SimpleNamespace(core_adjust_config=two_ranks))
    config = EngineArgs().create_engine_config(CpuPlatform(), hooks)
    assert config.parallel.distributed_executor_backend == "mp"


def test_a_model_with_as_many_layers_as_stages_is_accepted():
    config = Case({"pipeline_parallel_size": 2}, model={"num_layers": 2}).build()
    assert config.parallel.pipeline_parallel_size == 2


def test_eplb_options_without_eplb_are_refused_naming_the_flag():
    args = EngineArgs(enable_expert_parallel=True, eplb_config={"window_size": 10})
    with pytest.raises(ValueError, match="--eplb-config: its options need --enable-eplb"):
        args.create_engine_config(CpuPlatform())


def test_an_unknown_eplb_key_is_refused_naming_it():
    args = EngineArgs(enable_expert_parallel=True, enable_eplb=True,
                      eplb_config={"window": 10})  # fmt: skip
    with pytest.raises(ValueError, match="window"):
        args.create_engine_config(CpuPlatform())


def test_engines_sharing_experts_refuse_the_ray_executor(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(  # as if Ray were installed: the refusal is not about installing it
        importlib.util, "find_spec", lambda n, *a: object() if n == "ray" else real_find_spec(n, *a)
    )
    case = Case({**EXPERTS_ACROSS_ENGINES, "distributed_executor_backend": "ray"})
    with pytest.raises(ValueError, match="ray is not available with --enable-expert-parallel"):
        case.build()


def test_core_batch_invariant_starts_engines_in_the_mode_unless_the_flag_says(monkeypatch):
    monkeypatch.setenv("CORE_BATCH_INVARIANT", "1")
    assert Case({}).build().model.batch_invariant is True
    assert Case({"batch_invariant": False}).build().model.batch_invariant is False
    monkeypatch.delenv("CORE_BATCH_INVARIANT")
    assert Case({}).build().model.batch_invariant is False


def test_batch_invariant_mode_is_refused_on_a_platform_whose_kernels_do_not_serve_it():
    class PlainPlatform(CpuPlatform):
        name = "plain"
        batch_invariant = False

    with pytest.raises(ValueError, match=r"--batch-invariant: the plain platform's kernels"):
        Case({"batch_invariant": True}, PlainPlatform).build()
