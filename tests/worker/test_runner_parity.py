"""Logits parity with transformers through the real ModelRunner and the paged backend.

Tiny random-weight checkpoints of each architecture are made with transformers and saved
as safetensors. One batch mixes prompt lengths, prefills one prompt in two chunks and
starts one request from blocks another request filled (as a prefix-cache hit does); every
sampled position's logits must match transformers' within 1e-4 of the logit scale.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import transformers
from step_driver import RecordingSampler, StepDriver

from core.config import ComponentConfig, EngineConfig, ModelConfig
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.model_loader import load_safetensors_checkpoint
from core.platforms.cpu import CpuPlatform
from core.worker.worker import Worker

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=512,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 10000.0,
}
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        **COMMON, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE
    ),
    "mistral": lambda: transformers.MistralConfig(**COMMON, sliding_window=24),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=16),
}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


BACKENDS = [
    "torch_ref",
    pytest.param(
        "cpu_paged",
        marks=pytest.mark.skipif(
            not _installed("core_cpu_kernels"), reason="core-cpu-kernels is not installed"
        ),
    ),
]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def arch(request) -> str:
    return request.param


# dtype -> tolerance as a fraction of the logit scale: float32 is the determinism policy's;
# bfloat16 (8-bit mantissa, the AMX CPU default) only has to stay near the reference.
TOLERANCES = {"float32": 1e-4, "bfloat16": 3e-2}


@pytest.fixture(scope="module", params=sorted(TOLERANCES))
def dtype(request) -> str:
    return request.param


@pytest.fixture(scope="module", params=BACKENDS)
def pair(request, arch, dtype, tmp_path_factory):
    """(our Worker on one attention backend and dtype, the transformers model in float32)."""
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(
        CONFIGS[arch](), attn_implementation="eager", dtype=torch.float32
    ).eval()
    path = tmp_path_factory.mktemp(arch)
    reference.save_pretrained(path)
    config = EngineConfig(
        model=ModelConfig(dtype=dtype),
        components=ComponentConfig(attention_backend=request.param),
    )
    worker = Worker(config, CpuPlatform())
    worker.load_model(load_safetensors_checkpoint(path))
    worker.initialize_kv_cache(kv_cache_config_for_blocks(worker.get_kv_cache_spec(), 64))
    worker.runner.sampler = RecordingSampler(worker.runner.sampler)
    return worker, reference


def reference_logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0]  # [L, V]


def test_mixed_batch_chunked_prefill_and_cached_prefix_match_transformers(pair, dtype):
    worker, reference = pair
    gen = torch.Generator().manual_seed(1)
    prompts = {
        "a": torch.randint(0, 256, (40,), generator=gen).tolist(),
        "b": torch.randint(0, 256, (7,), generator=gen).tolist(),
        "c": torch.randint(0, 256, (70,), generator=gen).tolist(),
    }
    # "d" shares "a"'s first 32 tokens (two full blocks) and reuses a's filled blocks.
    prompts["d"] = prompts["a"][:32] + torch.randint(0, 256, (18,), generator=gen).tolist()
    driver = StepDriver(worker)
    for req_id in ("a", "b", "c"):
        driver.add(req_id, prompts[req_id])
    expected: list[tuple[str, int]] = []  # (request, position) of each sampled row

    def step(schedule: dict[str, int]) -> None:
        before = {r: driver.reqs[r].computed for r in schedule}
        driver.step(schedule)
        for req_id in sorted(schedule, key=lambda r: worker.runner.batch.req_id_to_row[r]):
            end = before[req_id] + schedule[req_id]
            if end == len(driver.reqs[req_id].tokens) - 1:  # it sampled one token
                expected.append((req_id, end - 1))

    step({"a": 40, "b": 7, "c": 32})  # c is a partial chunk: no sample
    driver.add("d", prompts["d"], shared_blocks=driver.blocks_of("a")[:2], num_cached_tokens=32)
    step({"a": 1, "b": 1, "c": 38, "d": 18})
    for _ in range(3):
        step({"a": 1, "b": 1, "c": 1, "d": 1})

    got = torch.cat(worker.runner.sampler.calls)  # [rows, V]
    assert got.shape[0] == len(expected) == 2 + 4 + 12
    for row, (req_id, position) in enumerate(expected):
        ref = reference_logits(reference, driver.reqs[req_id].tokens)[position]
        scale = ref.abs().max()
        assert (got[row].float() - ref).abs().max() <= TOLERANCES[dtype] * scale, (req_id, position)


def test_unknown_attention_backend_config_is_refused_by_the_kernel(tmp_path):
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(CONFIGS["llama"]())
    reference.save_pretrained(tmp_path)
    config = EngineConfig(
        components=ComponentConfig(
            attention_backend="torch_ref", attention_backend_config={"bogus": 1}
        )
    )
    worker = Worker(config, CpuPlatform())
    with pytest.raises(ValueError, match="--attention-backend-config does not fit TorchRefImpl"):
        worker.load_model(load_safetensors_checkpoint(tmp_path))
