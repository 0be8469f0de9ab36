"""A real `core serve --enable-lora` over a tiny random Llama and PEFT adapters made here,
driven by the openai client: each request's greedy tokens are those of transformers + peft
with the adapter its `model` names, in batches that mix adapters and the base model.

Needs core-lora (the `default` entry of `core.lora`).
"""

from __future__ import annotations

import asyncio
import copy
from importlib.metadata import entry_points
from pathlib import Path

import httpx
import openai
import pytest
import torch
import transformers
from determinism import assert_greedy_equivalent
from server_process import ServerProcess
from tiny_engine_checkpoint import VOCAB, next_token_logits, write_tiny_checkpoint
from tp_checkpoint import tp_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not entry_points(group="core.lora", name="default"),
        reason="core-lora is not installed (optional plugin)",
    ),
]

API_KEY = "sesame"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_TOKENS = 8
PROMPT = [VOCAB[w] for w in ("<s>", "w3", "w14", "w15", "w9", "w26")]
# name -> (rank, alpha, target modules): different ranks and targets, all within rank 8.
ADAPTERS = {
    "sql": (8, 16, ["q_proj", "v_proj"]),
    "chat": (4, 8, ["k_proj", "o_proj", "down_proj"]),
    "math": (6, 12, ["gate_proj", "up_proj"]),  # loaded at runtime
}


def with_adapter(base: transformers.LlamaForCausalLM, name: str, seed: int):
    """A copy of `base` with a random-weight adapter (B nonzero, so it changes outputs)."""
    import peft

    rank, alpha, targets = ADAPTERS[name]
    torch.manual_seed(seed)
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False
    )
    return peft.get_peft_model(copy.deepcopy(base), config).eval()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Holds the checkpoint (base/) and the adapters (adapters/NAME/)."""
    return tmp_path_factory.mktemp("lora")


@pytest.fixture(scope="module")
def references(root) -> dict[str | None, torch.nn.Module]:
    """{adapter name (None: base): its transformers (+ peft) model}, written under root."""
    base = tp_model(vocab=VOCAB)
    write_tiny_checkpoint(root / "base", base)
    models: dict[str | None, torch.nn.Module] = {None: base}
    for seed, name in enumerate(ADAPTERS, start=1):
        models[name] = with_adapter(base, name, seed)
        models[name].save_pretrained(root / "adapters" / name)
    return models


@pytest.fixture(scope="module")
def server(root, references):
    process = ServerProcess(
        str(root / "base"),
        "--dtype", "float32", "--max-model-len", "64", "--kv-cache-memory", "16MiB",
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
        "--lora-modules", f"sql={root / 'adapters' / 'sql'}", f"chat={root / 'adapters' / 'chat'}",
        "--api-key", API_KEY,
        env={"CORE_ALLOW_RUNTIME_LORA_UPDATING": "1"},
    )  # fmt: skip
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    tokens = list(prompt)
    for _ in range(MAX_TOKENS):
        tokens.append(int(next_token_logits(model, tokens).argmax()))
    return tokens[len(prompt) :]


def complete_all(server: ServerProcess, models: list[str], prompt: list[int]) -> list[tuple]:
    """`complete`'s answer for `prompt` with each of `models`, all requests sent at once
    (so they share batches)."""

    async def run() -> list[tuple]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        async with client:
            return await asyncio.gather(*(complete(client, m, prompt) for m in models))

    return asyncio.run(run())


async def complete(
    client: openai.AsyncOpenAI, model: str, prompt: list[int]
) -> tuple[list[int], list[dict[str, float]]]:
    """The greedy tokens and each step's top-5 logprobs {token: logprob}."""
    out = await client.completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=5,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert out.model == model
    logprobs = out.choices[0].logprobs
    return [VOCAB[token] for token in logprobs.tokens], logprobs.top_logprobs


def check_against_reference(references, model: str | None, ours: list[int], prompt: list[int]):
    reference = references[model]
    assert_greedy_equivalent(
        ours,
        greedy(reference, prompt),
        lambda tokens: next_token_logits(reference, tokens),
        prompt,
        label=f"adapter {model}",
    )


def test_adapters_change_the_reference_outputs(references):
    """Guards the tests below: each adapter's greedy tokens differ from the others'."""
    outputs = {name: tuple(greedy(model, PROMPT)) for name, model in references.items()}
    assert len(set(outputs.values())) == len(outputs), outputs


def test_models_lists_the_adapters_under_the_base_model(server, root):
    response = httpx.get(f"{server.url}/v1/models", headers=AUTH)
    cards = [(c["id"], c["root"], c["parent"]) for c in response.json()["data"]]
    assert cards == [
        ("base", str(root / "base"), None),
        ("sql", str(root / "adapters" / "sql"), "base"),
        ("chat", str(root / "adapters" / "chat"), "base"),
    ]


def check_logprobs(reference, ours: list[int], top: list[dict[str, float]], prompt: list[int]):
    """Each step's top-5 logprobs are the reference's log-softmax after the same tokens
    (within 1e-4 of the logit scale). Special tokens' text is "" in logprobs, so only the
    word tokens among the five are compared (at least three: the vocabulary is mostly words)."""
    for step, top_step in enumerate(top):
        logits = next_token_logits(reference, prompt + ours[:step]).double()
        want = torch.log_softmax(logits, -1)
        scale = max(1.0, float(logits.abs().max()))
        words = {text: logprob for text, logprob in top_step.items() if text in VOCAB}
        assert len(words) >= 3, top_step
        for text, logprob in words.items():
            assert abs(logprob - float(want[VOCAB[text]])) <= 1e-4 * scale, (step, text)


def test_one_batch_mixing_adapters_and_the_base_model_matches_peft(server, references):
    models = ["sql", "base", "chat", "sql", "chat", "base"]
    for model, (ours, top) in zip(models, complete_all(server, models, PROMPT), strict=True):
        name = None if model == "base" else model
        check_against_reference(references, name, ours, PROMPT)
        check_logprobs(references[name], ours, top, PROMPT)


def test_chat_with_an_adapter_echoes_its_name_and_matches_peft(server, references):
    messages = [{"role": "user", "content": "w5 w6 w7"}]
    prompt = httpx.post(
        f"{server.url}/tokenize", json={"model": "chat", "messages": messages}, headers=AUTH
    ).json()["tokens"]
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    reply = api.chat.completions.create(
        model="chat", messages=messages, max_tokens=MAX_TOKENS, temperature=0, logprobs=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert reply.model == "chat"
    ours = [VOCAB[c.token] for c in reply.choices[0].logprobs.content]
    check_against_reference(references, "chat", ours, prompt)


def test_adapter_loaded_at_runtime_serves_then_unloads(server, root, references):
    url = server.url
    body = {"lora_name": "math", "lora_path": str(root / "adapters" / "math")}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=body).status_code == 401
    loaded = httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=AUTH, timeout=30)
    assert (loaded.status_code, loaded.text) == (
        200,
        "Success: LoRA adapter 'math' added successfully.",
    )
    models = list(ADAPTERS)  # three adapters at once, in two slots
    for model, (ours, _) in zip(models, complete_all(server, models, PROMPT), strict=True):
        check_against_reference(references, model, ours, PROMPT)

    unload = {"lora_name": "math"}
    removed = httpx.post(f"{url}/v1/unload_lora_adapter", json=unload, headers=AUTH)
    assert removed.status_code == 200
    with pytest.raises(openai.NotFoundError):
        complete_all(server, ["math"], PROMPT)


def long_prompt(start: int) -> list[int]:
    """<s> and 33 words: two full KV blocks of 16."""
    return [VOCAB["<s>"], *(VOCAB[f"w{i}"] for i in range(start, start + 33))]


def greedy_is_words(model: torch.nn.Module, prompt: list[int]) -> bool:
    """Whether every greedy token is a word (special tokens have no text in logprobs)."""
    return all(token >= VOCAB["w0"] for token in greedy(model, prompt))


def test_a_name_reloaded_with_other_weights_never_reuses_the_old_prefix_cache(
    server, root, references
):
    """Unload an adapter and load other weights under its name: the same prompt (two full
    KV blocks, so the first request leaves them cached) answers with the new weights."""
    prompt = next(
        candidate
        for start in range(0, 200, 7)
        if all(
            greedy_is_words(references[name], candidate := long_prompt(start))
            for name in ("math", "chat")
        )
    )
    url = server.url
    for source in ("math", "chat"):
        body = {"lora_name": "swap", "lora_path": str(root / "adapters" / source)}
        loaded = httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=AUTH, timeout=30)
        assert loaded.status_code == 200, loaded.text
        ((ours, _),) = complete_all(server, ["swap"], prompt)
        check_against_reference(references, source, ours, prompt)
        unload = {"lora_name": "swap"}
        assert httpx.post(f"{url}/v1/unload_lora_adapter", json=unload, headers=AUTH).is_success


def test_hostile_adapters_are_400s_and_the_server_keeps_answering(server, root):
    """Loading runs off the event loop and bounded: a rank_pattern regex that backtracks for
    minutes, a config nested past any parser, a path longer than the file system takes.
    Each is a 400 on the same keep-alive connection, and /health answers meanwhile."""
    import json
    import shutil
    import threading

    hostile = {
        "slow-pattern": {"rank_pattern": {r"(?:(\w)\1?|.)+\d{3}": 2}},
        "deep-config": None,
    }
    for name, change in hostile.items():
        path = root / "adapters" / name
        shutil.copytree(root / "adapters" / "sql", path, dirs_exist_ok=True)
        config_file = path / "adapter_config.json"
        if change is None:
            config_file.write_text('{"r": 8, "x": ' + "[" * 50_000 + "]" * 50_000 + "}")
        else:
            config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **change}))
    paths = [str(root / "adapters" / name) for name in hostile] + ["/tmp/" + "a" * 5000]

    healthy: list[int] = []
    stop = threading.Event()

    def probe_health() -> None:
        while not stop.is_set():
            healthy.append(httpx.get(f"{server.url}/health", timeout=5).status_code)

    prober = threading.Thread(target=probe_health)
    prober.start()
    try:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as client:
            for path in paths:
                body = {"lora_name": "hostile", "lora_path": path}
                answer = client.post("/v1/load_lora_adapter", json=body)
                assert answer.status_code == 400, answer.text
                assert answer.json()["error"]["param"] == "lora_path"
            assert client.get("/v1/models").status_code == 200  # the connection still works
    finally:
        stop.set()
        prober.join()
    assert healthy and set(healthy) == {200}


def test_metrics_show_one_lora_info_series(server):
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    series = [
        s.labels
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "vllm:lora_requests_info"
    ]
    assert len(series) == 1 and series[0]["max_lora"] == "2"


def test_adapter_the_engine_cannot_serve_stops_startup(root, references):
    process = ServerProcess(
        str(root / "base"),
        "--dtype", "float32", "--max-model-len", "64", "--kv-cache-memory", "16MiB",
        "--enable-lora", "--max-lora-rank", "4",
        "--lora-modules", f"sql={root / 'adapters' / 'sql'}",
    )  # fmt: skip
    try:
        returncode = process.proc.wait(timeout=120)
    finally:
        process.stop()
    log = process.log.read_text()
    assert returncode == 1, log
    assert f"Error: --lora-modules sql={root / 'adapters' / 'sql'}: LoRA adapter 'sql'" in log
