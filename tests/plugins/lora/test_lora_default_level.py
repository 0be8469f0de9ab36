"""A platform whose default level is -O2 (as CUDA's) starts an engine with --enable-lora
and no level given: the default yields to the explicit flag and the engine runs eagerly,
serving the adapter. Before, the default level refused until --enforce-eager was added."""

from __future__ import annotations

import pytest
import torch

from core import LLM, SamplingParams
from core.engine import processor
from core.platforms.cpu import CpuPlatform
from core.platforms.selection import PlatformChoice
from core.testing.tiny_checkpoint import write_tiny_checkpoint


class GraphDefaultPlatform(CpuPlatform):
    """The CPU, declaring CUDA's levels: -O2 (compile and capture graphs) by default."""

    name = "graphdefault"
    supported_dtypes = (torch.float32,)
    # Not the CPU's measured choice, which is bfloat16 where it has native bf16 dot products.
    default_dtype = torch.float32
    supported_optimization_levels = (0, 1, 2)
    default_optimization_level = 2

    def capture_graph(self, fn):
        raise AssertionError("an engine with LoRA must not capture graphs")


@pytest.fixture
def on_graph_default_platform(monkeypatch):
    choice = PlatformChoice("graphdefault", GraphDefaultPlatform(), "chosen by the test")
    monkeypatch.setattr(processor, "select_platform", lambda *args: choice)


def test_enable_lora_with_no_level_starts_eagerly_and_generates(
    tmp_path, on_graph_default_platform
):
    model = write_tiny_checkpoint(tmp_path / "tiny")
    llm = LLM(str(model), enable_lora=True, max_model_len=32, kv_cache_memory="1MiB")
    compilation = llm.engine.processor.config.compilation
    assert compilation.level == 2 and not compilation.is_user_set("level")
    assert not (compilation.compile_model or compilation.capture_graphs)
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    output = llm.generate([[5, 6, 7]], greedy, use_tqdm=False)[0]
    assert len(output.outputs[0].token_ids) == 4


def test_enable_lora_with_an_explicit_o2_is_refused_naming_both(
    tmp_path, on_graph_default_platform
):
    model = write_tiny_checkpoint(tmp_path / "tiny")
    with pytest.raises(ValueError, match="-O2 .*--enable-lora.*use -O0 or --enforce-eager"):
        LLM(str(model), enable_lora=True, optimization_level=2, max_model_len=32)
