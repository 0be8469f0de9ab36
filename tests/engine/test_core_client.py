"""EngineCoreClient: one contract, two implementations, on a tiny random-weight model.

The same scenario (start, add, abort, utility, outputs until done) runs through the
in-process client, inline as LLMEngine drives it, and through the process client on an
event loop as AsyncLLM drives it (it spawns an engine-core interpreter: a few seconds).
Greedy tokens are checked against transformers under the determinism policy.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import tempfile
from collections import defaultdict

import pytest
from determinism import assert_greedy_equivalent
from tiny_engine_checkpoint import (
    EOS_TOKEN_ID,
    engine_args,
    greedy_reference,
    next_token_logits,
    reference_model,
    write_tiny_checkpoint,
)

from core.engine.core_client import (
    EngineCoreClient,
    EngineDeadError,
    InprocClient,
    MPClient,
    run_inline,
)
from core.engine.processor import EngineSetup
from core.engine.protocol import EngineCoreRequest, FinishReason
from core.sampling_params import SamplingParams

KEPT_PROMPT = [3, 4, 5, 6, 7]
DROPPED_PROMPT = [8, 9, 10]
NUM_KEPT_TOKENS = 6


@pytest.fixture(scope="module")
def setup(tiny_checkpoint) -> EngineSetup:
    return EngineSetup.from_engine_args(engine_args(tiny_checkpoint))


def greedy_request(request_id: str, prompt: list[int], max_tokens: int) -> EngineCoreRequest:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=params,
        eos_token_id=EOS_TOKEN_ID,
        arrival_time=0.0,
    )


async def scenario(client: EngineCoreClient) -> tuple[dict, dict[str, list[int]], dict]:
    """Start; queue a request and abort it, queue another and collect it to the end."""
    info = await client.start()
    # Unaborted, "dropped" would finish (3 tokens) long before "kept" (6 tokens).
    await client.add_request(greedy_request("dropped", DROPPED_PROMPT, 3))
    await client.abort_requests(["dropped", "never-added"])
    await client.add_request(greedy_request("kept", KEPT_PROMPT, NUM_KEPT_TOKENS))
    await client.utility("reset_prefix_cache")
    with pytest.raises(ValueError, match="'shutdown' is not one of"):
        await client.utility("shutdown")
    tokens: dict[str, list[int]] = defaultdict(list)
    finished: dict[str, FinishReason] = {}
    while "kept" not in finished:
        for output in (await client.get_outputs()).outputs:
            tokens[output.request_id] += output.new_token_ids
            if output.finished:
                finished[output.request_id] = output.finish_reason
    return info, tokens, finished


def check_outcome(tokens: dict[str, list[int]], finished: dict) -> None:
    assert finished == {"kept": FinishReason.LENGTH}
    model = reference_model()
    assert_greedy_equivalent(
        tokens["kept"],
        greedy_reference(model, KEPT_PROMPT, NUM_KEPT_TOKENS),
        lambda context: next_token_logits(model, context),
        KEPT_PROMPT,
        "kept",
    )
    assert len(tokens["kept"]) == NUM_KEPT_TOKENS


def test_in_process_client_serves_the_contract_inline(setup):
    client = InprocClient(setup)
    try:
        info, tokens, finished = run_inline(scenario(client))
        assert info["pid"] == os.getpid() and info["num_blocks"] > 1
        check_outcome(tokens, finished)
        assert not client.core.has_unfinished_requests()  # the aborted one is gone too
        assert client.is_alive and client.dead_reason is None
    finally:
        client.shutdown()
    with pytest.raises(EngineDeadError, match="not running"):
        run_inline(client.add_request(greedy_request("late", KEPT_PROMPT, 1)))


def test_process_client_serves_the_contract_and_reports_its_death(setup):
    async def run() -> None:
        client = MPClient(setup)
        try:
            info, tokens, finished = await scenario(client)
            assert info["pid"] != os.getpid() and info["num_blocks"] > 1
            check_outcome(tokens, finished)
            os.kill(info["pid"], signal.SIGKILL)
            with pytest.raises(EngineDeadError, match="exited"):
                async with asyncio.timeout(10):
                    while True:  # outputs sent before the kill come first
                        await client.get_outputs()
            assert not client.is_alive and "exited" in client.dead_reason
            with pytest.raises(EngineDeadError):
                await client.add_request(greedy_request("late", KEPT_PROMPT, 1))
        finally:
            client.shutdown()

    asyncio.run(run())


def test_run_inline_refuses_a_coroutine_that_waits():
    async def waits() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="never waits"):
        run_inline(waits())


def test_the_process_clients_ipc_directory_goes_with_shutdown_or_with_the_client(
    setup, tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shut = MPClient(setup)
    assert len(list(tmp_path.glob("core-ipc-*"))) == 1
    shut.shutdown()
    assert not list(tmp_path.glob("core-ipc-*"))
    forgotten = MPClient(setup)  # never shut down, e.g. by an embedding application
    assert len(list(tmp_path.glob("core-ipc-*"))) == 1
    forgotten.ctx.destroy(linger=0)  # its sockets go, as at exit (else pyzmq warns)
    del forgotten
    gc.collect()
    assert not list(tmp_path.glob("core-ipc-*"))


def test_an_engine_core_that_fails_to_start_says_why_in_plain_text(tmp_path):
    """The engine core's error crosses the socket msgpack-encoded; the client decodes it."""
    checkpoint = write_tiny_checkpoint(tmp_path / "tiny")
    broken = EngineSetup.from_engine_args(engine_args(checkpoint))
    for weights in checkpoint.glob("*.safetensors"):
        weights.unlink()  # the setup read config.json; the engine core finds no weights

    async def run() -> None:
        client = MPClient(broken)
        try:
            with pytest.raises(EngineDeadError) as failed:
                await client.start()
        finally:
            client.shutdown()
        message = str(failed.value)
        assert message.startswith("engine core failed to start: ")
        reason = message.removeprefix("engine core failed to start: ")
        assert reason.isprintable() and reason.split(":")[0].endswith("Error"), message

    asyncio.run(run())
