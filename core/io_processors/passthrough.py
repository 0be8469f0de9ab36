"""The reference IO processor (`--io-processor-plugin passthrough`): prompts in, outputs out.

It adds no language of its own, which makes it the smallest complete processor: a template
for writing one, and the conformance kit's reference (core's own entry in
`core.io_processors`). `data` is a prompt (text or token ids) or a non-empty list of them;
the answer is one object per prompt, in order: `{"text", "token_ids", "finish_reason"}`
of its first sample under --runner generate, `{"embedding"}` under --runner pooling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.io_processors.interface import EngineOutput, IOProcessor
from core.io_processors.prompts import is_token_ids
from core.outputs import RequestOutput

__all__ = ["PassthroughIOProcessor"]

Prompt = str | list[int]


class PassthroughIOProcessor(IOProcessor[list[Prompt], list[dict[str, Any]]]):
    def parse_request(self, data: object) -> list[Prompt]:
        prompts = [data] if _is_prompt(data) else data
        if not isinstance(prompts, list) or not prompts or not all(map(_is_prompt, prompts)):
            raise ValueError(
                "data must be a prompt (text or token ids) or a non-empty list of them"
            )
        return prompts

    def pre_process(self, data: list[Prompt], request_id: str | None = None) -> list[Prompt]:
        return data

    def post_process(
        self, outputs: Sequence[EngineOutput], request_id: str | None = None
    ) -> list[dict[str, Any]]:
        return [_answer(output) for output in outputs]

    def output_to_response(self, output: list[dict[str, Any]]) -> object:
        return output


def _is_prompt(value: object) -> bool:
    # An empty token list is no prompt: `[]` must stay "no prompts", refused as such.
    return isinstance(value, str) or (bool(value) and is_token_ids(value))


def _answer(output: EngineOutput) -> dict[str, Any]:
    if isinstance(output, RequestOutput):
        sample = output.outputs[0]
        return {
            "text": sample.text,
            "token_ids": list(sample.token_ids),
            "finish_reason": sample.finish_reason,
        }
    pooled = output.outputs  # None only for a request aborted before it was pooled
    return {"embedding": None if pooled is None else pooled.embedding}
