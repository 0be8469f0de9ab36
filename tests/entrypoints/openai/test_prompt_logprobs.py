"""vLLM's `prompt_logprobs` on /v1/completions (on each choice) and /v1/chat/completions (on
the response): asked for, they reach the engine and come back per prompt position, None
first, each a {token id: {logprob, rank, decoded_token}}; -1 asks for the whole vocabulary,
within --max-logprobs; a stream cannot carry them, so it is refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from stand_in_engine import StandInEngine
from tiny_engine_checkpoint import VOCAB, engine_kwargs, write_tiny_checkpoint

from core import LLM, SamplingParams
from core.config import UsageContext
from core.engine.processor import EngineSetup, InputProcessor
from core.engine_args import EngineArgs
from core.entrypoints.openai.api_server import build_app
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.outputs import CompletionOutput, Logprob, RequestOutput

CHAT = [{"role": "user", "content": "w4 w5"}]
W2, W3 = VOCAB["w2"], VOCAB["w3"]
# What the stand-in engine answers for every prompt: the second position's prompt token
# ranked 2nd; the third's token impossible (-inf, which JSON cannot carry).
PROMPT_LOGPROBS = [
    None,
    {W2: Logprob(-1.5, 2, "w2"), W3: Logprob(-0.25, 1, "w3")},
    {W3: Logprob(-math.inf, 51, "w3")},
]
EXPECTED = [
    None,
    {str(W2): {"logprob": -1.5, "rank": 2, "decoded_token": "w2"},
     str(W3): {"logprob": -0.25, "rank": 1, "decoded_token": "w3"}},
    {str(W3): {"logprob": -9999.0, "rank": 51, "decoded_token": "w3"}},
]  # fmt: skip


class PromptLogprobsEngine(StandInEngine):
    """`generate` records the SamplingParams that reach it and answers one token, with
    PROMPT_LOGPROBS when the request asked for prompt logprobs."""

    def __init__(self, processor: InputProcessor) -> None:
        super().__init__(processor)
        self.params: list[SamplingParams] = []

    async def generate(self, request_id, prepared, priority=0, lora_request=None, cache_salt=None):
        self.params.append(prepared.params)
        asked = prepared.params.prompt_logprobs is not None
        sample = CompletionOutput(0, "w7", [VOCAB["w7"]], None, None, finish_reason="length")
        yield RequestOutput(
            request_id, prepared.prompt, prepared.prompt_token_ids,
            PROMPT_LOGPROBS if asked else None, [sample], True,
        )  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def served(model_dir) -> tuple[PromptLogprobsEngine, TestClient]:
    args = EngineArgs(model=str(model_dir), max_model_len=32)
    engine = PromptLogprobsEngine(
        InputProcessor(EngineSetup.from_engine_args(args, UsageContext.SERVING))
    )
    app = build_app(engine, frontend=FrontendArgs(disable_log_stats=True))
    return engine, TestClient(app, raise_server_exceptions=False)


def test_completions_carry_them_on_every_choice(served):
    engine, client = served
    body = {"prompt": ["w1 w2 w3", "w4"], "max_tokens": 1, "prompt_logprobs": 3}
    choices = client.post("/v1/completions", json=body).json()["choices"]
    assert [c["prompt_logprobs"] for c in choices] == [EXPECTED, EXPECTED]
    assert [p.prompt_logprobs for p in engine.params[-2:]] == [3, 3]
    plain = client.post("/v1/completions", json={"prompt": "w1", "max_tokens": 1}).json()
    assert "prompt_logprobs" not in plain["choices"][0]


def test_chat_carries_them_on_the_response(served):
    engine, client = served
    body = {"messages": CHAT, "max_tokens": 1, "prompt_logprobs": 0}
    response = client.post("/v1/chat/completions", json=body).json()
    assert response["prompt_logprobs"] == EXPECTED
    assert "prompt_logprobs" not in response["choices"][0]
    assert engine.params[-1].prompt_logprobs == 0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs are not available when stream"),
        ({"prompt_logprobs": -1}, "prompt_logprobs must be <= max_logprobs (20), got -1 (the"),
        ({"prompt_logprobs": -2}, "greater than or equal to -1"),
    ],
)
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_what_cannot_be_had_is_a_400_naming_prompt_logprobs(served, route, body, says):
    response = served[1].post(route, json={"prompt": "w1", "messages": CHAT, **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "prompt_logprobs" and says in error["message"]


def test_minus_one_gives_every_token_of_the_vocabulary_where_the_cap_allows(model_dir):
    llm = LLM(**engine_kwargs(model_dir, max_logprobs=-1))
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=-1)
    (output,) = llm.generate([[VOCAB["w1"], W2, W3]], params, use_tqdm=False)
    first, *positions = output.prompt_logprobs
    assert first is None and len(positions) == 2
    for position, token in zip(positions, (W2, W3), strict=True):
        assert set(position) == set(range(len(VOCAB))) and position[token].rank >= 1
        assert math.fsum(math.exp(entry.logprob) for entry in position.values()) == pytest.approx(1)
