"""An engine on a fake device platform (host memory, mocked numbers).

Its KV budget is --gpu-memory-utilization x total minus the peak of a forward of the
largest batch, which the fake peak counter sees; the CPU refuses the flag. A platform that
pins stages the runner's inputs in pinned memory and still generates what the CPU does."""

from __future__ import annotations

import pytest
import torch

from core import LLM, SamplingParams
from core.engine import processor
from core.engine_args import EngineArgs
from core.platforms.cpu import CpuPlatform
from core.platforms.interface import MemoryInfo, Platform
from core.platforms.selection import PlatformChoice
from core.worker.model_runner import ModelRunner

MIB = 1 << 20
TOTAL = 4 * MIB
WEIGHTS = 1 * MIB  # what the fake device holds once the model is loaded
ACTIVATION_PER_TOKEN = 4096
MAX_TOKENS = 64  # --max-num-batched-tokens: the profiled forward's size
# The tiny model: 2 layers x K and V x 1 KV head x head size 16 x 4 bytes x 16 tokens.
BLOCK_BYTES = 2 * 2 * 1 * 16 * 4 * 16
PEAK = WEIGHTS + ACTIVATION_PER_TOKEN * MAX_TOKENS


class FakeGpu(Platform):
    """A device platform whose memory is host memory with mocked numbers: its peak counter
    grows only with forwards that run between reset_peak_memory and peak_memory_bytes."""

    name = "fakegpu"
    device_type = "cpu"
    device_name = "fake GPU"
    dist_backend = "gloo"
    supported_dtypes = (torch.float32,)
    preferred_attention_backends = ("torch_ref",)
    memory_profiling = True

    def __init__(self, free_at_start: int = TOTAL, pin_memory: bool = False) -> None:
        super().__init__()
        self.free_at_start = free_at_start
        self.pin_memory = pin_memory
        self.peak: int | None = None  # None: no measurement running
        self.profiled_tokens: list[int] = []

    def memory_info(self) -> MemoryInfo:
        return MemoryInfo(total_bytes=TOTAL, available_bytes=self.free_at_start)

    def set_device(self, device: torch.device) -> None:
        pass

    def torch_device(self, local_rank: int = 0) -> torch.device:
        return torch.device("cpu")

    def reset_peak_memory(self) -> None:
        self.peak = WEIGHTS

    def peak_memory_bytes(self) -> int:
        if self.peak is None:
            raise RuntimeError("read before reset")
        return self.peak

    def forward_ran(self, num_tokens: int) -> None:
        if self.peak is not None:
            self.profiled_tokens.append(num_tokens)
            self.peak = max(self.peak, WEIGHTS + ACTIVATION_PER_TOKEN * num_tokens)


@pytest.fixture
def on_platform(monkeypatch):
    """`on_platform(platform)`: engines start on `platform`, whose counter sees dummy runs."""
    real_dummy_run = ModelRunner.dummy_run

    def use(platform: Platform) -> Platform:
        def dummy_run(runner: ModelRunner, num_tokens: int) -> None:
            real_dummy_run(runner, num_tokens)
            platform.forward_ran(num_tokens)

        choice = PlatformChoice(platform.name, platform, "chosen by the test")
        monkeypatch.setattr(processor, "select_platform", lambda *args: choice)
        monkeypatch.setattr(ModelRunner, "dummy_run", dummy_run)
        return platform

    return use


def start(tiny_checkpoint, **kwargs) -> LLM:
    settings = dict(dtype="float32", max_model_len=32, max_num_batched_tokens=MAX_TOKENS)
    return LLM(str(tiny_checkpoint), **settings, **kwargs)


def test_kv_budget_is_the_utilization_share_minus_the_profiled_peak(tiny_checkpoint, on_platform):
    platform = on_platform(FakeGpu())
    llm = start(tiny_checkpoint, gpu_memory_utilization=0.5)
    assert platform.profiled_tokens == [MAX_TOKENS]
    assert llm.engine.core.num_gpu_blocks == (TOTAL // 2 - PEAK) // BLOCK_BYTES == 192
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    assert len(llm.generate([[5, 6, 7]], greedy, use_tqdm=False)[0].outputs[0].token_ids) == 4


def test_the_default_utilization_is_0_9(tiny_checkpoint, on_platform):
    on_platform(FakeGpu())
    llm = start(tiny_checkpoint)
    assert llm.engine.core.num_gpu_blocks == (int(0.9 * TOTAL) - PEAK) // BLOCK_BYTES


def test_kv_cache_memory_wins_without_profiling(tiny_checkpoint, on_platform):
    platform = on_platform(FakeGpu())
    llm = start(tiny_checkpoint, kv_cache_memory="64KiB")
    assert platform.peak is None and platform.profiled_tokens == []
    assert llm.engine.core.num_gpu_blocks == 64 * 1024 // BLOCK_BYTES


def test_a_utilization_that_leaves_no_kv_cache_names_the_flag(tiny_checkpoint, on_platform):
    on_platform(FakeGpu())
    with pytest.raises(ValueError) as error:
        start(tiny_checkpoint, gpu_memory_utilization=0.3)  # 1.2 MiB < the 1.25 MiB peak
    assert str(error.value).startswith(
        "--gpu-memory-utilization 0.3 x 4.00 MiB = 1.20 MiB on rank 0 leaves no KV cache: "
        "the model's peak without it is 1.25 MiB"
    )


def test_a_device_other_processes_fill_is_refused(tiny_checkpoint, on_platform):
    on_platform(FakeGpu(free_at_start=TOTAL // 4))
    with pytest.raises(ValueError, match=r"but only 1.00 MiB was free when its worker started"):
        start(tiny_checkpoint)


def test_both_budget_flags_on_a_profiling_platform_are_refused():
    args = EngineArgs(gpu_memory_utilization=0.5, kv_cache_memory="1GiB")
    with pytest.raises(ValueError, match="--gpu-memory-utilization and --kv-cache-memory both"):
        args.create_engine_config(FakeGpu())


@pytest.mark.parametrize("utilization", [0, -0.5, 1.01])
def test_a_utilization_outside_0_to_1_names_the_field(utilization):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineArgs(gpu_memory_utilization=utilization).create_engine_config(FakeGpu())


def test_cpu_refuses_gpu_memory_utilization_and_points_to_kv_cache_memory(tiny_checkpoint):
    message = (
        "--gpu-memory-utilization: the cpu platform shares memory with the host and does not "
        "profile it; size the KV cache with --kv-cache-memory"
    )
    with pytest.raises(ValueError) as error:
        EngineArgs(gpu_memory_utilization=0.9).create_engine_config(CpuPlatform())
    assert str(error.value) == message
    with pytest.raises(ValueError) as error:
        LLM(str(tiny_checkpoint), gpu_memory_utilization=0.5)  # the keyword, on this machine
    assert str(error.value) == message


def test_a_pinning_platform_generates_what_the_cpu_does(tiny_checkpoint, on_platform, monkeypatch):
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    expected = [o.outputs[0].token_ids for o in start(tiny_checkpoint, kv_cache_memory="1MiB")
                .generate(prompts, greedy, use_tqdm=False)]  # fmt: skip
    pinned: list[torch.Size] = []

    def pin_memory(tensor: torch.Tensor) -> torch.Tensor:
        pinned.append(tensor.shape)
        return tensor.clone()  # what pinning does, on a torch that can (this one cannot)

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    on_platform(FakeGpu(pin_memory=True))
    outputs = start(tiny_checkpoint).generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert torch.Size([3 + 5]) in pinned  # the first step's input ids
