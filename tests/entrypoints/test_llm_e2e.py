"""End to end on SmolLM2: 64 mixed-length prompts under preemption vs each prompt alone."""

from __future__ import annotations

import random

import pytest
import torch
from determinism import assert_greedy_equivalent

from core import LLM, SamplingParams

pytestmark = pytest.mark.slow

SENTENCES = [
    "The river wound slowly through the valley, past farms and old stone bridges.",
    "Scientists measured the temperature of the lake every morning for a year.",
    "She opened the letter and read it twice before saying a word.",
    "Trains from the northern city arrive at the central station every hour.",
    "A good recipe for bread needs flour, water, salt, yeast and patience.",
    "The committee postponed its decision until the spring meeting.",
    "Children played football in the park while their parents talked.",
    "Our library lends books, music and maps to anyone with a card.",
]
NUM_TOKENS = 32


def make_prompts(count: int) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choices(SENTENCES, k=rng.randint(1, 6))) for _ in range(count)]


# The determinism policy (and the transformers reference) is float32's, whatever the
# platform's default dtype.
DTYPE = "float32"


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return make_prompts(64)


@pytest.fixture(scope="module")
def alone(prompts) -> list[list[int]]:
    llm = LLM(max_num_seqs=1, max_model_len=512, kv_cache_memory="64MiB", dtype=DTYPE)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    return [llm.generate(p, params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]


def test_batched_greedy_under_preemption_equals_each_prompt_alone(prompts, alone):
    # ~42 blocks of 16 tokens: far less than 16 running requests of up to ~130 tokens need.
    llm = LLM(max_num_seqs=16, max_model_len=512, kv_cache_memory="30MiB", dtype=DTYPE)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.core.scheduler.num_preemptions > 0
    tokenizer = llm.get_tokenizer()
    reference = _ReferenceLogits()
    for prompt, output, expected in zip(prompts, outputs, alone, strict=True):
        ids = output.outputs[0].token_ids
        assert len(ids) == NUM_TOKENS
        context = tokenizer.encode(prompt)
        assert_greedy_equivalent(ids, expected, reference, context, label=prompt[:40])
        assert output.outputs[0].text == tokenizer.decode(ids, skip_special_tokens=True)


class _ReferenceLogits:
    """transformers' logits on the same GGUF, loaded only if a divergence needs checking."""

    def __init__(self) -> None:
        self._model = None

    def __call__(self, tokens: list[int]) -> torch.Tensor:
        if self._model is None:
            import transformers

            from core.model_loader.resolve import default_model_path

            path = default_model_path()
            self._model = transformers.AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch.float32
            ).eval()
        with torch.no_grad():
            return self._model(torch.tensor([tokens])).logits[0, -1]
