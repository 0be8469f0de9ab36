"""The IO-processor extension point: a request's raw data in, a response's data out.

Some models are asked in a language of their own (a satellite tile, a form to fill, a list
of words) and answer in one (a mask, a filled form). An IOProcessor is that translation,
done in the frontend around ordinary engine requests: the server's `POST /pooling` and
`LLM.encode` hand it the request's `data`, it returns prompts (text, token ids, or a dict
with `multi_modal_data`), the engine runs each one as it runs any prompt (generation for
`--runner generate`, a pooled vector for `--runner pooling`), and the processor turns the
finished outputs into the answer. It is named by `--io-processor-plugin NAME` or by the
checkpoint's config.json `io_processor_plugin` (entry-point group `core.io_processors`,
value: the class), and is loaded only in the frontend process: the engine core sees plain
requests. Processors see plain data and engine outputs only, never the HTTP layer's types.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar

from core.outputs import PoolingRequestOutput, RequestOutput
from core.pooling.params import PoolingParams
from core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from core.config import EngineConfig

__all__ = [
    "EngineOutput",
    "IOProcessor",
    "InputT",
    "OutputT",
    "Params",
    "ProcessorPrompt",
    "PromptDict",
]

InputT = TypeVar("InputT")
"""What `parse_request` makes of the request's raw data."""

OutputT = TypeVar("OutputT")
"""What `post_process` makes of the engine's outputs."""

Params = SamplingParams | PoolingParams
"""The parameters of the engine requests: SamplingParams under --runner generate,
PoolingParams under --runner pooling."""

EngineOutput = RequestOutput | PoolingRequestOutput
"""One finished engine request: generated text, or a pooled output (an
EmbeddingRequestOutput from an embedding model; core.pooling.tasks)."""


class PromptDict(TypedDict, total=False):
    """A prompt as a dict: exactly one of `prompt` (text) and `prompt_token_ids`, and, for a
    multimodal model, `multi_modal_data` ({"image": an image or a list of them}), whose
    items go with the prompt's placeholders as in `LLM.generate`."""

    prompt: str
    prompt_token_ids: list[int]
    multi_modal_data: Mapping[str, Any]


ProcessorPrompt = str | list[int] | PromptDict
"""One engine request's prompt, as `pre_process` returns it."""


class IOProcessor(ABC, Generic[InputT, OutputT]):
    """Turns one request's raw data into engine prompts, and their outputs into an answer.

    Built once per frontend, as `cls(config)`, when the engine starts; a ValueError from the
    constructor (a runner or model it cannot serve) stops the start with that message. One
    instance serves every request, concurrently on the server's event loop, so per-request
    state lives in the arguments, never on `self`.

    A request runs `parse_request` -> `validate_or_generate_params` -> `pre_process` -> one
    engine request per prompt -> `post_process` -> (server only) `output_to_response`. The
    server calls the `*_async` variants, which run the sync ones unless overridden (do
    override them when the work waits on I/O, so the event loop is not held).
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @abstractmethod
    def parse_request(self, data: object) -> InputT:
        """The request's `data` (any JSON value the client sent), checked and converted to
        what `pre_process` takes. Raise ValueError, saying what is wrong, for data this
        processor cannot take: the server answers 400 naming `data`, and nothing runs."""

    def validate_or_generate_params(self, params: Params | None = None) -> Params:
        """The parameters for this request's engine requests: `params` when the caller gave
        some (check them; raise ValueError for ones this processor cannot use), else the
        processor's own. They must be of the runner's kind: SamplingParams for
        `--runner generate`, PoolingParams for `--runner pooling`.

        By default: `params`, else the runner's defaults (`SamplingParams()` or
        `PoolingParams()`).
        """
        if params is not None:
            return params
        return SamplingParams() if self.config.pooler is None else PoolingParams()

    @abstractmethod
    def pre_process(
        self, data: InputT, request_id: str | None = None
    ) -> ProcessorPrompt | Sequence[ProcessorPrompt]:
        """The prompts to run for `data` (what `parse_request` returned): one, or a
        non-empty sequence, each run as its own engine request. The engine validates them as
        it validates any prompt (a ValueError there is the client's 400); a ValueError
        raised here is a 400 too. `request_id`: the request's id, for logs and caches."""

    async def pre_process_async(
        self, data: InputT, request_id: str | None = None
    ) -> ProcessorPrompt | Sequence[ProcessorPrompt]:
        """`pre_process` for the server's event loop; by default the sync one."""
        return self.pre_process(data, request_id)

    @abstractmethod
    def post_process(
        self, outputs: Sequence[EngineOutput], request_id: str | None = None
    ) -> OutputT:
        """The answer to the request, from the finished engine outputs of its prompts, in
        the order `pre_process` returned the prompts: RequestOutputs under `--runner
        generate`, PoolingRequestOutputs under `--runner pooling`. A model may write
        anything: answer whatever it wrote (raising here is a bug, not the client's
        fault). `LLM.encode` returns the answer as it is."""

    async def post_process_async(
        self, outputs: Sequence[EngineOutput], request_id: str | None = None
    ) -> OutputT:
        """`post_process` for the server's event loop; by default the sync one."""
        return self.post_process(outputs, request_id)

    @abstractmethod
    def output_to_response(self, output: OutputT) -> object:
        """The `data` of the server's JSON response for `output` (what `post_process`
        returned): a value `json.dumps` takes (dicts, lists, strings, finite numbers,
        booleans, None). The server adds the `request_id` and `created_at` around it."""
