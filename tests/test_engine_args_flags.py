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
    lora_modules, frontend, config), of the value that must differ from a start without the
    flag; `refuses` is the flag a ValueError must name instead.
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
    "revision": Case(("--revision", "v1.0"), sets="config.model.revision"),
    "download_dir": Case(("--download-dir", "/models/hf"), sets="config.model.download_dir"),
    "load_format": Case(("--load-format", "gguf"), sets="config.model.load_format"),
    "trust_remote_code": Case(("--trust-remote-code",), sets="config.model.trust_remote_code"),
    "runner": Case(("--runner", "pooling"), sets="config.model.runner"),
    "pooler_config": Case(("--pooler-config", '{"pooling_type": "MEAN"}'), sets="config.pooler"),
    "limit_mm_per_prompt": Case(
        ("--limit-mm-per-prompt", '{"image": 2}'), sets="config.model.limit_mm_per_prompt"
    ),
    "allowed_local_media_path": Case(
        ("--allowed-local-media-path", "/srv/images"), sets="config.model.allowed_local_media_path"
    ),
    "io_processor_plugin": Case(
        ("--io-processor-plugin", "my_plugin"), sets="config.model.io_processor_plugin"
    ),
    "enable_sleep_mode": Case(("--enable-sleep-mode",), sets="config.model.enable_sleep_mode"),
    "batch_invariant": Case(("--batch-invariant",), sets="config.model.batch_invariant"),
    "kv_cache_memory_bytes": Case(
        ("--kv-cache-memory-bytes", "1000000"), sets="config.cache.kv_cache_memory_bytes"
    ),
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
    "burst_token_budget": Case(
        ("--burst-token-budget", "4096"), sets="config.scheduler.burst_token_budget"
    ),
    "long_prefill_token_threshold": Case(
        ("--long-prefill-token-threshold", "32"),
        sets="config.scheduler.long_prefill_token_threshold",
    ),
    "enable_chunked_prefill": Case(
        ("--no-enable-chunked-prefill",), sets="config.scheduler.enable_chunked_prefill"
    ),
    "scheduling_policy": Case(("--scheduling-policy", "priority"), sets="config.scheduler.policy"),
    "async_scheduling": Case(("--async-scheduling",), sets="config.scheduler.async_scheduling"),
    "max_num_encoder_input_tokens": Case(
        ("--max-num-encoder-input-tokens", "256"),
        sets="config.scheduler.max_num_encoder_input_tokens",
    ),
    "encoder_cache_size": Case(
        ("--encoder-cache-size", "512"), sets="config.scheduler.encoder_cache_size"
    ),
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
    "allowed_origins": Case(
        ("--allowed-origins", "https://a.example"), sets="frontend.allowed_origins"
    ),
    "allowed_methods": Case(("--allowed-methods", "POST"), sets="frontend.allowed_methods"),
    "allowed_headers": Case(
        ("--allowed-headers", "Authorization"), sets="frontend.allowed_headers"
    ),
    "allow_credentials": Case(("--allow-credentials",), sets="frontend.allow_credentials"),
    "root_path": Case(("--root-path", "/llm"), sets="frontend.root_path"),
    # Both TLS files exist (any readable file stands in: only their presence is checked here).
    "ssl_keyfile": Case(
        ("--ssl-keyfile", __file__, "--ssl-certfile", __file__), sets="frontend.ssl_keyfile"
    ),
    "ssl_certfile": Case(
        ("--ssl-keyfile", __file__, "--ssl-certfile", __file__), sets="frontend.ssl_certfile"
    ),
    "uvicorn_log_level": Case(
        ("--uvicorn-log-level", "warning"), sets="frontend.uvicorn_log_level"
    ),
    "enable_log_requests": Case(("--enable-log-requests",), sets="frontend.enable_log_requests"),
    # Alone it is refused (nothing would be logged): see test_max_log_len_alone_is_refused.
    "max_log_len": Case(
        ("--enable-log-requests", "--max-log-len", "40"), sets="frontend.max_log_len"
    ),
    "disable_log_stats": Case(("--disable-log-stats",), sets="frontend.disable_log_stats"),
    "enable_tokenizer_info_endpoint": Case(
        ("--enable-tokenizer-info-endpoint",), sets="frontend.enable_tokenizer_info_endpoint"
    ),
    "enable_server_load_tracking": Case(
        ("--enable-server-load-tracking",), sets="frontend.enable_server_load_tracking"
    ),
    "enable_force_include_usage": Case(
        ("--enable-force-include-usage",), sets="frontend.enable_force_include_usage"
    ),
    "enable_prompt_tokens_details": Case(
        ("--enable-prompt-tokens-details",), sets="frontend.enable_prompt_tokens_details"
    ),
    "trust_request_chat_template": Case(
        ("--trust-request-chat-template",), sets="frontend.trust_request_chat_template"
    ),
    "chat_template_content_format": Case(
        ("--chat-template-content-format", "openai"), sets="frontend.chat_template_content_format"
    ),
    "max_request_body_bytes": Case(
        ("--max-request-body-bytes", "1000"), sets="frontend.max_request_body_bytes"
    ),
    "max_sequences_per_request": Case(
        ("--max-sequences-per-request", "64"), sets="frontend.max_sequences_per_request"
    ),
    "shutdown_timeout": Case(("--shutdown-timeout", "2.5"), sets="frontend.shutdown_timeout"),
    # Without --api-key it is refused before the engine starts: see test_auth.py.
    "metrics_without_api_key": Case(
        ("--api-key", "k", "--metrics-without-api-key"), sets="frontend.metrics_without_api_key"
    ),
    # Alone it is refused (no parser to read calls with): see test_tool_calling.py.
    "enable_auto_tool_choice": Case(
        ("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
        sets="tool_calling.enable_auto_tool_choice",
    ),
    "tool_call_parser": Case(("--tool-call-parser", "hermes"), sets="tool_calling.parser_class"),
    "distributed_executor_backend": Case(
        ("--distributed-executor-backend", "mp"),
        sets="config.parallel.distributed_executor_backend",
    ),
    "enable_expert_parallel": Case(
        ("--enable-expert-parallel",), sets="config.parallel.enable_expert_parallel"
    ),
    # Without expert parallelism EPLB and its options are refused (rule eplb-needs-...).
    "enable_eplb": Case(("--enable-eplb",), refuses="--enable-eplb"),
    "eplb_config": Case(("--eplb-config", '{"window_size": 10}'), refuses="--eplb-config"),
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
    "logits_processors": Case(
        ("--logits-processors", "core.sample.logit_softcap:SoftcapLogitsProcessor", "b.c:D"),
        sets="config.components.logits_processors",
    ),
    "kv_transfer_config": Case(
        ("--kv-transfer-config", '{"kv_connector": "x", "kv_role": "kv_both"}'),
        sets="config.kv_transfer",
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
    "metrics_prefix": Case(
        ("--metrics-prefix", "core"), sets="config.observability.metrics_prefix"
    ),
    "reasoning_parser": Case(
        ("--reasoning-parser", "deepseek_r1"), sets="config.structured_outputs.reasoning_parser"
    ),
}


@pytest.fixture
def served(monkeypatch):
    """`serve(argv, platform)`: what `core serve ARGV` hands the server, plus the config
    (or the ValueError's message) its EngineArgs give on `platform`."""
    calls: list[SimpleNamespace] = []

    async def fake_server(
        engine_args, host, port, api_key, lora_modules, frontend, tool_calling=None
    ):
        calls.append(
            SimpleNamespace(
                engine_args=engine_args,
                host=host,
                port=port,
                api_key=api_key,
                lora_modules=lora_modules,
                frontend=frontend,
                tool_calling=tool_calling,
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


def test_kv_transfer_config_is_parsed_with_vllms_keys_and_needs_a_connector():
    with pytest.raises(ValueError, match="--kv-transfer-config must be a JSON object"):
        EngineArgs(kv_transfer_config="{oops").create_engine_config(CpuPlatform())
    with pytest.raises(ValueError, match="^--kv-transfer-config: kv_connector is required"):
        EngineArgs(kv_transfer_config='{"kv_role": "kv_both"}').create_engine_config(CpuPlatform())
    config = EngineArgs(
        kv_transfer_config='{"kv_connector": "offload", "kv_role": "kv_both", '
        '"kv_connector_extra_config": {"cpu_bytes": 1024}}'
    ).create_engine_config(CpuPlatform())
    transfer = config.kv_transfer
    assert (transfer.kv_connector, transfer.kv_role) == ("offload", "kv_both")
    assert transfer.kv_connector_extra_config == {"cpu_bytes": 1024}


def test_kv_cache_memory_bytes_counts_bytes_as_vllm_does():
    def budget(**kwargs) -> int | None:
        return EngineArgs(**kwargs).create_engine_config(CpuPlatform()).cache.kv_cache_memory_bytes

    assert budget(kv_cache_memory_bytes="3000000") == 3_000_000  # bare: bytes, not GiB
    assert budget(kv_cache_memory_bytes=4096) == 4096
    assert budget(kv_cache_memory_bytes="2MiB") == 2 * 1024 * 1024
    assert budget(kv_cache_memory="2") == 2 * 1024**3  # --kv-cache-memory: bare is GiB


def test_kv_cache_memory_and_kv_cache_memory_bytes_together_are_refused():
    with pytest.raises(ValueError, match="--kv-cache-memory-bytes and --kv-cache-memory"):
        EngineArgs(kv_cache_memory="1GiB", kv_cache_memory_bytes=1 << 30).create_engine_config(
            CpuPlatform()
        )


@pytest.mark.parametrize("load_format", ["pt", "dummy", "bitsandbytes", "tensorizer"])
def test_a_load_format_core_does_not_read_is_refused_naming_the_flag(load_format):
    with pytest.raises(ValueError, match=f"^--load-format {load_format}: not a format core"):
        EngineArgs(load_format=load_format).create_engine_config(CpuPlatform())


def test_max_log_len_alone_is_refused_naming_enable_log_requests():
    result = CliRunner().invoke(serve, ["--max-log-len", "10"])
    assert result.exit_code != 0
    assert "--max-log-len: requests are only logged with --enable-log-requests" in result.output


def test_cors_lists_take_several_values_after_one_flag_or_a_json_list(served):
    spread = served(("--allowed-origins", "https://a", "https://b", "--port", "1"), CpuPlatform)
    assert spread.frontend.allowed_origins == ("https://a", "https://b")
    listed = served(("--allowed-methods", '["GET", "POST"]'), CpuPlatform)
    assert listed.frontend.allowed_methods == ("GET", "POST")
