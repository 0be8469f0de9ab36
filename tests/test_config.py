"""EngineArgs -> EngineConfig: explicit flags win, errors name the field, config freezes."""

from __future__ import annotations

import importlib.metadata as metadata

import click
import pytest
import torch
from click.testing import CliRunner
from plugin_sources import API

from core.config import UsageContext, parse_size
from core.engine_args import EngineArgs, engine_options
from core.platforms.cpu import CpuPlatform
from core.plugins import PluginRegistry
from core.plugins.groups import ALL_GROUPS, HOOKS
from core.plugins.hooks import get_hook_manager

ADJUSTING_HOOK = {
    "tuner/__init__.py": API,
    "tuner/hooks.py": """
        from core.plugins import hookimpl

        @hookimpl
        def core_adjust_config(config):
            config.scheduler.set_default("max_num_seqs", 7)
    """,
}


def test_defaults_on_cpu_run_eager_at_level_zero():
    config = EngineArgs().create_engine_config(CpuPlatform())
    assert config.compilation.level == 0
    assert (config.compilation.compile_model, config.compilation.capture_graphs) == (False, False)
    assert config.cache.block_size == 16 and config.cache.enable_prefix_caching


def test_only_given_options_are_marked_as_set():
    config = EngineArgs(max_num_seqs=3).create_engine_config(CpuPlatform())
    assert config.scheduler.is_user_set("max_num_seqs")
    assert not config.scheduler.is_user_set("max_num_batched_tokens")
    assert not config.compilation.is_user_set("compile_model")


def test_serving_on_cpu_defaults_to_a_smaller_token_budget_than_offline():
    def budget(usage: UsageContext, **kwargs) -> int:
        config = EngineArgs(**kwargs).create_engine_config(
            CpuPlatform(), model_max_len=8192, usage=usage
        )
        return config.scheduler.max_num_batched_tokens

    # 2048: the generic offline budget; 80: the CPU's serving budget, measured on W3.
    assert budget(UsageContext.OFFLINE) == 2048
    assert budget(UsageContext.SERVING) == 80
    assert budget(UsageContext.SERVING, max_num_batched_tokens=4096) == 4096  # user wins
    # Without chunked prefill a whole prompt must fit one step, whatever the usage.
    assert budget(UsageContext.SERVING, enable_chunked_prefill=False) == 8192


def test_serving_on_cpu_admits_bursts_unless_the_user_sets_a_budget():
    def burst(usage: UsageContext, **kwargs) -> int | None:
        config = EngineArgs(**kwargs).create_engine_config(
            CpuPlatform(), model_max_len=8192, usage=usage
        )
        return config.scheduler.burst_token_budget

    assert burst(UsageContext.SERVING) == 8192  # the CPU's serving burst, measured on W3
    assert burst(UsageContext.OFFLINE) is None  # offline steps are large already
    assert burst(UsageContext.SERVING, max_num_batched_tokens=256) is None  # every step's
    assert burst(UsageContext.SERVING, burst_token_budget=1024) == 1024
    both = {"max_num_batched_tokens": 256, "burst_token_budget": 1024}
    assert burst(UsageContext.SERVING, **both) == 1024


def test_a_burst_budget_below_the_step_budget_is_refused_by_name():
    with pytest.raises(ValueError, match="burst_token_budget 64 must be >= max_num_batched"):
        EngineArgs(max_num_batched_tokens=128, burst_token_budget=64).create_engine_config(
            CpuPlatform(), model_max_len=8192, usage=UsageContext.SERVING
        )


def test_adjust_config_hook_fills_defaults_but_not_user_flags(site):
    site.add("tuner", {HOOKS: {"tuner": "tuner.hooks"}}, ADJUSTING_HOOK)
    points = [ep for group in ALL_GROUPS for ep in metadata.entry_points(group=group)]
    hooks = get_hook_manager(PluginRegistry(points, None))
    assert EngineArgs().create_engine_config(CpuPlatform(), hooks).scheduler.max_num_seqs == 7
    explicit = EngineArgs(max_num_seqs=32).create_engine_config(CpuPlatform(), hooks)
    assert explicit.scheduler.max_num_seqs == 32


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"block_size": 0}, "block_size"),
        ({"dtype": "float64"}, "dtype"),
        ({"max_num_seqs": -1}, "max_num_seqs"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"scheduling_policy": "random"}, "policy"),
        ({"kv_cache_memory": "lots"}, "size"),
        ({"sampler_config": "[1, 2]"}, "--sampler-config"),
        ({"kv_transfer_config": '{"kv_role": "sideways"}'}, "kv_role"),
        ({"kv_transfer_config": "{not json"}, "--kv-transfer-config must be a JSON object"),
    ],
)
def test_invalid_values_raise_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineArgs(**kwargs).create_engine_config(CpuPlatform())


def test_platform_rejects_an_unsupported_quantization():
    refusal = "--quantization bitsandbytes is not supported on the cpu platform"
    with pytest.raises(ValueError, match=refusal):
        EngineArgs(quantization="bitsandbytes").create_engine_config(CpuPlatform())


def test_config_is_frozen_after_creation():
    config = EngineArgs().create_engine_config(CpuPlatform())
    with pytest.raises(ValueError, match="frozen"):
        config.cache.block_size = 32


@pytest.mark.parametrize(
    ("text", "size"),
    [("4GiB", 4 << 30), ("512MiB", 512 << 20), ("1.5G", 3 << 29), ("2", 2 << 30), (3, 3 << 30)],
)
def test_sizes_accept_units_and_bare_gib(text, size):
    assert parse_size(text) == size


def test_cli_flags_use_vllm_names():
    seen = {}

    @click.command()
    @engine_options
    def command(**options):
        seen["args"] = EngineArgs.from_cli(options)

    flags = [
        "--max-model-len", "100", "--no-enable-prefix-caching", "-O", "0",
        "--kv-cache-memory", "512MiB", "--sampler-config", '{"k": 1}',
        "--tensor-parallel-size", "1", "--enforce-eager",
    ]  # fmt: skip
    result = CliRunner().invoke(command, flags, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = seen["args"].create_engine_config(CpuPlatform())
    assert config.model.max_model_len == 100
    assert config.cache.enable_prefix_caching is False
    assert config.cache.kv_cache_memory_bytes == 512 << 20
    assert config.compilation.level == 0
    assert config.components.sampler_config == {"k": 1}
    assert not config.scheduler.is_user_set("max_num_seqs")
    bad = CliRunner().invoke(command, ["--tensor-parallel-size", "x"])
    assert bad.exit_code == 2 and "tensor-parallel-size" in bad.output


def test_parallelism_defaults_to_worker_processes_and_one_rank_to_the_engine_core():
    for args in (dict(tensor_parallel_size=2), dict(pipeline_parallel_size=2)):
        config = EngineArgs(**args).create_engine_config(CpuPlatform())
        assert config.parallel.distributed_executor_backend == "mp"
    assert (
        EngineArgs().create_engine_config(CpuPlatform()).parallel.distributed_executor_backend
        == "uni"
    )


def _two_ranks_in_one_process(parallel) -> None:
    parallel.tensor_parallel_size = 2
    parallel.distributed_executor_backend = "uni"


@pytest.mark.parametrize(
    ("adjust", "message"),
    [
        (lambda config: setattr(config.compilation, "level", 2), "-O2"),
        (lambda config: _two_ranks_in_one_process(config.parallel), "use mp"),
    ],
)
def test_a_hook_cannot_leave_what_the_flags_could_not_set(adjust, message):
    from types import SimpleNamespace

    hooks = SimpleNamespace(hook=SimpleNamespace(core_adjust_config=adjust))
    with pytest.raises(ValueError, match=message):
        EngineArgs().create_engine_config(CpuPlatform(), hooks)


def test_lora_flags_fill_the_lora_config_and_need_enable_lora():
    platform = CpuPlatform()
    args = EngineArgs(enable_lora=True, max_loras=3, max_lora_rank=8)
    lora = args.create_engine_config(platform).lora
    assert (lora.max_loras, lora.max_lora_rank, lora.max_cpu_loras) == (3, 8, 3)
    assert EngineArgs().create_engine_config(platform).lora is None
    with pytest.raises(ValueError, match="--max-loras, --max-cpu-loras: LoRA options need"):
        EngineArgs(max_loras=2, max_cpu_loras=3).create_engine_config(platform)
    with pytest.raises(ValueError, match="max_cpu_loras"):
        EngineArgs(enable_lora=True, max_loras=4, max_cpu_loras=2).create_engine_config(platform)


def test_more_ranks_than_devices_are_refused_before_any_process_starts():
    class OneDevice(CpuPlatform):
        name = "onedevice"

        def device_count(self) -> int:
            return 1

    with pytest.raises(ValueError, match=r"= 2 ranks need 2 onedevice devices; this host has 1"):
        EngineArgs(tensor_parallel_size=2).create_engine_config(OneDevice())
    with pytest.raises(ValueError, match=r"x 2 data-parallel engine cores on this node = 2"):
        EngineArgs(data_parallel_size=2).create_engine_config(OneDevice())
    # Another node runs the second engine core: one device is enough here.
    args = EngineArgs(data_parallel_size=2, data_parallel_size_local=1)
    assert args.create_engine_config(OneDevice()).parallel.world_size == 1
    assert EngineArgs().create_engine_config(OneDevice()).parallel.world_size == 1


class _MeasuringPlatform:
    """A platform whose default dtype costs a measurement: counts the reads."""

    reads = 0

    @property
    def default_dtype(self):
        type(self).reads += 1
        return torch.bfloat16


def test_an_explicit_dtype_never_reads_the_platform_default():
    from core.config import ModelConfig

    platform = _MeasuringPlatform()
    assert ModelConfig(model="m", dtype="float32").torch_dtype(platform) is torch.float32
    assert _MeasuringPlatform.reads == 0
    assert ModelConfig(model="m", dtype="auto").torch_dtype(platform) is torch.bfloat16
    assert _MeasuringPlatform.reads == 1
