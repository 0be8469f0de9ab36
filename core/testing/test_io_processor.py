"""Conformance of an IO processor (`--core-conformance=io_processor:NAME`).

The class subclasses IOProcessor (checked when it is looked up) and is built as
`cls(config)` for each runner: it may refuse one with a ValueError (those checks are
skipped), never both. For every runner it serves: `parse_request` refuses garbage (None, a
boolean, a float, an empty list, an object of unknown keys) with a ValueError, the server's
400, and nothing else. With sample data (`--core-conformance-io-data NAME=JSON`, the `data`
of a /pooling request; its checks are skipped without it): the data is taken;
`validate_or_generate_params` gives the runner's kind of parameters, with and without
parameters given; `pre_process` returns prompts of the contract's shapes
(core.io_processors.prompts), as `pre_process_async` does; `post_process` answers finished
engine outputs of the runner's kind, one per prompt whatever the model wrote, and
`output_to_response` makes of that answer a value `json.dumps` takes, the same through the
async variants. Engine outputs are made up here: no model runs.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from core.config import EngineConfig, PoolerConfig
from core.io_processors import IOProcessor, prompt_parts
from core.io_processors.interface import EngineOutput, Params
from core.outputs import CompletionOutput, EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from core.pooling.params import PoolingParams
from core.sampling_params import SamplingParams
from core.testing.plugin import io_data_of, targets_of
from core.testing.targets import Target

REQUEST_ID = "conformance-0"
RUNNERS = {
    "generate": (lambda: EngineConfig(), SamplingParams),
    "pooling": (lambda: EngineConfig(pooler=PoolerConfig()), PoolingParams),
}
GARBAGE = [None, True, 3.5, [], {"core_conformance_unknown_key": [1, None]}]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    targets = targets_of(metafunc.config, "io_processor")
    metafunc.parametrize("target", [pytest.param(t, id=t.id) for t in targets])
    if "runner" in metafunc.fixturenames:
        metafunc.parametrize("runner", list(RUNNERS))


@pytest.fixture
def processor_cls(target: Target) -> type[IOProcessor]:
    return target.value


def build(processor_cls: type[IOProcessor], runner: str) -> IOProcessor | str:
    """The processor built for `runner`, or why it refused that runner."""
    try:
        return processor_cls(RUNNERS[runner][0]())
    except ValueError as exc:
        return f"refuses --runner {runner}: {exc}"


@pytest.fixture
def processor(processor_cls: type[IOProcessor], runner: str) -> IOProcessor:
    built = build(processor_cls, runner)
    if isinstance(built, str):
        pytest.skip(built)
    return built


@pytest.fixture
def data(target: Target, request: pytest.FixtureRequest) -> object:
    given = io_data_of(request.config, target.spec.name)
    if given is None:
        pytest.skip(f"no --core-conformance-io-data {target.spec.name}=JSON")
    return given


def test_serves_at_least_one_runner(processor_cls):
    refusals = [built for r in RUNNERS if isinstance(built := build(processor_cls, r), str)]
    assert len(refusals) < len(RUNNERS), "; ".join(refusals)


@pytest.mark.parametrize("garbage", GARBAGE, ids=repr)
def test_garbage_is_refused_with_a_value_error(processor, garbage):
    wrong = _refusal_error(processor, garbage)
    if wrong is not None:
        pytest.fail(f"parse_request({garbage!r}) {wrong}")


def test_params_are_of_the_runners_kind(processor, runner, data):
    processor.parse_request(data)
    kind = RUNNERS[runner][1]
    generated = processor.validate_or_generate_params()
    assert isinstance(generated, kind), f"generated {type(generated).__name__}, not {kind}"
    validated = processor.validate_or_generate_params(kind())
    assert isinstance(validated, kind), f"validated {type(validated).__name__}, not {kind}"


def test_prompts_have_the_contracts_shapes(processor, data):
    parsed = processor.parse_request(data)
    prompts = prompt_parts(processor.pre_process(parsed, REQUEST_ID))  # TypeError: a bad shape
    from_async = asyncio.run(processor.pre_process_async(parsed, REQUEST_ID))
    assert prompt_parts(from_async) == prompts, "pre_process_async differs from pre_process"


def test_the_answer_serializes_to_json(processor, runner, data):
    parsed = processor.parse_request(data)
    params = processor.validate_or_generate_params()
    num_prompts = len(prompt_parts(processor.pre_process(parsed, REQUEST_ID)))
    outputs = [made_up_output(i, params) for i in range(num_prompts)]
    response = processor.output_to_response(processor.post_process(outputs, REQUEST_ID))
    wrong = _json_error(response)
    if wrong is not None:
        pytest.fail(f"output_to_response gave what JSON cannot carry: {wrong}")
    answer = asyncio.run(processor.post_process_async(outputs, REQUEST_ID))
    assert _json(processor.output_to_response(answer)) == _json(response), (
        "post_process_async differs from post_process"
    )


def made_up_output(index: int, params: Params) -> EngineOutput:
    """A finished output of the kind `params` ask for, different for each prompt."""
    request_id, prompt_token_ids = f"{REQUEST_ID}-{index}", [1, 2, 3]
    if isinstance(params, PoolingParams):
        vector = EmbeddingOutput([0.6, 0.8 * (-1) ** index])
        return EmbeddingRequestOutput(request_id, None, prompt_token_ids, vector)
    completion = CompletionOutput(0, f"w{index} w7", [7 + index, 14], None, None, "length")
    return RequestOutput(request_id, None, prompt_token_ids, None, [completion], finished=True)


def _refusal_error(processor: IOProcessor, garbage: object) -> str | None:
    """What is wrong with how `processor` met `garbage`; None for a ValueError."""
    try:
        processor.parse_request(garbage)
    except ValueError:
        return None
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}; refuse data with ValueError (a 400)"
    return "took it; refuse it with ValueError"


def _json(value: object) -> str:
    return json.dumps(value, allow_nan=False)  # as the server's JSONResponse writes it


def _json_error(value: object) -> str | None:
    """Why JSON cannot carry `value`; None when it can."""
    try:
        _json(value)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None
