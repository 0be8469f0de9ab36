"""What the frontend measures of each engine step and each finished request, for metrics.

The OutputProcessor fills one IterationStats per batch of engine-core outputs (one engine
step) and hands it to its stats listener; AsyncLLM passes it on to its `stats_listeners`
(the server's Prometheus metrics). What the user waits for (time to first token, end to
end) is measured on the frontend's wall clock from the request's arrival; the phases inside
the engine (queued, prefill, decode) and the inter-token latencies are differences of the
engine core's monotonic timestamps (its events, each batch's timestamp), so no interval
mixes two processes' clocks.

One engine-core request is one sample: a request with n > 1 counts n times, as in vLLM,
except for its n itself, observed once per user request (on its last sample to finish).
A request's preemptions are counted from its PREEMPTED events, which reach the frontend
with its next output: the engine core sends none for a request the frontend aborted, so
such a request counts the preemptions its outputs had reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from core.engine.protocol import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
    SchedulerStats,
)

__all__ = ["FinishedRequestStats", "IterationStats", "RequestStats", "StatsListener"]


@dataclass(frozen=True)
class FinishedRequestStats:
    """One finished engine-core request. A phase the request never reached (e.g. it was
    aborted while queued) has no duration: None, not 0."""

    finish_reason: FinishReason
    num_prompt_tokens: int
    num_generation_tokens: int
    e2e_latency: float  # arrival to finish (frontend clock)
    queued_time: float | None  # queued to first scheduled
    prefill_time: float | None  # first scheduled to first token (preemptions included)
    decode_time: float | None  # first token to last token
    inference_time: float | None  # first scheduled to last token
    num_preemptions: int = 0
    max_tokens_param: int | None = None  # its max_tokens; None: up to the context length
    # The user request's n, on the stats of its last sample to finish; None on the others
    # and on pooled requests, which have no n.
    n_param: int | None = None


@dataclass
class RequestStats:
    """The times of one engine-core request so far."""

    arrival_time: float  # frontend wall clock (EngineCoreRequest.arrival_time)
    max_tokens: int | None = None  # its sampling params' (None: pooled, or no cap given)
    engine_index: int = 0  # the engine that sent its latest output
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    # Engine-core timestamps. A preempted request is scheduled again; the first admission
    # stays the start of its prefill, as in vLLM.
    queued_ts: float | None = None
    scheduled_ts: float | None = None
    first_token_ts: float | None = None
    last_token_ts: float | None = None

    def observe_events(self, events: list[EngineCoreEvent]) -> None:
        for event in events:
            if event.type == EngineCoreEventType.QUEUED and self.queued_ts is None:
                self.queued_ts = event.timestamp
            elif event.type == EngineCoreEventType.SCHEDULED and self.scheduled_ts is None:
                self.scheduled_ts = event.timestamp
            elif event.type == EngineCoreEventType.PREEMPTED:
                self.num_preemptions += 1

    def finished(
        self, reason: FinishReason, num_prompt_tokens: int, now: float, n_param: int | None
    ) -> FinishedRequestStats:
        return FinishedRequestStats(
            finish_reason=reason,
            num_prompt_tokens=num_prompt_tokens,
            num_generation_tokens=self.num_generation_tokens,
            e2e_latency=now - self.arrival_time,
            queued_time=_interval(self.queued_ts, self.scheduled_ts),
            prefill_time=_interval(self.scheduled_ts, self.first_token_ts),
            decode_time=_interval(self.first_token_ts, self.last_token_ts),
            inference_time=_interval(self.scheduled_ts, self.last_token_ts),
            num_preemptions=self.num_preemptions,
            max_tokens_param=self.max_tokens,
            n_param=n_param,
        )


@dataclass
class IterationStats:
    """What one engine step did, seen from the frontend: its outputs' tokens and latencies,
    the requests it finished, and the engine's state after it.

    `scheduler_stats` is None when no engine step produced this update: requests the
    frontend aborted itself (a client went away) are reported that way, at once.
    """

    engine_index: int
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = field(default_factory=time.time)  # frontend clock, when processed
    num_prompt_tokens: int = 0  # prompts of the requests whose first token came now
    num_cached_prompt_tokens: int = 0  # of those, tokens found in the prefix cache
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    kv_transfer_times: list[float] = field(default_factory=list)  # each transfer's seconds

    @classmethod
    def of_step(cls, outputs: EngineCoreOutputs, now: float) -> IterationStats:
        """The update of one engine step, before its requests' outputs are observed."""
        return cls(
            outputs.engine_index,
            outputs.scheduler_stats,
            now,
            kv_transfer_times=list(outputs.kv_transfer_times),
        )

    @property
    def is_engine_step(self) -> bool:
        return self.scheduler_stats is not None

    @property
    def num_tokens(self) -> int:
        """The tokens the step computed, as vLLM's iteration_tokens_total counts them: the
        uncached prompt tokens of the requests whose first token came now, plus the
        generated ones."""
        return self.num_prompt_tokens - self.num_cached_prompt_tokens + self.num_generation_tokens

    def observe_output(
        self,
        request: RequestStats,
        output: EngineCoreOutput,
        engine_timestamp: float,
        num_prompt_tokens: int,
    ) -> None:
        """Take one output of `request`; `engine_timestamp` is its batch's timestamp."""
        request.engine_index = self.engine_index
        if output.events:
            request.observe_events(output.events)
        num_new = len(output.new_token_ids)
        if not num_new:
            return
        self.num_generation_tokens += num_new
        request.num_generation_tokens += num_new
        if request.last_token_ts is None:
            self.num_prompt_tokens += num_prompt_tokens
            self.num_cached_prompt_tokens += output.num_cached_tokens
            self.time_to_first_tokens.append(self.timestamp - request.arrival_time)
            request.first_token_ts = engine_timestamp
        else:
            # One latency per output, however many tokens it brought (speculative
            # decoding may bring several), as vLLM measures it.
            self.inter_token_latencies.append(engine_timestamp - request.last_token_ts)
        request.last_token_ts = engine_timestamp

    def observe_finished(
        self,
        request: RequestStats,
        reason: FinishReason,
        num_prompt_tokens: int,
        n_param: int | None = None,
    ) -> None:
        """`n_param`: the user request's n when `request` is its last sample to finish."""
        self.finished_requests.append(
            request.finished(reason, num_prompt_tokens, self.timestamp, n_param)
        )


StatsListener = Callable[[IterationStats], None]


def _interval(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start
