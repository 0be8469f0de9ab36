"""`reasoning_content` on /v1/chat/completions: the server's --reasoning-parser on each choice.

The engine's frontend builds the parser once (`EngineFrontend.reasoning_parser`). Each
choice's text is split before anything else reads it, so the message's content, and the
tool calls read out of it, come from the content part alone: a whole choice through the
parser's `extract_reasoning` (`split_output`), a streamed one through a ReasoningStream per
sample (`split_delta`), whose pieces add up to the whole split. A prompt that already
ended the reasoning (a chat template that switched thinking off) leaves the whole output
content, as the engine core then constrains a structured output from its first token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from core.reasoning import ReasoningParser, ReasoningStream

if TYPE_CHECKING:
    from core.outputs import CompletionOutput
    from core.sampling_params import SamplingParams

__all__ = [
    "num_reasoning_tokens",
    "output_reasoning_parser",
    "reasoning_sampling_params",
    "split_delta",
    "split_output",
]


def output_reasoning_parser(
    parser: ReasoningParser | None, prompt_token_ids: Sequence[int]
) -> ReasoningParser | None:
    """The parser that splits the outputs of a request with this prompt: None when there
    is none, or when the prompt ended the reasoning already (the output is all content)."""
    if parser is None or parser.is_reasoning_end(prompt_token_ids):
        return None
    return parser


def reasoning_sampling_params(
    parser: ReasoningParser | None, params: SamplingParams
) -> SamplingParams:
    """`params` with special tokens kept in the text when the parser's markers are special
    tokens (it must see them to split)."""
    if parser is None or not parser.keeps_special_tokens:
        return params
    return msgspec.structs.replace(params, skip_special_tokens=False)


def split_output(
    parser: ReasoningParser, output: CompletionOutput
) -> tuple[str | None, CompletionOutput]:
    """A whole sample's reasoning, and the sample with its content (maybe "") as its text."""
    split = parser.extract_reasoning(output.text)
    return split.reasoning, dataclasses.replace(output, text=split.content or "")


def num_reasoning_tokens(parser: ReasoningParser, token_ids: Sequence[int]) -> int:
    """How many of an output's `token_ids` its reasoning took: those before the token that
    ended it (the parser's `is_reasoning_end`, asked token by token as the engine core
    asks it), or all of them when it never ended."""
    for i, token_id in enumerate(token_ids):
        if parser.is_reasoning_end([token_id]):
            return i
    return len(token_ids)


def split_delta(
    stream: ReasoningStream, output: CompletionOutput
) -> tuple[str | None, CompletionOutput]:
    """A streamed sample's newest piece split by its stream: the reasoning it adds, and the
    piece with the content it adds (maybe "") as its text."""
    split = stream.step(output.text, finished=output.finish_reason is not None)
    return split.reasoning, dataclasses.replace(output, text=split.content or "")
