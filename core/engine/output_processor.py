"""OutputProcessor: EngineCoreOutputs (new token ids) -> RequestOutputs (text) in the frontend.

The engine core never sees text. Here each request's new token ids are detokenized, stop
strings are searched (a stop string that finishes a request here must also be aborted in the
engine core, which is still running it), logprobs become per-position dicts, and outputs are
shaped as the caller asked (`RequestOutputKind`).

A request with `n > 1` reaches the engine core as n independent child requests with ids
`f"{i}_{request_id}"` (see `child_request_id`), each with n=1; the processor gathers them
back into one RequestOutput with n CompletionOutputs, ordered by index. With n == 1 the
engine core sees the user's request id itself.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import msgspec

from core.engine.detokenizer import IncrementalDetokenizer
from core.engine.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
)
from core.engine.stats import IterationStats, RequestStats, StatsListener
from core.engine.stop_checker import StopChecker
from core.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestMetrics, RequestOutput
from core.sampling_params import SamplingParams
from core.tokenizer import Tokenizer
from core.worker.contract import LogprobsLists

__all__ = [
    "OutputProcessor",
    "OutputProcessorOutput",
    "OutputQueue",
    "RequestOutputKind",
    "child_request_id",
]

# SamplingParams.seed accepts [-2**63, 2**64 - 1]; a child's seed + i wraps inside that range.
_SEED_SPAN = 2**64
_MAX_SEED = 2**64 - 1


class RequestOutputKind(enum.IntEnum):
    """Which RequestOutputs a request produces, and what each one holds."""

    CUMULATIVE = 0  # one per step with new tokens, holding everything so far
    DELTA = 1  # one per step with new tokens, holding only what is new (streaming)
    FINAL_ONLY = 2  # one, when the request finishes (LLM.generate)


class OutputQueue(Protocol):
    """Where a request's outputs go instead of `process_outputs`' return value
    (asyncio.Queue and queue.Queue both qualify)."""

    def put_nowait(self, item: RequestOutput) -> None: ...


@dataclasses.dataclass
class OutputProcessorOutput:
    request_outputs: list[RequestOutput]  # of requests added without a queue
    # Engine-core request ids that a stop string finished here: the caller must abort them
    # in the engine core, which does not know they are done.
    reqs_to_abort: list[str]


def child_request_id(index: int, request_id: str) -> str:
    """The engine-core id of sample `index` of a request with n > 1."""
    return f"{index}_{request_id}"


def _child_requests(request: EngineCoreRequest) -> list[EngineCoreRequest]:
    """The engine-core requests serving `request`: itself when n == 1, else n copies with
    n=1 and, when seeded, seed + i so the samples differ yet stay reproducible."""
    params = request.sampling_params
    if params.n == 1:
        return [request]
    return [
        msgspec.structs.replace(
            request,
            request_id=child_request_id(i, request.request_id),
            sampling_params=_child_params(params, i),
        )
        for i in range(params.n)
    ]


def _child_params(params: SamplingParams, index: int) -> SamplingParams:
    seed = params.seed
    if seed is not None:
        seed += index
        seed = seed - _SEED_SPAN if seed > _MAX_SEED else seed
    return msgspec.structs.replace(params, n=1, seed=seed)


def _position_logprobs(
    lists: LogprobsLists, decode_token: Callable[[int], str | None]
) -> list[PositionLogprobs]:
    """One {token id: Logprob} dict per position: the chosen token first (its rank from
    `ranks`), then the top-k with ranks 1..k; a chosen token that is also in the top-k keeps
    its single entry."""
    num_positions = len(lists.logprob_token_ids)
    if not len(lists.logprobs) == len(lists.ranks) == num_positions:
        raise ValueError(
            f"LogprobsLists fields disagree on the number of positions: {num_positions} "
            f"token id rows, {len(lists.logprobs)} logprob rows, {len(lists.ranks)} ranks"
        )
    positions = []
    for token_ids, logprobs, rank in zip(
        lists.logprob_token_ids, lists.logprobs, lists.ranks, strict=True
    ):
        chosen = token_ids[0]
        entries = {chosen: Logprob(logprobs[0], rank, decode_token(chosen))}
        for top_rank, (token_id, logprob) in enumerate(
            zip(token_ids[1:], logprobs[1:], strict=True), start=1
        ):
            if token_id not in entries:
                entries[token_id] = Logprob(logprob, top_rank, decode_token(token_id))
        positions.append(entries)
    return positions


class _CompletionState:
    """One engine-core request (one of the n samples): its tokens, text and logprobs."""

    def __init__(self, index: int, request: EngineCoreRequest, tokenizer: Tokenizer | None):
        params = request.sampling_params
        self.request_id = request.request_id
        self.index = index
        self._detokenizer: IncrementalDetokenizer | None = None
        if params.detokenize and tokenizer is not None:
            self._detokenizer = IncrementalDetokenizer(
                tokenizer, params.skip_special_tokens, params.spaces_between_special_tokens
            )
        self._include_stop_str = params.include_stop_str_in_output
        self._stop_checker = StopChecker(
            params.stop or [], params.include_stop_str_in_output, params.min_tokens
        )
        self._wants_logprobs = params.logprobs is not None
        self.token_ids: list[int] = []
        self.logprobs: list[PositionLogprobs] = []
        self.cumulative_logprob = 0.0
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.stats = RequestStats(request.arrival_time, params.max_tokens)
        # What earlier DELTA outputs carried.
        self._num_sent_tokens = 0
        self._num_sent_chars = 0
        self._sent_finish = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def update(self, output: EngineCoreOutput, decode_token: Callable[[int], str | None]) -> bool:
        """Apply one engine-core output; True when a stop string finished this request while
        the engine core still runs it. Tokens after the one completing a stop string are
        dropped, so token_ids end with the token that completed it."""
        positions = self._new_positions(output, decode_token)
        new_ids = output.new_token_ids
        # A stop token's text (EOS, stop_token_ids) is not output unless asked for, as in vLLM.
        silent_last = output.finish_reason == FinishReason.STOP and not self._include_stop_str
        for i, token_id in enumerate(new_ids):
            self.token_ids.append(token_id)
            if positions:
                self.logprobs.append(positions[i])
                self.cumulative_logprob += positions[i][token_id].logprob
            delta = ""
            if self._detokenizer is not None and not (silent_last and i == len(new_ids) - 1):
                delta = self._detokenizer.decode_next(token_id)
            stop_str = self._stop_checker.append(delta, len(self.token_ids))
            if stop_str is not None:
                self.finish_reason, self.stop_reason = FinishReason.STOP, stop_str
                return not output.finished
        if output.finish_reason is not None:
            self.finish(output.finish_reason, output.stop_reason)
        return False

    def _new_positions(
        self, output: EngineCoreOutput, decode_token: Callable[[int], str | None]
    ) -> list[PositionLogprobs]:
        if not self._wants_logprobs or not output.new_token_ids:
            return []
        if output.new_logprobs is None:
            raise ValueError(
                f"request {self.request_id!r} asked for logprobs but the engine core sent none"
            )
        positions = _position_logprobs(output.new_logprobs, decode_token)
        if len(positions) != len(output.new_token_ids):
            raise ValueError(
                f"request {self.request_id!r}: {len(positions)} logprob positions for "
                f"{len(output.new_token_ids)} new tokens"
            )
        return positions

    def finish(self, reason: FinishReason, stop_reason: int | str | None) -> None:
        """Finish for a reason from outside: the text held back for an incomplete character
        is flushed (and may still complete a stop string, which then wins)."""
        flushed = self._detokenizer.flush() if self._detokenizer is not None else ""
        stop_str = self._stop_checker.append(flushed, len(self.token_ids))
        if stop_str is not None:
            reason, stop_reason = FinishReason.STOP, stop_str
        self.finish_reason, self.stop_reason = reason, stop_reason

    def completion(self, kind: RequestOutputKind) -> CompletionOutput | None:
        """This sample as the caller sees it now; None for DELTA when nothing is new."""
        finished = self.finished
        text_end = self._stop_checker.releasable_length(finished)
        start_token, start_char = 0, 0
        if kind == RequestOutputKind.DELTA:
            start_token, start_char = self._num_sent_tokens, self._num_sent_chars
            sent = (start_token, start_char, self._sent_finish)
            if (len(self.token_ids), text_end, finished) == sent:
                return None
            self._num_sent_tokens, self._num_sent_chars = len(self.token_ids), text_end
            self._sent_finish = finished
        return CompletionOutput(
            index=self.index,
            text=self._stop_checker.text[start_char:text_end],
            token_ids=self.token_ids[start_token:],
            cumulative_logprob=self.cumulative_logprob if self._wants_logprobs else None,
            logprobs=self.logprobs[start_token:] if self._wants_logprobs else None,
            finish_reason=str(self.finish_reason) if finished else None,
            stop_reason=self.stop_reason,
        )


class _RequestState:
    """One user request: its n samples, prompt logprobs, metrics and where outputs go."""

    def __init__(
        self,
        request: EngineCoreRequest,
        prompt: str | None,
        kind: RequestOutputKind,
        queue: OutputQueue | None,
        completions: list[_CompletionState],
    ) -> None:
        self.request_id = request.request_id
        self.prompt = prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.kind = kind
        self.queue = queue
        self.completions = completions
        # The first prompt token has no logprob: nothing precedes it.
        wants_prompt_logprobs = request.sampling_params.prompt_logprobs is not None
        self.prompt_logprobs: list[PositionLogprobs | None] | None = (
            [None] if wants_prompt_logprobs else None
        )
        self._num_sent_prompt_logprobs = 0
        self.num_cached_tokens = 0
        self.kv_transfer_params: dict[str, Any] | None = None
        self.metrics = RequestMetrics(arrival_time=request.arrival_time)

    @property
    def finished(self) -> bool:
        return all(c.finished for c in self.completions)

    def observe_finished(
        self, stats: IterationStats, completion: _CompletionState, reason: FinishReason
    ) -> None:
        """Count one sample that just finished; the last of them also carries n."""
        n_param = len(self.completions) if self.finished else None
        stats.observe_finished(completion.stats, reason, len(self.prompt_token_ids), n_param)

    def record(
        self,
        completion: _CompletionState,
        output: EngineCoreOutput,
        decode_token: Callable[[int], str | None],
        now: float,
    ) -> None:
        """Take what one sample's output says about the prompt, and the token times."""
        # Every sample computes the same prompt logprobs and sees the same cache; sample 0's
        # are the ones reported.
        if completion.index == 0:
            if output.new_prompt_logprobs is not None and self.prompt_logprobs is not None:
                self.prompt_logprobs += _position_logprobs(output.new_prompt_logprobs, decode_token)
            self.num_cached_tokens = max(self.num_cached_tokens, output.num_cached_tokens)
            if output.kv_transfer_params is not None:
                self.kv_transfer_params = output.kv_transfer_params
        if output.new_token_ids:
            if self.metrics.first_token_time is None:
                self.metrics.first_token_time = now
            self.metrics.last_token_time = now

    def make_output(self, now: float) -> RequestOutput | None:
        """The RequestOutput to deliver now, per `kind`; None when there is none."""
        finished = self.finished
        if finished and self.metrics.finished_time is None:
            self.metrics.finished_time = now
        if self.kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        completions = [c.completion(self.kind) for c in self.completions]
        outputs = [c for c in completions if c is not None]
        if not outputs:
            return None
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=self._prompt_logprobs_output(),
            outputs=outputs,
            finished=finished,
            num_cached_tokens=self.num_cached_tokens,
            metrics=dataclasses.replace(self.metrics),
            kv_transfer_params=self.kv_transfer_params,
        )

    def _prompt_logprobs_output(self) -> list[PositionLogprobs | None] | None:
        """All of them, or for DELTA the positions no earlier output carried (None if none)."""
        if self.prompt_logprobs is None:
            return None
        if self.kind != RequestOutputKind.DELTA:
            return list(self.prompt_logprobs)
        start, self._num_sent_prompt_logprobs = (
            self._num_sent_prompt_logprobs,
            len(self.prompt_logprobs),
        )
        return self.prompt_logprobs[start:] or None


class OutputProcessor:
    """Turns engine-core outputs into RequestOutputs for every request the frontend added.

    `tokenizer` may be None only if every request has `detokenize=False`; then texts are
    empty and logprobs carry no decoded_token. `stats_listener` gets the IterationStats of
    every batch of engine-core outputs, and of the requests `abort_requests` finishes.
    """

    def __init__(
        self, tokenizer: Tokenizer | None, stats_listener: StatsListener | None = None
    ) -> None:
        self._tokenizer = tokenizer
        self._stats_listener = stats_listener
        self._requests: dict[str, _RequestState] = {}
        # Engine-core request id -> (its user request, its sample), while it runs.
        self._running: dict[str, tuple[_RequestState, _CompletionState]] = {}
        self._decoded_tokens: dict[int, str] = {}

    def add_request(
        self,
        request: EngineCoreRequest,
        prompt: str | None = None,
        output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
        queue: OutputQueue | None = None,
    ) -> list[EngineCoreRequest]:
        """Track a user request and return the engine-core requests to send for it: the
        request itself when n == 1, else its n children (`child_request_id`). With a `queue`
        its outputs go there, not into `process_outputs`' return value."""
        params = request.sampling_params
        if params.detokenize and self._tokenizer is None:
            raise ValueError("detokenize=True needs a tokenizer; this engine has none")
        children = _child_requests(request)
        taken = [r.request_id for r in children if r.request_id in self._running]
        if request.request_id in self._requests or taken:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        completions = [_CompletionState(i, r, self._tokenizer) for i, r in enumerate(children)]
        state = _RequestState(request, prompt, output_kind, queue, completions)
        self._requests[request.request_id] = state
        for completion in completions:
            self._running[completion.request_id] = (state, completion)
        return children

    def process_outputs(self, engine_core_outputs: EngineCoreOutputs) -> OutputProcessorOutput:
        """Apply one batch of engine-core outputs. Outputs of requests no longer tracked
        (aborted, or finished here by a stop string) are ignored."""
        now = time.time()
        result = OutputProcessorOutput(request_outputs=[], reqs_to_abort=[])
        stats = IterationStats.of_step(engine_core_outputs, now)
        updated: dict[str, _RequestState] = {}
        for output in engine_core_outputs.outputs:
            entry = self._running.get(output.request_id)
            if entry is None:
                continue
            state, completion = entry
            state.record(completion, output, self._decode_token, now)
            num_prompt_tokens = len(state.prompt_token_ids)
            stats.observe_output(
                completion.stats, output, engine_core_outputs.timestamp, num_prompt_tokens
            )
            if completion.update(output, self._decode_token):
                result.reqs_to_abort.append(completion.request_id)
            if output.new_token_ids or completion.finished:
                updated[state.request_id] = state
            reason = completion.finish_reason
            if reason is not None:
                del self._running[completion.request_id]
                state.observe_finished(stats, completion, reason)
        for request_id in engine_core_outputs.finished_requests:
            self._finish_aborted(request_id, updated, stats)
        for state in updated.values():
            self._deliver(state, now, result.request_outputs)
        if self._stats_listener is not None:
            self._stats_listener(stats)
        return result

    def _finish_aborted(
        self, engine_request_id: str, updated: dict[str, _RequestState], stats: IterationStats
    ) -> None:
        """The engine core finished a request on its own without a final output."""
        entry = self._running.pop(engine_request_id, None)
        if entry is not None:
            state, completion = entry
            completion.finish(FinishReason.ABORT, None)
            state.observe_finished(stats, completion, FinishReason.ABORT)
            updated[state.request_id] = state

    def _deliver(self, state: _RequestState, now: float, collected: list[RequestOutput]) -> None:
        output = state.make_output(now)
        if state.finished:
            del self._requests[state.request_id]
        if output is None:
            return
        if state.queue is not None:
            state.queue.put_nowait(output)
        else:
            collected.append(output)

    def abort_requests(self, request_ids: Iterable[str]) -> list[str]:
        """Forget these user requests (unknown or finished ids are ignored); return the
        engine-core ids to abort. A request with a queue gets a final output (finish_reason
        "abort") there, so whoever waits on it wakes up. The stats listener hears of them
        at once, per engine (the one that sent each its latest output; engine 0 if none did)."""
        now = time.time()
        engine_request_ids: list[str] = []
        stats: dict[int, IterationStats] = {}
        for request_id in request_ids:
            state = self._requests.get(request_id)
            if state is None:
                continue
            for completion in state.completions:
                if not completion.finished:
                    del self._running[completion.request_id]
                    completion.finish(FinishReason.ABORT, None)
                    engine_request_ids.append(completion.request_id)
                    index = completion.stats.engine_index
                    update = stats.setdefault(index, IterationStats(index, timestamp=now))
                    state.observe_finished(update, completion, FinishReason.ABORT)
            self._deliver(state, now, [])
        if self._stats_listener is not None:
            for update in stats.values():
                self._stats_listener(update)
        return engine_request_ids

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def _decode_token(self, token_id: int) -> str | None:
        """One token's text for logprobs (special tokens kept), cached per id."""
        if self._tokenizer is None:
            return None
        text = self._decoded_tokens.get(token_id)
        if text is None:
            backend = self._tokenizer.backend_tokenizer
            text = self._decoded_tokens[token_id] = backend.decode([token_id])
        return text
