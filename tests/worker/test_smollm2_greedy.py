"""SmolLM2-135M-Instruct from its GGUF, driven by hand-built SchedulerOutputs, generates
the same greedy tokens as transformers' generate on the same file."""

from __future__ import annotations

import pytest
import torch
from determinism import assert_greedy_equivalent
from step_driver import StepDriver

from core.config import EngineConfig, ModelConfig
from core.kv_cache.grouping import kv_cache_config_for_blocks
from core.model_loader.resolve import default_model_path, resolve_model
from core.platforms.cpu import CpuPlatform
from core.tokenizer import Tokenizer
from core.worker.worker import Worker

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain gravity in one sentence.",
    "How do I boil an egg?",
]
NUM_TOKENS = 32

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompts_ids() -> list[list[int]]:
    tokenizer = Tokenizer.from_gguf(default_model_path())
    rendered = [tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    return [tokenizer.encode(text, add_special_tokens=False) for text in rendered]


@pytest.fixture(scope="module")
def ours(prompts_ids) -> list[list[int]]:
    worker = Worker(EngineConfig(model=ModelConfig(dtype="float32")), CpuPlatform())
    worker.load_model(resolve_model(None))
    worker.initialize_kv_cache(kv_cache_config_for_blocks(worker.get_kv_cache_spec(), 64))
    driver = StepDriver(worker)
    for i, ids in enumerate(prompts_ids):
        driver.add(str(i), ids)
    driver.step({str(i): len(ids) for i, ids in enumerate(prompts_ids)})
    for _ in range(NUM_TOKENS - 1):
        driver.step({str(i): 1 for i in range(len(prompts_ids))})
    return [driver.reqs[str(i)].output for i in range(len(prompts_ids))]


@pytest.fixture(scope="module")
def reference():
    import transformers

    path = default_model_path()
    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()


def test_batched_greedy_generation_matches_transformers(ours, reference, prompts_ids):
    def next_logits(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return reference(torch.tensor([tokens])).logits[0, -1]

    # transformers stops at the end-of-sequence token; the hand-driven worker runs past it.
    stop_token_ids = {Tokenizer.from_gguf(default_model_path()).eos_token_id}
    for i, ids in enumerate(prompts_ids):
        with torch.no_grad():
            generated = reference.generate(
                torch.tensor([ids]), do_sample=False, max_new_tokens=NUM_TOKENS
            )[0, len(ids) :].tolist()
        assert len(ours[i]) == NUM_TOKENS
        assert_greedy_equivalent(
            ours[i], generated, next_logits, ids, PROMPTS[i], stop_token_ids=stop_token_ids
        )


def test_capital_of_france_is_paris(ours):
    tokenizer = Tokenizer.from_gguf(default_model_path())
    assert "Paris" in tokenizer.decode(ours[0], skip_special_tokens=True)
