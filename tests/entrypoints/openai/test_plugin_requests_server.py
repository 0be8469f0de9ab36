"""A real `core serve` with a logits-processor plugin and a stat-logger plugin installed
(tests/plugin_sources.py, on PYTHONPATH): the processor changes only the requests whose
`vllm_xargs` ask for it, batched with others; the stat logger hears the engine; and
`prompt_logprobs` come back from the real engine."""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
import pytest
from plugin_sources import (
    BAN_TOKENS_ENTRY_POINTS,
    STAT_RECORDS_ENTRY_POINTS,
    ban_tokens_logits_processor,
    install_distribution,
    records_stat_logger,
)
from server_process import ServerProcess
from tiny_engine_checkpoint import VOCAB, write_tiny_checkpoint

pytestmark = pytest.mark.slow

MODEL = "tiny-words"
KEPT = VOCAB["w9"]
# Every token but w9: a request banning them can only ever say w9.
BAN_ALL_BUT_W9 = {"banned_token_ids": [i for i in range(len(VOCAB)) if i != KEPT]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    install_distribution(
        site, "acme-ban-tokens", BAN_TOKENS_ENTRY_POINTS, ban_tokens_logits_processor()
    )
    install_distribution(
        site, "acme-stat-records", STAT_RECORDS_ENTRY_POINTS, records_stat_logger()
    )
    records = tmp_path_factory.mktemp("records") / "records.jsonl"
    model_dir = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    pythonpath = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": pythonpath, "CORE_TEST_STAT_RECORDS": str(records),
           "CORE_LOG_STATS_INTERVAL": "0.2"}  # fmt: skip
    process = ServerProcess(
        str(model_dir), "--served-model-name", MODEL, "--dtype", "float32",
        "--max-model-len", "64", "--kv-cache-memory", "1MiB", env=env,
    ).wait_ready()  # fmt: skip
    yield process, records
    process.stop()


def completion(prompt: str, **fields) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, **fields}  # fmt: skip


async def texts(url: str, bodies: list[dict]) -> list[str]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        responses = await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))
    return [r.json()["choices"][0]["text"] for r in responses]


def test_the_plugin_changes_only_the_requests_whose_vllm_xargs_ask(server):
    process, _ = server
    prompts = ["w1 w2", "w3 w4 w5", "w6"]
    alone = [asyncio.run(texts(process.url, [completion(p)]))[0] for p in prompts]
    bodies = [completion(prompts[0]), completion(prompts[1], vllm_xargs=BAN_ALL_BUT_W9),
              completion(prompts[2])]  # fmt: skip
    together = asyncio.run(texts(process.url, bodies))
    assert together[0] == alone[0] and together[2] == alone[2]
    assert together[1].split() == ["w9"] * 4 != alone[1].split()
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "w1"}], "max_tokens": 3,
            "temperature": 0, "ignore_eos": True, "vllm_xargs": BAN_ALL_BUT_W9}  # fmt: skip
    answer = httpx.post(f"{process.url}/v1/chat/completions", json=chat, timeout=60).json()
    assert answer["choices"][0]["message"]["content"].split() == ["w9"] * 3


def test_arguments_the_plugin_refuses_are_a_400_naming_vllm_xargs(server):
    process, _ = server
    body = completion("w1", vllm_xargs={"banned_token_ids": "w1"})
    response = httpx.post(f"{process.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "vllm_xargs" and "banned_token_ids must be" in error["message"]


def test_prompt_logprobs_come_back_from_the_engine(server):
    process, _ = server
    prompt = [VOCAB["w1"], VOCAB["w2"], VOCAB["w3"]]
    body = completion("", prompt_logprobs=1) | {"prompt": prompt}
    (choice,) = httpx.post(f"{process.url}/v1/completions", json=body, timeout=60).json()["choices"]
    first, *positions = choice["prompt_logprobs"]
    assert first is None and len(positions) == 2
    for position, token in zip(positions, prompt[1:], strict=True):
        assert str(token) in position and len(position) <= 2
        assert position[str(token)]["decoded_token"].strip() in VOCAB
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "w1"}], "max_tokens": 1,
            "prompt_logprobs": 0}  # fmt: skip
    answer = httpx.post(f"{process.url}/v1/chat/completions", json=chat, timeout=60).json()
    assert answer["prompt_logprobs"][0] is None
    assert len(answer["prompt_logprobs"]) == answer["usage"]["prompt_tokens"]


def test_the_stat_logger_plugin_hears_the_engine(server):
    process, records = server
    asyncio.run(texts(process.url, [completion("w1")]))
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(line) for line in records.read_text().splitlines()]
        calls = [line["call"] for line in lines]
        if "log" in calls or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert calls[:2] == ["init", "initialized"] and "log" in calls
    steps = [line for line in lines if line["call"] == "record"]
    assert {line["engine"] for line in steps} == {0}
    assert sum(line["generated"] for line in steps) >= 4
