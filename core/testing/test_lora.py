"""Conformance of a LoRA implementation (`--core-conformance=lora:NAME`, an entry name).

The LoRAManager contract (core.lora.interface), checked through the engine it serves:

- The layer seam: every q/k/v/o/gate/up/down projection of the model is wrapped
  (`LinearBase.wrap_linear_method`), the wrapper's `base` is the method the layer had and
  the base's parameters are the same objects with the same values.
- Mixed batches: on a tiny random llama (written here by transformers) one batch mixes
  three PEFT adapters of different ranks, scalings (one rsLoRA) and target modules with the
  base model; each request's greedy tokens and full-vocabulary logprobs at every step are
  those of transformers running the model with that adapter merged into its weights
  (W + scaling * B @ A; logprobs within 1e-4).
- Slots: with fewer slots (`max_loras`) and host entries (`max_cpu_loras`) than adapters,
  the same batch completes with the same outputs (adapters are evicted and reloaded);
  `activate` never evicts an adapter of the step and refuses more than `max_loras`.
- Refusals: an adapter whose rank is above `max_lora_rank`, that targets a module the
  model has no LoRA layer for, or whose files are missing, is a ValueError naming the
  adapter, before anything is queued; the engine keeps serving.
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch
import transformers

from core import LLM, LoRARequest, SamplingParams
from core.lora.interface import LoRAManager
from core.models.layers.linear import LinearBase
from core.quantization.interface import WrappedLinearMethod
from core.testing.lora_adapters import AdapterSpec, merged_model, write_adapter
from core.testing.plugin import targets_of
from core.testing.tiny_checkpoint import VOCAB, reference_model, write_tiny_checkpoint

ADAPTERS = {
    "attn": AdapterSpec(rank=4, alpha=8, targets=("q_proj", "v_proj"), seed=1),
    "all": AdapterSpec(
        rank=8,
        alpha=4,
        targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        use_rslora=True,
        seed=2,
    ),
    "mlp": AdapterSpec(rank=2, alpha=6, targets=("gate_proj", "down_proj", "o_proj"), seed=3),
}
MAX_TOKENS = 6
GREEDY = SamplingParams(
    temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=len(VOCAB)
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "lora_name" in metafunc.fixturenames:
        targets = targets_of(metafunc.config, "lora")
        metafunc.parametrize("lora_name", [pytest.param(t.spec.name, id=t.id) for t in targets])


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    """The base checkpoint, the adapters' requests and the merged references."""
    root = tmp_path_factory.mktemp("lora")
    base = reference_model(seed=4)
    write_tiny_checkpoint(root / "base", base)
    requests, references = {}, {"base": base}
    for index, (name, spec) in enumerate(ADAPTERS.items(), start=1):
        deltas = write_adapter(root / name, base, spec)
        requests[name] = LoRARequest(name, index, str(root / name))
        references[name] = merged_model(base, deltas, spec.scaling)
    return {"root": root, "requests": requests, "references": references}


def prompts() -> list[list[int]]:
    words = [VOCAB[f"w{i}"] for i in range(45)]
    return [[words[(7 * i + 3 * j) % 45] for j in range(5 + 3 * i)] for i in range(8)]


# Request i runs with CHOICE[i] (None: the base model): every adapter and the base, twice.
CHOICE = ["attn", "all", None, "mlp", "mlp", None, "all", "attn"]


def engine(setup: dict, lora_name: str, **overrides) -> LLM:
    settings = dict(
        dtype="float32",
        max_model_len=64,
        kv_cache_memory="4MiB",
        enable_lora=True,
        max_loras=3,
        max_lora_rank=8,
        max_logprobs=len(VOCAB),
        lora_implementation=lora_name,
    )
    return LLM(str(setup["root"] / "base"), **{**settings, **overrides})


def reference_run(model: transformers.PreTrainedModel, prompt: list[int]):
    """Greedy tokens and each step's log-softmax [V] of `model`."""
    tokens, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            step = torch.log_softmax(model(torch.tensor([tokens])).logits[0, -1].double(), -1)
            logprobs.append(step)
            tokens.append(int(step.argmax()))
    return tokens[len(prompt) :], logprobs


def check_outputs(setup: dict, outputs, choices: list[str | None]) -> None:
    for i, (output, choice) in enumerate(zip(outputs, choices, strict=True)):
        model = setup["references"][choice or "base"]
        want_tokens, want_logprobs = reference_run(model, prompts()[i])
        sample = output.outputs[0]
        assert sample.token_ids == want_tokens, f"request {i} ({choice})"
        for step, (got, want) in enumerate(zip(sample.logprobs, want_logprobs, strict=True)):
            got_row = torch.tensor([got[t].logprob for t in range(len(VOCAB))], dtype=torch.float64)
            scale = max(1.0, float(want.abs().max()))
            assert torch.allclose(got_row, want, atol=1e-4 * scale), f"request {i} step {step}"


def run(llm: LLM, setup: dict, choices: list[str | None]):
    loras = [None if c is None else setup["requests"][c] for c in choices]
    return llm.generate(prompts(), GREEDY, use_tqdm=False, lora_request=loras)


def worker_lora(llm: LLM) -> LoRAManager:
    return llm.engine.core.executor.worker.lora


def test_adapters_change_the_output(setup) -> None:
    """Guards the other checks: with these weights every adapter changes greedy tokens."""
    base = [reference_run(setup["references"]["base"], p)[0] for p in prompts()]
    for name in ADAPTERS:
        adapted = [reference_run(setup["references"][name], p)[0] for p in prompts()]
        assert adapted != base, name


def test_every_projection_is_wrapped_around_its_own_method(setup, lora_name) -> None:
    plain = LLM(
        str(setup["root"] / "base"), dtype="float32", max_model_len=64, kv_cache_memory="4MiB"
    )
    before = {
        name: type(module.linear_method)
        for name, module in plain.engine.core.executor.worker.model.named_modules()
        if isinstance(module, LinearBase)
    }
    llm = engine(setup, lora_name)
    model = llm.engine.core.executor.worker.model
    layers = {name: m for name, m in model.named_modules() if isinstance(m, LinearBase)}
    assert set(layers) == set(before) and layers
    for name, layer in layers.items():
        method = layer.linear_method
        assert isinstance(method, WrappedLinearMethod), name
        assert type(method.base) is before[name], name
    reference = dict(setup["references"]["base"].named_parameters())
    q = layers["model.layers.0.self_attn.qkv_proj"].weight
    assert torch.equal(
        q[: reference["model.layers.0.self_attn.q_proj.weight"].shape[0]],
        reference["model.layers.0.self_attn.q_proj.weight"],
    )


def test_mixed_batch_matches_each_adapter_merged(setup, lora_name) -> None:
    llm = engine(setup, lora_name)
    check_outputs(setup, run(llm, setup, CHOICE), CHOICE)


def test_fewer_slots_than_adapters_gives_the_same_outputs(setup, lora_name) -> None:
    llm = engine(setup, lora_name, max_loras=1, max_cpu_loras=2)
    activated: list[set[int]] = []
    manager = worker_lora(llm)
    activate = manager.activate

    def spy(requests):
        activated.append({r.lora_int_id for r in requests})
        return activate(requests)

    manager.activate = spy
    check_outputs(setup, run(llm, setup, CHOICE), CHOICE)
    assert activated and max(len(ids) for ids in activated) == 1
    assert len(manager.slots) == 1


def test_activate_keeps_the_step_adapters_and_refuses_too_many(setup, lora_name) -> None:
    llm = engine(setup, lora_name, max_loras=2)
    manager = worker_lora(llm)
    attn, all_, mlp = (setup["requests"][n] for n in ("attn", "all", "mlp"))
    slots = manager.activate({attn, all_})
    assert sorted(slots.values()) == [0, 1]
    again = manager.activate({attn, mlp})
    assert again[attn.lora_int_id] == slots[attn.lora_int_id]  # kept its slot
    assert again[mlp.lora_int_id] == slots[all_.lora_int_id]  # took the idle one's
    with pytest.raises(ValueError):
        manager.activate({attn, all_, mlp})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ("rank", "r"),
        ("target", "target_modules"),
        ("missing", "lora_path"),
    ],
)
def test_an_unservable_adapter_is_refused_naming_it(setup, lora_name, tmp_path, change, field):
    base = setup["references"]["base"]
    directory = tmp_path / "bad"
    if change == "rank":
        write_adapter(directory, base, AdapterSpec(rank=16, alpha=16, targets=("q_proj",)))
    elif change == "target":
        write_adapter(directory, base, AdapterSpec(rank=4, alpha=8, targets=("q_proj",)))
        config = (directory / "adapter_config.json").read_text()
        (directory / "adapter_config.json").write_text(
            config.replace('"q_proj"', '"q_proj", "embed_tokens"')
        )
    else:
        shutil.copytree(setup["root"] / "attn", directory)
        (directory / "adapter_model.safetensors").unlink()
    llm = engine(setup, lora_name)
    bad = LoRARequest("bad-adapter", 9, str(directory))
    with pytest.raises(ValueError, match=r"bad-adapter") as caught:
        llm.generate(prompts()[:1], GREEDY, use_tqdm=False, lora_request=bad)
    assert field in str(caught.value)
    assert not llm.engine.has_unfinished_requests()
    check_outputs(setup, run(llm, setup, CHOICE), CHOICE)  # still serving


def test_scaling_is_rslora_aware() -> None:
    """Guards the reference: rsLoRA divides by sqrt(r), LoRA by r."""
    assert AdapterSpec(4, 8, ("q_proj",), use_rslora=True).scaling == 8 / math.sqrt(4)
    assert AdapterSpec(4, 8, ("q_proj",)).scaling == 2.0
