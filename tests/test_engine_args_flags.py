"""Every flag of `core serve` changes what the engine gets, or refuses with an error naming
it: no flag is accepted and then ignored."""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from core.config import UsageContext
from core.engine_args import EngineArgs
from core.entrypoints import headless
from core.entrypoints.cli import serve
from core.entrypoints.openai import api_server
from core.platforms.cpu import CpuPlatform
from core.platforms.interface import Platform

MODEL_MAX_LEN = 256  # the checkpoint's context length the configs are built against


class GraphPlatform(CpuPlatform):
    """A platform that compiles and captures graphs and starts at -O2, as GPUs will."""

    name = "graphs"
    supported_optimization_levels = (0, 1, 2)
    default_optimization_level = 2


@dataclass(frozen=True)
class Case:
    """A non-default value for one `serve` parameter and what it must do.

    `sets` is the dotted path, in what `serve` hands the server (host, port, api_key,
    lora_modules, config), of the value that must differ from a start without the flag; `refuses` is
    the flag a ValueError must name instead.
    """

    argv: tuple[str, ...]
    sets: str | None = None
    refuses: str | None = None
    platform: type[Platform] = CpuPlatform


CASES = {
    "model_tag": Case(("some/model",), sets="config.model.model"),
    "host": Case(("--host", "127.0.0.1"), sets="host"),
    "port": Case(("--port", "8123"), sets="port"),
    "api_key": Case(("--api-key", "secret"), sets="api_key"),
    "lora_modules": Case(("--lora-modules", "sql=/adapters/sql"), sets="lora_modules"),
    "model": Case(("--model", "some/model"), sets="config.model.model"),
    "tokenizer": Case(("--tokenizer", "some/tokenizer"), sets="config.model.tokenizer"),
    "served_model_name": Case(
        ("--served-model-name", "alias"), sets="config.model.served_model_name"
    ),
    "dtype": Case(("--dtype", "float16"), sets="config.model.dtype"),
    "max_model_len": Case(("--max-model-len", "64"), sets="config.model.max_model_len"),
    "quantization": Case(("--quantization", "awq"), sets="config.model.quantization"),
    "seed": Case(("--seed", "7"), sets="config.model.seed"),
    "chat_template": Case(("--chat-template", "{{ messages }}"), sets="config.model.chat_template"),
    "generation_config": Case(
        ("--generation-config", "none"), sets="config.model.generation_config"
    ),
    "max_logprobs": Case(("--max-logprobs", "5"), sets="config.model.max_logprobs"),
    "block_size": Case(("--block-size", "32"), sets="config.cache.block_size"),
    "kv_cache_memory": Case(
        ("--kv-cache-memory", "1GiB"), sets="config.cache.kv_cache_memory_bytes"
    ),
    # Only platforms that profile memory take it (tests/engine/test_device_platform_engine.py).
    "gpu_memory_utilization": Case(
        ("--gpu-memory-utilization", "0.5"), refuses="--gpu-memory-utilization"
    ),
    "enable_prefix_caching": Case(
        ("--no-enable-prefix-caching",), sets="config.cache.enable_prefix_caching"
    ),
    "prefix_caching_hash_algo": Case(
        ("--prefix-caching-hash-algo", "fast"), sets="config.cache.prefix_caching_hash_algo"
    ),
    "kv_cache_dtype": Case(("--kv-cache-dtype", "fp8"), sets="config.cache.kv_cache_dtype"),
    "max_num_seqs": Case(("--max-num-seqs", "8"), sets="config.scheduler.max_num_seqs"),
    "max_num_batched_tokens": Case(
        ("--max-num-batched-tokens", "512"), sets="config.scheduler.max_num_batched_tokens"
    ),
    "long_prefill_token_threshold": Case(
        ("--long-prefill-token-threshold", "32"),
        sets="config.scheduler.long_prefill_token_threshold",
    ),
    "enable_chunked_prefill": Case(
        ("--no-enable-chunked-prefill",), sets="config.scheduler.enable_chunked_prefill"
    ),
    "scheduling_policy": Case(("--scheduling-policy", "priority"), sets="config.scheduler.policy"),
    "tensor_parallel_size": Case(
        ("--tensor-parallel-size", "2"), sets="config.parallel.tensor_parallel_size"
    ),
    "pipeline_parallel_size": Case(
        ("--pipeline-parallel-size", "2"), sets="config.parallel.pipeline_parallel_size"
    ),
    "data_parallel_size": Case(
        ("--data-parallel-size", "2"), sets="config.parallel.data_parallel_size"
    ),
    "data_parallel_size_local": Case(
        ("--data-parallel-size", "2", "--data-parallel-size-local", "1"),
        sets="config.parallel.data_parallel_size_local",
    ),
    "data_parallel_start_rank": Case(
        ("--data-parallel-start-rank", "1"), refuses="--data-parallel-start-rank"
    ),
    "data_parallel_address": Case(
        ("--data-parallel-address", "10.0.0.2"), sets="config.parallel.data_parallel_address"
    ),
    "data_parallel_rpc_port": Case(
        ("--data-parallel-rpc-port", "20000"), sets="config.parallel.data_parallel_rpc_port"
    ),
    "headless": Case(("--headless",), sets="headless"),
    "distributed_executor_backend": Case(
        ("--distributed-executor-backend", "mp"),
        sets="config.parallel.distributed_executor_backend",
    ),
    "device": Case(("--device", "cpu"), sets="config.device.device"),
    "optimization_level": Case(("-O", "1"), sets="config.compilation.compile_model"),
    "compilation_config": Case(
        ("--compilation-config", '{"backend": "eager"}'), sets="config.compilation.backend"
    ),
    # On the CPU eager is what runs anyway; on a platform that compiles, the flag shows.
    "enforce_eager": Case(
        ("--enforce-eager",), sets="config.compilation.capture_graphs", platform=GraphPlatform
    ),
    "attention_backend": Case(
        ("--attention-backend", "torch_ref"), sets="config.components.attention_backend"
    ),
    "attention_backend_config": Case(
        ("--attention-backend-config", '{"k": 1}'),
        sets="config.components.attention_backend_config",
    ),
    "sampler": Case(("--sampler", "default"), sets="config.components.sampler"),
    "sampler_config": Case(
        ("--sampler-config", '{"k": 1}'), sets="config.components.sampler_config"
    ),
    "kv_transfer_config": Case(
        ("--kv-transfer-config", '{"kv_connector": "x", "kv_role": "kv_both"}'),
        refuses="--kv-transfer-config",
    ),
    "speculative_config": Case(
        ("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'),
        sets="config.speculative",
    ),
    "enable_lora": Case(("--enable-lora",), sets="config.lora"),
    # Alone, LoRA's limits are refused (they would be ignored); with it they set the config.
    "max_loras": Case(("--max-loras", "2"), refuses="--max-loras"),
    "max_lora_rank": Case(("--max-lora-rank", "8"), refuses="--max-lora-rank"),
    "max_cpu_loras": Case(("--max-cpu-loras", "4"), refuses="--max-cpu-loras"),
    "lora_implementation": Case(
        ("--lora-implementation", "other"), refuses="--lora-implementation"
    ),
}


@pytest.fixture
def served(monkeypatch):
    """`serve(argv, platform)`: what `core serve ARGV` hands the server, plus the config
    (or the ValueError's message) its EngineArgs give on `platform`."""
    calls: list[SimpleNamespace] = []

    async def fake_server(engine_args, host, port, api_key, lora_modules):
        calls.append(
            SimpleNamespace(
                engine_args=engine_args,
                host=host,
                port=port,
                api_key=api_key,
                lora_modules=lora_modules,
                headless=False,
            )
        )

    def fake_headless(engine_args) -> int:
        calls.append(SimpleNamespace(engine_args=engine_args, headless=True))
        return 0

    def run(argv: tuple[str, ...], platform: type[Platform]) -> SimpleNamespace:
        result = CliRunner().invoke(serve, list(argv), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        call = calls.pop()
        try:
            call.config = call.engine_args.create_engine_config(
                platform(), model_max_len=MODEL_MAX_LEN, usage=UsageContext.SERVING
            )
        except ValueError as exc:
            call.error = str(exc)
        return call

    monkeypatch.setattr(api_server, "serve", fake_server)
    monkeypatch.setattr(headless, "run_headless", fake_headless)
    core_logger = logging.getLogger("core")
    level = core_logger.level  # serve raises it for the server's startup messages
    yield run
    core_logger.setLevel(level)


def test_every_serve_flag_changes_config_or_refuses(served):
    names = [param.name for param in serve.params]
    assert sorted(names) == sorted(CASES), "every serve parameter needs exactly one case"
    failures = []
    for name in names:
        case = CASES[name]
        default, given = served((), case.platform), served(case.argv, case.platform)
        if case.refuses is not None:
            error = getattr(given, "error", None)
            if error is None or case.refuses not in error:
                failures.append(f"{name}: expected a ValueError naming {case.refuses}, got {error}")
        elif hasattr(given, "error"):
            failures.append(f"{name}: refused unexpectedly: {given.error}")
        else:
            owned = operator.attrgetter(case.sets)
            if owned(given) == owned(default):
                failures.append(f"{name}: {case.sets} stayed {owned(default)!r}")
    assert not failures, "\n".join(failures)


def config_on(platform: Platform, **kwargs) -> object:
    return EngineArgs(**kwargs).create_engine_config(platform).compilation


def test_enforce_eager_turns_off_what_the_platforms_default_level_turns_on():
    default = config_on(GraphPlatform())
    assert (default.level, default.compile_model, default.capture_graphs) == (2, True, True)
    eager = config_on(GraphPlatform(), enforce_eager=True)
    assert (eager.level, eager.compile_model, eager.capture_graphs) == (2, False, False)


def test_enforce_eager_is_accepted_on_cpu_where_eager_is_what_runs():
    eager = config_on(CpuPlatform(), enforce_eager=True)
    assert (eager.level, eager.compile_model, eager.capture_graphs) == (0, False, False)
    assert eager.is_user_set("compile_model") and eager.is_user_set("capture_graphs")


def test_explicit_flags_win_over_level_defaults():
    one = config_on(GraphPlatform(), optimization_level=1)
    assert (one.compile_model, one.capture_graphs) == (True, False)
    eager_one = config_on(GraphPlatform(), optimization_level=1, enforce_eager=True)
    assert (eager_one.compile_model, eager_one.capture_graphs) == (False, False)
    zero = config_on(GraphPlatform(), optimization_level=0)
    assert (zero.compile_model, zero.capture_graphs) == (False, False)


def test_a_level_the_platform_lacks_is_refused_with_what_it_supports():
    message = (
        "-O3 is reserved (no optimizations defined); the graphs platform supports -O0, -O1, -O2"
    )
    with pytest.raises(ValueError) as refused:
        config_on(GraphPlatform(), optimization_level=3)
    assert str(refused.value) == message


def test_the_uni_mp_and_ray_executors_are_accepted():
    for backend in ("uni", "mp", "ray"):
        args = EngineArgs(distributed_executor_backend=backend)
        assert args.create_engine_config(CpuPlatform()).parallel.distributed_executor_backend == (
            backend
        )


def test_kv_transfer_config_is_parsed_then_refused():
    with pytest.raises(ValueError, match="--kv-transfer-config must be a JSON object"):
        EngineArgs(kv_transfer_config="{oops").create_engine_config(CpuPlatform())
    with pytest.raises(ValueError, match="^--kv-transfer-config: no KV connector is wired"):
        EngineArgs(kv_transfer_config='{"kv_connector": "x"}').create_engine_config(CpuPlatform())
