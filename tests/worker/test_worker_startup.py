"""The Worker's start-up contract (its class docstring): what runs before what, the
attention layers found once for the target and the draft, and the checks load_model makes
with the attention backend (graph modes) and the sampler (speculation) in hand."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

import pytest
from plugin_sources import API

from core.config import (
    CompilationConfig,
    ComponentConfig,
    CUDAGraphMode,
    EngineConfig,
    ModelConfig,
    SpeculativeConfig,
)
from core.kernel_choice import KERNEL_CHOICES
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.kv_cache.layout import KVCacheConfig
from core.kv_cache.spec import FullAttentionSpec
from core.model_loader import resolve_model
from core.platforms.cpu import CpuPlatform
from core.plugins.groups import SAMPLERS
from core.testing.tiny_checkpoint import write_tiny_checkpoint
from core.worker.contract import SchedulerOutput
from core.worker.worker import Worker

TARGET_LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
needs_spec_decode = pytest.mark.skipif(
    importlib.util.find_spec("core_spec_decode") is None,
    reason="core-spec-decode (the speculative proposers) is not installed",
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def torch_ref_worker(**config) -> Worker:
    components = ComponentConfig(attention_backend="torch_ref")
    config = EngineConfig(model=ModelConfig(dtype="float32"), components=components, **config)
    return Worker(config, CpuPlatform())


def loaded_worker(tiny: Path, **config) -> Worker:
    worker = torch_ref_worker(**config)
    worker.load_model(resolve_model(str(tiny)))
    return worker


def compiled_at(default_level: int, **fields) -> CompilationConfig:
    """`fields` as the user set them, the rest from the platform's -O `default_level`."""
    compilation = CompilationConfig(**fields)
    compilation.set_default("level", default_level)
    compilation.fill_from_level()
    return compilation


@pytest.mark.parametrize(
    "call",
    [
        lambda worker: worker.get_kv_cache_spec(),
        lambda worker: worker.initialize_kv_cache_of_rank([KVCacheConfig(8, (), ())]),
        lambda worker: worker.execute_model(SchedulerOutput()),
        lambda worker: worker.runner,
    ],
    ids=["get_kv_cache_spec", "initialize_kv_cache", "execute_model", "runner"],
)
def test_what_needs_the_model_before_load_model_says_load_model_must_run_first(call):
    with pytest.raises(RuntimeError, match="^load_model must run first$"):
        call(torch_ref_worker())


def test_a_step_before_initialize_kv_cache_says_it_must_run_first(tiny):
    worker = loaded_worker(tiny)
    with pytest.raises(RuntimeError, match="^initialize_kv_cache must run before the first step$"):
        worker.execute_model(SchedulerOutput())


@needs_spec_decode
def test_the_drafts_layers_follow_the_targets_bound_reported_and_given_views(tiny):
    from core_spec_decode.draft_model import DraftAttentionSpec

    spec = SpeculativeConfig(
        method="draft_model", num_speculative_tokens=2, options={"model": str(tiny)}
    )
    worker = loaded_worker(tiny, speculative=spec)
    names = TARGET_LAYERS + [f"draft.{name}" for name in TARGET_LAYERS]
    layers = worker.loaded.attention_layers
    assert [layer.layer_name for layer in layers] == names
    assert all(layer.impl is not None for layer in layers)  # bound to torch_ref
    specs = worker.get_kv_cache_spec()
    assert list(specs) == names
    assert [type(specs[name]) for name in names] == [FullAttentionSpec] * 2 + [
        DraftAttentionSpec
    ] * 2
    worker.initialize_kv_cache(kv_cache_config_for_blocks(specs, 8))
    assert all(layer.kv_cache is not None for layer in layers)


@pytest.mark.parametrize(
    ("compilation", "message"),
    [
        (
            compiled_at(0, cudagraph_mode="FULL_DECODE_ONLY", compile_model=False),
            "^compilation_config.cudagraph_mode FULL_DECODE_ONLY captures attention in the "
            "graph, which attention backend 'torch_ref' does not support",
        ),
        (
            compiled_at(0, level=2, compile_model=False),
            "^-O2 captures graphs, but attention backend 'torch_ref' cannot be captured and "
            r"the model is not compiled \(no pieces to capture\)",
        ),
    ],
    ids=["full-graphs-of-a-backend-without-graph-support", "user-O2-with-nothing-to-capture"],
)
def test_graphs_asked_for_that_the_backend_cannot_give_are_refused(tiny, compilation, message):
    with pytest.raises(ValueError, match=message):
        loaded_worker(tiny, compilation=compilation)


def test_default_level_graphs_with_nothing_to_capture_are_dropped(tiny):
    worker = loaded_worker(tiny, compilation=compiled_at(2, compile_model=False))
    assert worker.config.compilation.capture_graphs
    assert worker.loaded.graph_mode is CUDAGraphMode.NONE
    worker.initialize_kv_cache(kv_cache_config_for_blocks(worker.get_kv_cache_spec(), 8))
    assert worker.runner.graphs is None


def test_kernel_choices_are_held_to_reading_the_models_weights(tiny, monkeypatch):
    # An op with candidates, and a problem recorded: what the worker measures is seen.
    monkeypatch.setattr(KERNEL_CHOICES, "candidates", {"test-op": []})
    monkeypatch.setattr(KERNEL_CHOICES, "recording", _recording_one_problem)
    measured = []
    monkeypatch.setattr(KERNEL_CHOICES, "measure", lambda *args, **kw: measured.append(kw) or {})
    model = loaded_worker(tiny).runner.model
    tensors = {t.data_ptr(): t for t in [*model.parameters(), *model.buffers()]}
    assert measured == [{"weight_bytes": sum(t.nbytes for t in tensors.values())}]


@contextlib.contextmanager
def _recording_one_problem():
    yield {"a problem": ()}


FORWARD_ONLY_SAMPLER = {
    "forward_only_sampler/__init__.py": API
    + """
from core.sample.interface import Sampler, SamplerOutput

class ForwardOnlySampler(Sampler):
    def forward(self, logits, metadata):
        return SamplerOutput(sampled_token_ids=logits.argmax(dim=-1), logprobs=None)
""",
}


def test_speculation_with_a_sampler_that_cannot_process_logits_is_refused(
    tiny, site, fresh_registry
):
    entries = {SAMPLERS: {"forward_only": "forward_only_sampler:ForwardOnlySampler"}}
    site.add("forward-only-sampler", entries, FORWARD_ONLY_SAMPLER)
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
    worker = Worker(
        EngineConfig(
            model=ModelConfig(dtype="float32"),
            components=ComponentConfig(sampler="forward_only"),
            speculative=spec,
        ),
        CpuPlatform(),
    )
    with pytest.raises(ValueError, match="^speculative_config: sampler ForwardOnlySampler cannot"):
        worker.load_model(resolve_model(str(tiny)))
