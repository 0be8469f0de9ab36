"""Beam search, vLLM's way: `LLM.beam_search` offline and `use_beam_search` in the server,
one algorithm over any engine that can run one token for a batch of token sequences.

A step runs every live beam as a one-token request asking for the `2 * beam_width` most
likely next tokens (transformers' beam search draws its candidates the same way), extends
each beam by each candidate, and keeps the `beam_width` best of each prompt's new beams; a
beam that chose EOS (unless `ignore_eos`) is finished and set aside. After `max_tokens`
steps the finished beams and the live ones are ranked together by their length-penalized
score, `cum_logprob / len ** length_penalty`, `len` counting the prompt and the generated
tokens but not a final EOS (vLLM's `get_beam_search_score`), best first.

Each step's requests are whole sequences, prompt included: the prefix cache is what makes
that cheap. A beam's request finds the full blocks its parent's request computed one step
earlier (freed into the cache when that one-token request finished), and sibling beams
find the prompt's blocks their common ancestor computed, so a step computes only each
beam's last, partial block instead of its whole sequence again.

The search is a coroutine over an async `BeamStep` so that both frontends drive the same
code: AsyncLLM awaits it on its event loop, running a step's requests concurrently; the
synchronous LLM runs it with `core.engine.core_client.run_inline` over a step that never
suspends (its requests run to their end inline, as `LLM.generate` runs them).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from core.outputs import CompletionOutput, PositionLogprobs, RequestOutput
from core.request import FinishReason
from core.sampling_params import SamplingParams

__all__ = [
    "BeamSearchOutput",
    "BeamSearchParams",
    "BeamSearchSequence",
    "BeamStep",
    "beam_search",
    "beam_search_score",
    "check_beam_width",
    "request_output",
]

# Run one token for each beam, given as (the index of the prompt it searches for, its token
# ids), with these params: one finished RequestOutput per beam, in order, its logprobs the
# candidates (BeamSearchParams.step_params).
BeamStep = Callable[[list[tuple[int, list[int]]], SamplingParams], Awaitable[list[RequestOutput]]]


@dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's BeamSearchParams. `temperature` samples the one token each step request
    generates, which joins its candidates when it is not among the most likely ones (0:
    greedy, always among them); the candidates' logprobs are the model's own."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.temperature >= 0.0 or math.isinf(self.temperature):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be finite, got {self.length_penalty}")

    def step_params(self) -> SamplingParams:
        """What each beam's one-token request asks: 2 * beam_width candidates."""
        return SamplingParams(
            max_tokens=1,
            logprobs=2 * self.beam_width,
            temperature=self.temperature,
            ignore_eos=True,  # EOS is a candidate like any other; the search decides
            detokenize=False,
        )


@dataclass
class BeamSearchSequence:
    """One beam: `tokens` are the prompt's and the generated ones (vLLM's), a final EOS
    only with `include_stop_str_in_output`; `logprobs` holds each generated position's
    candidates; `text` is set once the search returns it."""

    tokens: list[int]
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """A prompt's best `beam_width` sequences, best first."""

    sequences: list[BeamSearchSequence]


def check_beam_width(params: BeamSearchParams, max_logprobs: int) -> None:
    """ValueError naming beam_width when a step's 2 * beam_width candidates are more
    logprobs than the engine gives (--max-logprobs; -1: no cap)."""
    if 0 <= max_logprobs < 2 * params.beam_width:
        raise ValueError(
            f"beam_width {params.beam_width} needs {2 * params.beam_width} candidates per step, "
            f"more than max_logprobs ({max_logprobs}); lower it or raise --max-logprobs"
        )


def beam_search_score(
    tokens: Sequence[int], cum_logprob: float, eos_token_id: int | None, length_penalty: float
) -> float:
    """vLLM's ranking: `cum_logprob / len ** length_penalty`, `len` not counting a final
    EOS (transformers normalizes by the generated length alone)."""
    length = len(tokens) - (1 if tokens and tokens[-1] == eos_token_id else 0)
    return cum_logprob / (length**length_penalty)


class _Search:
    """One prompt's beams: the live ones and those finished."""

    def __init__(self, prompt_token_ids: list[int]) -> None:
        self.live = [BeamSearchSequence(list(prompt_token_ids))]
        self.finished: list[BeamSearchSequence] = []
        self.aborted = False


async def beam_search(
    prompts: Sequence[list[int]],
    params: BeamSearchParams,
    step: BeamStep,
    eos_token_id: int | None,
    decode: Callable[[list[int]], str] | None = None,
) -> list[BeamSearchOutput]:
    """Each prompt's (token ids) beam search; the prompts' beams share every step. With
    `decode`, each returned beam's `text` is `decode(tokens)`, prompt included (vLLM's
    `LLM.beam_search`).

    The caller makes sure `len(prompt) + params.max_tokens` fits the context. A step
    request that ends without a token (aborted: a stopping server's) ends its prompt's
    search; its beams come back as they were, finish_reason "abort".
    """
    searches = [_Search(prompt) for prompt in prompts]
    step_params = params.step_params()
    for _ in range(params.max_tokens):
        running = [(i, s) for i, s in enumerate(searches) if s.live and not s.aborted]
        if not running:
            break
        beams = [(i, beam.tokens) for i, search in running for beam in search.live]
        outputs = iter(await step(beams, step_params))
        for _, search in running:
            _advance(search, [next(outputs) for _ in search.live], params, eos_token_id)
    found = [_best(search, params, eos_token_id) for search in searches]
    for beam in (beam for output in found for beam in output.sequences):
        beam.text = None if decode is None else decode(beam.tokens)
    return found


def _advance(
    search: _Search,
    outputs: list[RequestOutput],
    params: BeamSearchParams,
    eos_token_id: int | None,
) -> None:
    """Extend each live beam by each of its candidates; keep the best `beam_width`."""
    extended: list[BeamSearchSequence] = []
    for beam, output in zip(search.live, outputs, strict=True):
        candidates = _candidates(output)
        if candidates is None:
            search.aborted = True
            return
        for token_id, logprob in candidates.items():
            child = BeamSearchSequence(
                beam.tokens + [token_id],
                beam.logprobs + [candidates],
                beam.cum_logprob + logprob.logprob,
            )
            if token_id == eos_token_id and not params.ignore_eos:
                child.finish_reason, child.stop_reason = str(FinishReason.STOP), token_id
                if not params.include_stop_str_in_output:
                    child.tokens.pop()
                search.finished.append(child)
            else:
                extended.append(child)
    extended.sort(key=_score_key(params, eos_token_id), reverse=True)
    search.live = extended[: params.beam_width]


def _candidates(output: RequestOutput) -> PositionLogprobs | None:
    """The next-token candidates a step request found; None when it ended without a token."""
    completion = output.outputs[0]
    if not completion.token_ids or not completion.logprobs:
        return None
    return completion.logprobs[0]


def _score_key(
    params: BeamSearchParams, eos_token_id: int | None
) -> Callable[[BeamSearchSequence], float]:
    def score(beam: BeamSearchSequence) -> float:
        return beam_search_score(beam.tokens, beam.cum_logprob, eos_token_id, params.length_penalty)

    return score


def _best(search: _Search, params: BeamSearchParams, eos_token_id: int | None) -> BeamSearchOutput:
    ended = str(FinishReason.ABORT) if search.aborted else str(FinishReason.LENGTH)
    for beam in search.live:
        beam.finish_reason = ended
    ranked = sorted(
        search.finished + search.live, key=_score_key(params, eos_token_id), reverse=True
    )
    return BeamSearchOutput(ranked[: params.beam_width])


def request_output(
    request_id: str,
    prompt: str | None,
    prompt_token_ids: list[int],
    output: BeamSearchOutput,
    decode: Callable[[list[int]], str],
) -> RequestOutput:
    """A prompt's beams as the finished RequestOutput the server answers with (vLLM's): one
    CompletionOutput per beam, best first, its text the generated tokens' (no final EOS)."""
    completions = []
    for index, beam in enumerate(output.sequences):
        token_ids = beam.tokens[len(prompt_token_ids) :]
        ended_by_eos = beam.stop_reason is not None and token_ids[-1:] == [beam.stop_reason]
        completions.append(
            CompletionOutput(
                index=index,
                text=decode(token_ids[:-1] if ended_by_eos else token_ids),
                token_ids=token_ids,
                cumulative_logprob=beam.cum_logprob,
                logprobs=None,
                finish_reason=beam.finish_reason,
                stop_reason=beam.stop_reason,
            )
        )
    return RequestOutput(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=prompt_token_ids,
        prompt_logprobs=None,
        outputs=completions,
        finished=True,
    )
