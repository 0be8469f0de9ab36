"""Building OpenAI response bodies (choices, logprobs, usage) from RequestOutputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from core.entrypoints.openai.protocol import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionResponseChoice,
    ChatCompletionStreamChoice,
    ChatMessage,
    CompletionLogProbs,
    CompletionResponseChoice,
    DeltaMessage,
    PromptLogprob,
    PromptLogprobs,
    UsageInfo,
)
from core.entrypoints.openai.reasoning import split_delta, split_output
from core.outputs import CompletionOutput, PositionLogprobs, RequestOutput

if TYPE_CHECKING:
    from core.entrypoints.openai.tool_calls import ToolPlan, ToolStream
    from core.reasoning import ReasoningParser, ReasoningStream

# JSON has no -inf: OpenAI reports "very unlikely" with this value instead.
_MIN_LOGPROB = -9999.0

DecodeToken = Callable[[int], str]


def usage_info(outputs: RequestOutput | Sequence[RequestOutput]) -> UsageInfo:
    """Usage of one request or a batch: each prompt once, plus the tokens of all n samples."""
    batch = [outputs] if isinstance(outputs, RequestOutput) else outputs
    prompt = sum(len(o.prompt_token_ids) for o in batch)
    completion = sum(len(c.token_ids) for o in batch for c in o.outputs)
    return UsageInfo(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def completion_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs | None],
    decode_token: DecodeToken,
    initial_text_offset: int = 0,
) -> CompletionLogProbs:
    """Legacy completions logprobs of ``token_ids``: each token's logprob (None where its
    position has none, as the first prompt token) and every entry of its position — the
    chosen token and the top-k, so up to k+1 as OpenAI documents — keyed by token text.
    ``text_offset`` counts characters from ``initial_text_offset``."""
    result = CompletionLogProbs()
    offset = initial_text_offset
    for token_id, position in zip(token_ids, positions, strict=True):
        token = _token_text(token_id, position, decode_token)
        result.tokens.append(token)
        result.text_offset.append(offset)
        offset += len(token)
        if position is None:
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
            continue
        result.token_logprobs.append(_clamped(position[token_id].logprob))
        result.top_logprobs.append(
            {
                _token_text(tid, position, decode_token): _clamped(lp.logprob)
                for tid, lp in position.items()
            }
        )
    return result


def chat_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs],
    num_top: int,
    decode_token: DecodeToken,
) -> ChatCompletionLogProbs:
    """Chat logprobs of ``token_ids``: the chosen token and the ``num_top`` most likely
    (ranks 1..num_top, in rank order) at each position."""
    content = []
    for token_id, position in zip(token_ids, positions, strict=True):
        top = sorted(
            (item for item in position.items() if 1 <= (item[1].rank or 0) <= num_top),
            key=lambda item: item[1].rank or 0,
        )
        content.append(
            ChatCompletionLogProbsContent(
                **_chat_logprob(token_id, position, decode_token),
                top_logprobs=[
                    ChatCompletionLogProb(**_chat_logprob(tid, position, decode_token))
                    for tid, _ in top
                ],
            )
        )
    return ChatCompletionLogProbs(content=content)


def prompt_logprobs(
    request_output: RequestOutput, decode_token: DecodeToken
) -> PromptLogprobs | None:
    """vLLM's ``prompt_logprobs`` of a whole output: per prompt position its entries (the
    prompt token's and the top k), None at the first position; None when not computed."""
    if request_output.prompt_logprobs is None:
        return None
    return [
        None
        if position is None
        else {
            token_id: PromptLogprob(
                logprob=_clamped(entry.logprob),
                rank=entry.rank,
                decoded_token=_token_text(token_id, position, decode_token),
            )
            for token_id, entry in position.items()
        }
        for position in request_output.prompt_logprobs
    ]


def completion_choice(
    request_output: RequestOutput,
    output: CompletionOutput,
    decode_token: DecodeToken,
    *,
    index: int | None = None,
    echo_text: str | None = None,
    text_offset: int = 0,
    whole: bool = False,
) -> CompletionResponseChoice:
    """A completion choice from one sample (whole, or a streamed delta). ``echo_text``
    (the prompt's text) is prepended when echoing; then logprobs, if the request asked
    for them, cover the prompt tokens first. ``text_offset``: characters already sent
    in earlier chunks. ``index`` defaults to the sample's index. A ``whole`` choice
    carries the prompt logprobs the engine computed, as vLLM's does."""
    text = output.text
    token_ids, positions = list(output.token_ids), list(output.logprobs or [])
    if echo_text is not None:
        text = echo_text + text
        prompt_positions = request_output.prompt_logprobs or [None] * len(
            request_output.prompt_token_ids
        )
        token_ids = list(request_output.prompt_token_ids) + token_ids
        positions = list(prompt_positions) + positions
    logprobs = None
    if output.logprobs is not None:
        logprobs = completion_logprobs(token_ids, positions, decode_token, text_offset)
    return CompletionResponseChoice(
        index=output.index if index is None else index,
        text=text,
        logprobs=logprobs,
        finish_reason=output.finish_reason,
        stop_reason=output.stop_reason,
        prompt_logprobs=prompt_logprobs(request_output, decode_token) if whole else None,
    )


def chat_choice(
    output: CompletionOutput,
    decode_token: DecodeToken,
    num_top_logprobs: int = 0,
    tools: ToolPlan | None = None,
    reasoning: ReasoningParser | None = None,
) -> ChatCompletionResponseChoice:
    """A whole chat choice from one sample: the assistant's message, its tool calls read
    out of the text when `tools` (the request's ToolPlan) says so. With `reasoning` (the
    server's parser) the reasoning is split off first, and the rest is read as content."""
    reasoning_text = None
    if reasoning is not None:
        reasoning_text, output = split_output(reasoning, output)
    if tools is None:
        message, finish_reason = ChatMessage(content=output.text), output.finish_reason
    else:
        message, finish_reason = tools.message(output)
    if reasoning is not None:
        message.reasoning_content, message.content = reasoning_text, message.content or None
    return ChatCompletionResponseChoice(
        index=output.index,
        message=message,
        logprobs=_output_chat_logprobs(output, decode_token, num_top_logprobs),
        finish_reason=finish_reason,
        stop_reason=output.stop_reason,
    )


def chat_stream_choice(
    output: CompletionOutput,
    decode_token: DecodeToken,
    num_top_logprobs: int = 0,
    role: str | None = None,
    tools: ToolStream | None = None,
    reasoning: ReasoningStream | None = None,
) -> ChatCompletionStreamChoice | None:
    """A streamed chat choice from one sample's delta; ``role`` goes in the first chunk.
    With `reasoning` (the sample's ReasoningStream) the reasoning is split off first; with
    `tools` (the sample's ToolStream) the content goes through its parser. Either may hold
    some text back: None when the delta then has nothing to send."""
    reasoning_text = None
    if reasoning is not None:
        reasoning_text, output = split_delta(reasoning, output)
    if tools is None:
        content = output.text if reasoning is None else output.text or None
        delta = DeltaMessage(role=role, content=content)
        finish_reason = output.finish_reason
    else:
        delta, finish_reason = tools.step(output)
        delta.role = role
    delta.reasoning_content = reasoning_text
    held = delta.content is None and not delta.tool_calls and reasoning_text is None
    if held and not (role or finish_reason or output.logprobs):
        return None
    return ChatCompletionStreamChoice(
        index=output.index,
        delta=delta,
        logprobs=_output_chat_logprobs(output, decode_token, num_top_logprobs),
        finish_reason=finish_reason,
        stop_reason=output.stop_reason,
    )


def _output_chat_logprobs(
    output: CompletionOutput, decode_token: DecodeToken, num_top: int
) -> ChatCompletionLogProbs | None:
    if output.logprobs is None:
        return None
    return chat_logprobs(output.token_ids, output.logprobs, num_top, decode_token)


def _chat_logprob(
    token_id: int, position: PositionLogprobs, decode_token: DecodeToken
) -> dict[str, Any]:
    token = _token_text(token_id, position, decode_token)
    return {
        "token": token,
        "logprob": _clamped(position[token_id].logprob),
        "bytes": list(token.encode("utf-8")),
    }


def _token_text(token_id: int, position: PositionLogprobs | None, decode_token: DecodeToken) -> str:
    entry = position.get(token_id) if position is not None else None
    if entry is not None and entry.decoded_token is not None:
        return entry.decoded_token
    return decode_token(token_id)


def _clamped(logprob: float) -> float:
    return max(logprob, _MIN_LOGPROB)
