"""core-lora end to end: adapters made by peft, served in mixed batches by the engine.

A tiny random llama and three adapters that `peft` trains nothing but initialises at
random (`init_lora_weights=False`, so B is nonzero): different ranks (one per-module rank
through rank_pattern), scalings (one rsLoRA) and target modules, fused q/k/v and gate/up
shards included. The reference is transformers + peft with each adapter alone.
"""

from __future__ import annotations

import copy

import peft
import pytest
import torch

from core import LLM, LoRARequest, SamplingParams
from core.testing.test_lora import engine as kit_engine
from core.testing.test_lora import reference_run
from core.testing.tiny_checkpoint import VOCAB, reference_model, write_tiny_checkpoint

pytestmark = pytest.mark.slow  # a few small engines and peft references, about 20 s

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PEFT_CONFIGS = {
    "sql": peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "chat": peft.LoraConfig(r=8, lora_alpha=16, use_rslora=True, target_modules=ALL),
    "code": peft.LoraConfig(
        r=2,
        lora_alpha=4,
        target_modules=["o_proj", "gate_proj", "up_proj", "down_proj"],
        rank_pattern={"down_proj": 6},
    ),
}
MAX_TOKENS = 6
GREEDY = SamplingParams(
    temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=len(VOCAB)
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("peft")
    base = reference_model(seed=7)
    write_tiny_checkpoint(root / "base", base)
    requests, references = {}, {None: base}
    for index, (name, config) in enumerate(PEFT_CONFIGS.items(), start=1):
        torch.manual_seed(100 + index)
        config.init_lora_weights = False
        model = peft.get_peft_model(copy.deepcopy(base), config)
        model.save_pretrained(root / name)
        requests[name] = LoRARequest(name, index, str(root / name))
        references[name] = peft.PeftModel.from_pretrained(copy.deepcopy(base), root / name).eval()
    return {"root": root, "requests": requests, "references": references}


def engine(setup: dict, **overrides) -> LLM:
    """The kit's engine settings (3 slots, rank <= 8, full-vocabulary logprobs), core-lora."""
    return kit_engine(setup, "default", **overrides)


def prompt(i: int, length: int = 6) -> list[int]:
    return [VOCAB[f"w{(5 * i + 2 * j) % 45}"] for j in range(length + i)]


def generate(llm: LLM, setup: dict, choices: list[str | None], prompts: list[list[int]]):
    loras = [None if c is None else setup["requests"][c] for c in choices]
    return llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)


def assert_matches_peft(setup: dict, outputs, choices, prompts) -> None:
    for i, (output, choice) in enumerate(zip(outputs, choices, strict=True)):
        tokens, logprobs = reference_run(setup["references"][choice], prompts[i])
        sample = output.outputs[0]
        assert sample.token_ids == tokens, f"request {i} ({choice})"
        for step, want in enumerate(logprobs):
            got = torch.tensor([sample.logprobs[step][t].logprob for t in range(len(VOCAB))])
            scale = max(1.0, float(want.abs().max()))
            torch.testing.assert_close(got.double(), want, atol=1e-4 * scale, rtol=0)


def test_each_adapter_changes_greedy_tokens(setup) -> None:
    prompts = [prompt(i) for i in range(4)]
    base = [reference_run(setup["references"][None], p)[0] for p in prompts]
    for name in PEFT_CONFIGS:
        assert [reference_run(setup["references"][name], p)[0] for p in prompts] != base, name


@pytest.mark.parametrize("tp", [1, 2])
def test_a_mixed_batch_matches_peft_with_each_adapter_alone(setup, tp) -> None:
    """Also over two tensor-parallel worker processes: each holds its rank's rows of B
    (column-parallel layers) or columns of A (row-parallel, summed with the base)."""
    choices = ["sql", "chat", "code", None, "chat", "sql", None, "code"]
    prompts = [prompt(i) for i in range(len(choices))]
    llm = engine(setup, tensor_parallel_size=tp)
    try:
        outputs = generate(llm, setup, choices, prompts)
    finally:
        llm.engine.shutdown()
    assert_matches_peft(setup, outputs, choices, prompts)


def test_two_slots_serve_three_adapters_with_at_most_two_per_step(setup) -> None:
    llm = engine(setup, max_loras=2)
    manager = llm.engine.core.executor.worker.lora
    per_step: list[int] = []
    activate = manager.activate
    manager.activate = lambda requests: per_step.append(len(requests)) or activate(requests)
    choices = ["sql", "chat", "code", "code", "sql", "chat"]
    prompts = [prompt(i) for i in range(len(choices))]
    outputs = generate(llm, setup, choices, prompts)
    assert_matches_peft(setup, outputs, choices, prompts)
    assert max(per_step) == 2 and len(manager.slots) == 2


def test_prefix_cache_is_shared_within_an_adapter_and_never_across(setup) -> None:
    llm = engine(setup)
    shared = prompt(3, length=37)  # 40 tokens: two full blocks of 16

    def cached(choice: str | None) -> int:
        (output,) = generate(llm, setup, [choice], [shared])
        return output.num_cached_tokens

    assert cached("sql") == 0
    assert cached("chat") == 0  # same tokens, other adapter: no hit
    assert cached(None) == 0  # nor for the base model
    assert cached("sql") == 32  # same adapter: both full blocks
    assert cached(None) == 32


def test_lora_requests_must_align_with_prompts(setup) -> None:
    llm = engine(setup)
    with pytest.raises(ValueError, match="lora_request has 1 entries for 2 prompts"):
        llm.generate([prompt(0), prompt(1)], GREEDY, lora_request=[setup["requests"]["sql"]])


def test_an_id_or_name_cannot_name_two_adapters(setup) -> None:
    llm = engine(setup)
    sql = setup["requests"]["sql"]
    llm.generate([prompt(0)], GREEDY, use_tqdm=False, lora_request=sql)
    other = LoRARequest("other", sql.lora_int_id, setup["requests"]["chat"].lora_path)
    with pytest.raises(ValueError, match="lora_int_id"):
        llm.generate([prompt(0)], GREEDY, use_tqdm=False, lora_request=other)
    renamed = LoRARequest("sql", 42, setup["requests"]["chat"].lora_path)
    with pytest.raises(ValueError, match="lora_name"):
        llm.generate([prompt(0)], GREEDY, use_tqdm=False, lora_request=renamed)


def test_lora_requests_are_refused_without_enable_lora(setup) -> None:
    llm = LLM(
        str(setup["root"] / "base"), dtype="float32", max_model_len=64, kv_cache_memory="4MiB"
    )
    with pytest.raises(ValueError, match="--enable-lora"):
        llm.generate([prompt(0)], GREEDY, lora_request=setup["requests"]["sql"])
