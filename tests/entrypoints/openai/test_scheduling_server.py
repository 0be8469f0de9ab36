"""A real `core serve --scheduling-policy priority` over the tiny random model: priorities
decide who runs next, X-Request-Id names the request, cache salts keep prefix caches apart,
and `core chat` / `core complete` talk to it."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess, free_port
from tiny_engine_checkpoint import VOCAB, reference_model, write_tiny_checkpoint

from core.entrypoints.cli import cli

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 8192  # room for a request that runs until the test stops it


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("tiny")
    write_tiny_checkpoint(model_dir, reference_model(max_position_embeddings=MAX_MODEL_LEN))
    process = ServerProcess(
        str(model_dir), "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
        "--kv-cache-memory", "8MiB", "--max-num-seqs", "1", "--scheduling-policy", "priority",
        "--enable-log-requests", "--max-log-len", "200",
    )  # fmt: skip
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def sample_total(metrics: str, suffix: str) -> float:
    """The sum of the /metrics samples whose name ends with `suffix` (whatever prefix)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name.endswith(suffix)
    )


async def wait_for_waiting(client: httpx.AsyncClient, count: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        metrics = (await client.get("/metrics")).text
        if sample_total(metrics, "num_requests_waiting") == count:
            return
        assert time.monotonic() < deadline, f"never {count} waiting requests"
        await asyncio.sleep(0.05)


def test_a_high_priority_request_sent_last_runs_before_earlier_low_priority_ones(server):
    """One running slot (max_num_seqs 1) held by `blocker`; "b" and "c" (priority 5) queue
    up, then "urgent" (priority 0, lower runs first). Once the blocker leaves, the
    scheduler must pick "urgent" first: it finishes before both, though it came last."""
    body = {"prompt": "w1 w2 w3", "max_tokens": 8, "ignore_eos": True, "priority": 5}
    finished: list[str] = []

    async def complete(client: httpx.AsyncClient, name: str, priority: int) -> None:
        response = await client.post("/v1/completions", json={**body, "priority": priority})
        assert response.status_code == 200, response.text
        finished.append(name)

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            blocker = {**body, "max_tokens": MAX_MODEL_LEN - 16, "stream": True}
            async with client.stream("POST", "/v1/completions", json=blocker) as stream:
                lines = stream.aiter_lines()  # kept: a dropped iterator closes the stream
                await anext(lines)  # the blocker's first token: it holds the slot
                # "b" must be queued before "c" is sent: equal priorities run in arrival
                # order, and two requests sent at once may arrive in either.
                b = asyncio.create_task(complete(client, "b", 5))
                await wait_for_waiting(client, 1)
                c = asyncio.create_task(complete(client, "c", 5))
                await wait_for_waiting(client, 2)
                urgent = asyncio.create_task(complete(client, "urgent", 0))
                await wait_for_waiting(client, 3)
            # Leaving the stream disconnects: the blocker is aborted and frees the slot.
            await asyncio.gather(b, c, urgent)

    asyncio.run(run())
    assert finished == ["urgent", "b", "c"]


def logged_requests(server: ServerProcess) -> dict[str, list[int]]:
    """{engine request id: logged prompt token ids} from the server's log."""
    pattern = re.compile(r"Received request (\S+): prompt: .*?, prompt_token_ids: \[([0-9, ]*)\]")
    return {
        match.group(1): [int(t) for t in match.group(2).split(",") if t.strip()]
        for match in pattern.finditer(server.log.read_text())
    }


def test_x_request_id_names_the_request_in_the_log_and_is_echoed(server):
    response = httpx.post(
        f"{server.url}/v1/completions",
        json={"prompt": "w4 w5", "max_tokens": 2},
        headers={"X-Request-Id": "trace-77"},
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "trace-77"
    assert logged_requests(server)["trace-77-0"] == [VOCAB["w4"], VOCAB["w5"]]


def test_different_cache_salts_never_share_prefix_cache_blocks(server):
    prompt = " ".join(f"w{i % 40}" for i in range(40))  # two full 16-token blocks and more

    def hits_after(salt: str) -> float:
        body = {"prompt": prompt, "max_tokens": 1, "cache_salt": salt}
        assert httpx.post(f"{server.url}/v1/completions", json=body).status_code == 200
        return sample_total(httpx.get(f"{server.url}/metrics").text, "prefix_cache_hits_total")

    first = hits_after("tenant-a")
    repeated = hits_after("tenant-a")
    assert repeated - first == 32  # the same salt: both full blocks come from the cache
    assert hits_after("tenant-b") == repeated  # another salt: nothing shared


def test_core_chat_keeps_the_conversation_and_its_system_prompt(server):
    before = set(logged_requests(server))
    args = ["chat", "--url", f"{server.url}/v1", "--system-prompt", "w9 w9"]
    result = CliRunner().invoke(cli, args, input="w1 w2\nw3\n", catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"Using model: {server_model(server)}"
    assert lines[1] == "Please enter a message for the chat model:"
    new = [ids for rid, ids in logged_requests(server).items() if rid not in before]
    assert len(new) == 2
    first, second = new
    assert contains(first, [VOCAB["w9"], VOCAB["w9"]])  # the system prompt
    assert contains(first, [VOCAB["w1"], VOCAB["w2"]])
    # The second turn's prompt holds the whole first exchange, then the new message.
    assert second[: len(first)] == first and contains(second[len(first) :], [VOCAB["w3"]])


def test_core_complete_quick_answers_once_and_exits(server):
    args = ["complete", "--url", f"{server.url}/v1", "-q", "w1 w2", "--max-tokens", "3"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    using, answer = result.output.splitlines()
    assert using == f"Using model: {server_model(server)}"
    assert len(answer.split()) <= 3  # sampled: possibly fewer words (an early end)


def server_model(server: ServerProcess) -> str:
    return httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]


def contains(tokens: list[int], part: list[int]) -> bool:
    return any(tokens[i : i + len(part)] == part for i in range(len(tokens) - len(part) + 1))


def test_a_client_without_a_server_fails_cleanly():
    args = ["chat", "--url", f"http://127.0.0.1:{free_port()}/v1", "-q", "hi"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert "cannot reach the server" in result.output
