"""The scheduler: one token budget per step, shared by running and waiting requests (fixed,
or sized from measured step times where a burst budget is configured: step_budget.py).

There are no prefill and decode phases. Each request has num_computed_tokens and
num_tokens; a step moves the first towards the second for as many requests as the token
budget, `max_num_seqs` and the free KV blocks allow. Running requests go first (so
decodes keep flowing while a long prompt is prefilled in chunks), then waiting ones are
admitted, looking up the prefix cache. When blocks run out, a running request is
preempted (its blocks freed, to be recomputed later): the last one in FCFS order, or
the one of lowest priority.

Speculative decoding changes only the target: a running request with drafts aims at
`num_tokens_with_spec` (its drafts are scheduled after its known tokens and verified in the
same forward), holds `num_lookahead_tokens` extra slots for a proposer that writes KV, and
after the step rolls `num_computed_tokens` back over the drafts the target rejected (their
KV slots are simply overwritten later).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from core.config import EngineConfig
from core.kv_cache.kv_cache_manager import KVCacheBlocks, KVCacheManager
from core.kv_transfer.interface import KVConnector
from core.multimodal.encoder_cache import EncoderBudget, EncoderCacheManager
from core.request import EngineCoreEventType, Request, RequestStatus
from core.scheduler.output import (
    EngineCoreOutput,
    EngineCoreOutputs,
    SchedulerStats,
    SpecDecodingStats,
)
from core.scheduler.remote_kv import RemoteKV
from core.scheduler.request_queue import RequestQueue
from core.scheduler.step_budget import StepLoad, drain_tokens, step_budget
from core.scheduler.waiting_reasons import num_deferred
from core.spec_decode.verification import num_accepted, num_drafts_within
from core.structured_output.manager import StructuredOutputManager
from core.worker.contract import (
    CachedRequestData,
    LogprobsLists,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)


@dataclass
class _Step:
    """What one schedule() call has decided so far."""

    token_budget: int
    num_scheduled: dict[str, int] = field(default_factory=dict)
    new_blocks: dict[str, KVCacheBlocks] = field(default_factory=dict)
    new_reqs: list[Request] = field(default_factory=list)
    resumed_reqs: list[Request] = field(default_factory=list)
    # Running requests scheduled: they alone can have drafts (a request that waited has
    # none), cut to those their scheduled tokens reach.
    running_reqs: list[Request] = field(default_factory=list)
    preempted: bool = False
    # Multimodal items to encode this step: request id -> indices into its mm_features,
    # the identifiers being encoded (a second request with the same item shares them),
    # and the embeddings the encoder may still compute.
    encoder_inputs: dict[str, list[int]] = field(default_factory=dict)
    encoding: set[str] = field(default_factory=set)
    encoder_budget: int = 0


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        kv_cache_manager: KVCacheManager,
        max_model_len: int,
        structured_outputs: StructuredOutputManager | None = None,
        num_lookahead_tokens: int = 0,
        kv_connector: KVConnector | None = None,
    ) -> None:
        sched = config.scheduler
        self.max_num_seqs = sched.max_num_seqs
        self.budget = step_budget(sched, max_model_len)
        self.long_prefill_threshold = sched.long_prefill_token_threshold
        self.chunked_prefill = sched.enable_chunked_prefill
        self.policy = sched.policy
        self.async_scheduling = sched.async_scheduling
        self.max_model_len = max_model_len
        self.kv = kv_cache_manager
        self.requests: dict[str, Request] = {}
        self.waiting = RequestQueue(sched.policy)
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()  # told to the workers at the next step
        self.num_preemptions = 0
        self.expert_imbalance: float | None = None  # --enable-eplb's, from the workers
        self.grammars = structured_outputs
        self.num_lookahead_tokens = num_lookahead_tokens
        self.max_loras = config.lora.max_loras if config.lora is not None else 0
        # Pipeline parallelism: tokens sampled by the last stage that the other stages have
        # not been told yet (they get them with the request's next scheduling).
        self._unsent_tokens: dict[str, list[int]] | None = (
            {} if config.parallel.pipeline_parallel_size > 1 else None
        )
        spec = config.speculative
        self.spec_stats = SpecDecodingStats.empty(spec.num_speculative_tokens) if spec else None
        # Requests finished outside a step (a grammar that failed to compile), reported
        # with the next step's outputs.
        self._pending_outputs: list[EngineCoreOutput] = []
        # The scheduler role of --kv-transfer-config's connector (None: no connector).
        self.remote = RemoteKV(kv_connector) if kv_connector is not None else None
        self.encoder_budget = EncoderBudget.of(sched, max_model_len)
        self.encoder_cache = EncoderCacheManager(self.encoder_budget.cache)
        self.num_encoder_inputs = 0  # multimodal items encoded so far
        self.num_steps = 0  # steps scheduled so far

    # -- requests -------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        if request.lora_request is not None and not self.max_loras:
            raise ValueError("lora_request: LoRA adapters are not enabled (--enable-lora)")
        params = request.sampling_params
        constraint = None if params is None else params.structured_outputs
        if constraint is not None:
            if self.grammars is None:
                raise ValueError("structured outputs are not available in this engine")
            self.grammars.submit(request.request_id, constraint, request.prompt_token_ids)
            request.status = RequestStatus.WAITING_FOR_GRAMMAR
        request.first_step_index = self.num_steps
        self.requests[request.request_id] = request
        self.waiting.add(request)
        request.record_event(EngineCoreEventType.QUEUED)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        """End requests from outside the step (aborts); unknown ids are ignored."""
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free(request)

    def _free(self, request: Request) -> dict[str, Any] | None:
        """Forget a request that left; the KV connector's kv_transfer_params for its client."""
        if self._unsent_tokens is not None:
            self._unsent_tokens.pop(request.request_id, None)
        if self.grammars is not None:
            self.grammars.remove(request.request_id)
        self.encoder_cache.release_all(request.request_id, request.mm_features)
        keep, params = False, None
        if self.remote is not None:
            block_ids = self.kv.get_block_ids(request.request_id)
            keep, params = self.remote.release(request, block_ids)
        if not keep:
            self.kv.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]
        return params

    def has_unfinished_requests(self) -> bool:
        """Requests to serve, or blocks a KV transfer still holds (steps report its end)."""
        return bool(self.requests) or bool(self.remote and self.remote.held)

    # -- schedule -------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        step = _Step(token_budget=self.token_budget(), encoder_budget=self.encoder_budget.compute)
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_waiting(step)
        output = self._make_output(step)
        if self.grammars is not None:
            output.grammar_bitmask = self.grammars.build_bitmask(
                self._sampling_grammars(step), output.scheduled_spec_decode_tokens
            )
        for req_id, count in step.num_scheduled.items():
            request = self.requests[req_id]
            request.num_computed_tokens += count
            if self._takes_placeholder(request):
                request.num_output_placeholders += 1
        self.num_encoder_inputs += sum(map(len, step.encoder_inputs.values()))
        output.step_index = self.num_steps
        self.num_steps += 1
        if self.remote is not None:
            output.kv_connector_metadata = self.remote.connector.build_connector_meta(output)
        return output

    def token_budget(self) -> int:
        """The next step's token budget (step_budget.py): fixed, or sized from the step's
        load and measured step times."""
        if not self.budget.measured:
            return self.budget.tokens(StepLoad(0, 0))
        return self.budget.tokens(self._load())

    def _load(self) -> StepLoad:
        """The running requests' decode tokens, and the drain shares of the prompts still
        to compute: of those prefilling and of the waiting ones the step may admit."""
        num_decode = num_drain = 0
        for request in self.running:
            if request.num_tokens - request.num_computed_tokens > 1:
                num_drain += drain_tokens(request.num_tokens, request.num_computed_tokens)
            else:
                num_decode += self._num_known_tokens(request) - request.num_computed_tokens
        admissible = max(self.max_num_seqs - len(self.running), 0)
        for request in itertools.islice(self.waiting, admissible):
            num_drain += drain_tokens(request.num_tokens, request.num_computed_tokens)
        return StepLoad(num_decode, num_drain)

    def observe_step(self, scheduler_output: SchedulerOutput, seconds: float) -> None:
        """How long a step's execution took (not under pipeline parallelism, where steps
        overlap): measured step budgets learn from it."""
        self.budget.observe(scheduler_output.total_num_scheduled_tokens, seconds)

    def _sampling_grammars(self, step: _Step) -> list[str]:
        """Requests with a grammar that sample this step (they reach their last token)."""
        assert self.grammars is not None
        return [
            req_id
            for req_id, count in step.num_scheduled.items()
            if req_id in self.grammars
            and self.requests[req_id].num_computed_tokens + count
            == self.requests[req_id].num_tokens_with_spec
        ]

    def _num_known_tokens(self, request: Request) -> int:
        """The tokens a step may compute for the request: its known ones and drafts, and
        under async scheduling those that steps in flight will sample, unless the last of
        them ends the request (there is then nothing past it to compute)."""
        pending = request.num_output_placeholders
        if pending and (
            request.num_output_tokens + pending >= request.max_tokens
            or request.num_tokens + pending >= self.max_model_len
        ):
            pending = 0
        return request.num_tokens_with_spec + pending

    def _takes_placeholder(self, request: Request) -> bool:
        """Under async scheduling, whether the step just scheduled samples a token the next
        step may compute before it is known: the step reaches the request's end, and nothing
        the next step needs waits on that token (a grammar's bitmask, drafts to verify)."""
        return (
            self.async_scheduling
            and request.sampling_params is not None
            and self.spec_stats is None
            and (self.grammars is None or request.request_id not in self.grammars)
            and request.num_computed_tokens
            == request.num_tokens_with_spec + request.num_output_placeholders
        )

    def _num_new_tokens(self, request: Request, num_computed: int, budget: int) -> int:
        count = self._num_known_tokens(request) - num_computed
        if 0 < self.long_prefill_threshold < count:
            count = self.long_prefill_threshold
        return min(count, budget, self.max_model_len - num_computed)

    def _schedule_running(self, step: _Step) -> None:
        index = 0
        while index < len(self.running) and step.token_budget > 0:
            request = self.running[index]
            count = self._num_new_tokens(request, request.num_computed_tokens, step.token_budget)
            count, to_encode = self._plan_encoder_inputs(
                request, request.num_computed_tokens, count, step
            )
            if count <= 0:
                index += 1
                continue
            blocks = self._allocate_or_preempt(request, count, step)
            if blocks is None:
                break  # the request itself was preempted: nothing more fits
            index = self.running.index(request) + 1
            step.running_reqs.append(request)
            self._take(step, request, count, blocks)
            self._commit_encoder_inputs(request, request.num_computed_tokens, count, to_encode,
                                        step)  # fmt: skip
            # The budget may have cut the request's drafts off: it verifies those reached.
            request.drafts.cut(request.num_computed_tokens + count - request.num_tokens)

    def _allocate_or_preempt(
        self, request: Request, count: int, step: _Step
    ) -> KVCacheBlocks | None:
        """Allocate slots for `request`, preempting others until they fit; None if it
        was preempted itself."""
        while True:
            blocks = self.kv.allocate_slots(
                request, count, num_lookahead_tokens=self.num_lookahead_tokens
            )
            if blocks is not None:
                return blocks
            victim = self._choose_victim()
            self._preempt(victim, step)
            if victim is request:
                return None

    def _choose_victim(self) -> Request:
        if self.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, request: Request, step: _Step) -> None:
        """Free the request's blocks and send it back to wait; it will be recomputed."""
        self.running.remove(request)
        if request.request_id in step.num_scheduled:  # undo what this step gave it
            step.token_budget += step.num_scheduled.pop(request.request_id)
            step.new_blocks.pop(request.request_id)
            step.running_reqs.remove(request)
        # Items it was to encode this step still are (the workers keep a preempted
        # request's state): freeable, they may serve it when it resumes.
        self.kv.free(request)
        self.encoder_cache.release_all(request.request_id, request.mm_features)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.drafts.clear()
        request.num_preemptions += 1
        self.num_preemptions += 1
        request.record_event(EngineCoreEventType.PREEMPTED)
        self.waiting.add_front(request)
        step.preempted = True

    def _schedule_waiting(self, step: _Step) -> None:
        # Still compiling their grammar, or needing an adapter beyond the max_loras the
        # running requests leave room for: they keep their place, later ones go first.
        skipped: list[Request] = []
        adapters = self._running_adapters()
        while self.waiting and step.token_budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting.peek()
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if not self._finish_loading(request):
                    skipped.append(self.waiting.pop())  # keeps its place, blocks no one
                    continue
            lora = request.lora_request
            if lora is not None and lora.lora_int_id not in adapters:
                if len(adapters) >= self.max_loras:
                    skipped.append(self.waiting.pop())
                    continue
            if request.status == RequestStatus.WAITING_FOR_GRAMMAR:
                assert self.grammars is not None  # only requests with grammars wait for one
                if not self.grammars.is_ready(request.request_id):
                    skipped.append(self.waiting.pop())
                    continue
                error = self.grammars.error(request.request_id)
                if error is not None:
                    self._finish_with_error(self.waiting.pop(), error)
                    continue
                request.status = RequestStatus.WAITING
            if not self._admit(request, step, skipped):
                break
            if lora is not None:
                adapters.add(lora.lora_int_id)
        for request in reversed(skipped):
            self.waiting.add_front(request)

    def _running_adapters(self) -> set[int]:
        """The adapters of the running requests: at most max_loras, so any step's share of
        them fits the workers' adapter slots."""
        return {r.lora_request.lora_int_id for r in self.running if r.lora_request is not None}

    def _finish_with_error(self, request: Request, reason: str) -> None:
        request.status = RequestStatus.FINISHED_ERROR
        request.stop_reason = reason
        self._pending_outputs.append(self._output(request, [], None, None))
        self._free(request)

    def _admit(self, request: Request, step: _Step, skipped: list[Request]) -> bool:
        """Schedule the head of the waiting queue, or start loading its external KV (it
        then joins `skipped`); False when it does not fit."""
        if request.num_computed_tokens:  # its external KV loaded: it holds its blocks
            computed_blocks, num_computed, num_external = None, request.num_computed_tokens, 0
        else:
            computed_blocks, num_computed = self.kv.get_computed_blocks(request)
            num_external, load_async = (
                (0, False)
                if self.remote is None
                else self.remote.external_tokens(request, num_computed)
            )
            if load_async:
                return self._start_loading(request, computed_blocks, num_computed, num_external,
                                           skipped)  # fmt: skip
        num_known = num_computed + num_external
        count = self._num_new_tokens(request, num_known, step.token_budget)
        count, to_encode = self._plan_encoder_inputs(request, num_known, count, step)
        if count <= 0:
            return False  # its next item cannot be encoded this step
        if not self.chunked_prefill and num_known + count < request.num_tokens:
            return False  # the whole prompt must fit in one step
        new_computed = num_computed - request.num_computed_tokens
        blocks = self.kv.allocate_slots(request, count, new_computed, computed_blocks,
                                        self.num_lookahead_tokens, num_external)  # fmt: skip
        if blocks is None:
            return False
        self.waiting.pop()
        self.running.append(request)
        resumed = request.status == RequestStatus.PREEMPTED
        (step.resumed_reqs if resumed else step.new_reqs).append(request)
        request.status = RequestStatus.RUNNING
        request.record_event(EngineCoreEventType.SCHEDULED)
        if computed_blocks is not None:
            request.num_computed_tokens = num_computed
            if self.remote is not None:
                block_ids = self.kv.get_block_ids(request.request_id)
                self.remote.connector.update_state_after_alloc(request, block_ids, num_external)
            request.num_computed_tokens = num_known
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_computed
        self._take(step, request, count, blocks)
        self._commit_encoder_inputs(request, num_known, count, to_encode, step)
        return True

    def _start_loading(
        self,
        request: Request,
        computed_blocks: KVCacheBlocks,
        num_computed: int,
        num_external: int,
        skipped: list[Request],
    ) -> bool:
        """Allocate the blocks an asynchronous load fills, unindexed until it finishes."""
        assert self.remote is not None
        blocks = self.kv.allocate_slots(request, 0, num_computed, computed_blocks,
                                        num_external_computed_tokens=num_external,
                                        cache_external=False)  # fmt: skip
        if blocks is None:
            return False
        request.num_computed_tokens = num_computed
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.remote.start_loading(request, num_external)
        block_ids = self.kv.get_block_ids(request.request_id)
        self.remote.connector.update_state_after_alloc(request, block_ids, num_external)
        skipped.append(self.waiting.pop())
        return True

    def _finish_loading(self, request: Request) -> bool:
        """Whether a request waiting for its external KV may be scheduled: its load
        finished (its blocks now join the prefix cache) or failed (it recomputes)."""
        assert self.remote is not None
        done = self.remote.finish_loading(request)
        if done is None:
            return False
        loaded, num_external = done
        if loaded:
            request.num_computed_tokens += num_external
            self.kv.cache_blocks(request, request.num_computed_tokens)
        else:
            self.kv.free(request)  # the loaded blocks were never indexed
            request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        return True

    def _take(self, step: _Step, request: Request, count: int, blocks: KVCacheBlocks) -> None:
        step.num_scheduled[request.request_id] = count
        step.new_blocks[request.request_id] = blocks
        step.token_budget -= count

    # -- multimodal items -------------------------------------------------------------------

    def _needed_items(self, request: Request, start: int, count: int) -> list[int]:
        """Indices of the request's items whose placeholders overlap positions
        start .. start + count - 1: their embeddings are needed this step."""
        features = request.mm_features
        if not features or start >= features[-1].placeholder.end:
            return []
        end = start + count
        return [
            i
            for i, f in enumerate(features)
            if f.placeholder.offset < end and f.placeholder.end > start
        ]

    def _plan_encoder_inputs(
        self, request: Request, start: int, count: int, step: _Step
    ) -> tuple[int, list[int]]:
        """The tokens the request may compute from `start` (at most `count`), cut before
        the first item that neither is encoded nor fits this step's encoder budget and the
        cache's room, and the items to encode for them. Changes nothing."""
        needed = self._needed_items(request, start, count)
        if not needed:  # every text-only step: no cache arithmetic
            return count, []
        cache = self.encoder_cache
        budget, room = step.encoder_budget, cache.room()
        to_encode: list[int] = []
        for i in needed:
            feature = request.mm_features[i]
            identifier, size = feature.identifier, feature.placeholder.length
            if identifier in step.encoding or cache.holds(identifier):
                room -= cache.freeable_size(identifier)  # it will be referenced
                continue
            # Unset, the budget lets an item larger than it be encoded alone in a step.
            alone = (
                not self.encoder_budget.compute_is_explicit
                and budget == self.encoder_budget.compute
            )
            if (size > budget and not alone) or size > room:
                return max(feature.placeholder.offset - start, 0), to_encode
            budget -= size
            room -= size
            to_encode.append(i)
        return count, to_encode

    def _commit_encoder_inputs(
        self, request: Request, start: int, count: int, to_encode: list[int], step: _Step
    ) -> None:
        """Reference the needed items already held, hold room for those to encode."""
        cache, req_id = self.encoder_cache, request.request_id
        for i in self._needed_items(request, start, count):
            feature = request.mm_features[i]
            if cache.uses(req_id, feature.identifier):
                continue
            if i in to_encode:
                cache.count_query(hit=False)
                cache.allocate(req_id, feature)
                step.encoding.add(feature.identifier)
                step.encoder_budget -= feature.placeholder.length
            else:
                cache.count_query(hit=cache.lookup(req_id, feature))
        if to_encode:
            step.encoder_inputs[req_id] = to_encode

    def _release_consumed_items(self, request: Request) -> None:
        """Items whose placeholders are all computed live on in the KV cache: the request
        no longer needs their encoder outputs."""
        for feature in request.mm_features:
            if feature.placeholder.end > request.num_computed_tokens:
                break
            self.encoder_cache.release(request.request_id, feature.identifier)

    def _make_output(self, step: _Step) -> SchedulerOutput:
        new = [
            NewRequestData(
                req_id=r.request_id,
                prompt_token_ids=r.prompt_token_ids,
                sampling_params=r.sampling_params,
                pooling_params=r.pooling_params,
                block_ids=self.kv.get_block_ids(r.request_id),
                num_computed_tokens=r.num_computed_tokens,
                lora_request=r.lora_request,
                mm_features=r.mm_features or None,
            )
            for r in step.new_reqs
        ]
        cached = CachedRequestData()
        for request in step.running_reqs + step.resumed_reqs:
            resumed = request in step.resumed_reqs
            added = step.new_blocks[request.request_id].get_block_ids()
            cached.req_ids.append(request.request_id)
            cached.resumed_from_preemption.append(resumed)
            if resumed:
                cached.new_block_ids.append(self.kv.get_block_ids(request.request_id))
            else:
                cached.new_block_ids.append(added if any(added) else None)
            cached.num_computed_tokens.append(request.num_computed_tokens)
            if self._unsent_tokens is not None:
                cached.new_token_ids.append(self._unsent_tokens.pop(request.request_id, []))
        finished, self.finished_req_ids = self.finished_req_ids, set()
        # Copies: a request's drafts change after the step, its output must not.
        drafts = {r.request_id: list(r.drafts.token_ids) for r in step.running_reqs if r.drafts}
        return SchedulerOutput(
            scheduled_new_reqs=new,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=dict(step.num_scheduled),
            total_num_scheduled_tokens=sum(step.num_scheduled.values()),
            scheduled_spec_decode_tokens=drafts,
            finished_req_ids=finished,
            scheduled_encoder_inputs=step.encoder_inputs,
            free_encoder_mm_hashes=self.encoder_cache.take_evicted(),
        )

    # -- results --------------------------------------------------------------------------

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> EngineCoreOutputs:
        outputs, self._pending_outputs = self._pending_outputs, []
        if runner_output.expert_imbalance is not None:
            self.expert_imbalance = runner_output.expert_imbalance
        if self.remote is not None:
            for request in self.remote.observe(runner_output.kv_connector_output):
                self.kv.free(request)
        drafts = runner_output.spec_token_ids or [[] for _ in runner_output.req_ids]
        for req_id, sampled, next_drafts in zip(
            runner_output.req_ids, runner_output.sampled_token_ids, drafts, strict=True
        ):
            request = self.requests.get(req_id)
            if request is None or request.first_step_index > scheduler_output.step_index:
                continue  # it left while the step ran (aborted, or finished by the step
                # before under async scheduling); or a new request took its id since
            if sampled and request.num_output_placeholders:
                request.num_output_placeholders -= 1  # the token is known now
            if request.mm_features:
                self._release_consumed_items(request)
            pooled = runner_output.pooler_output.get(req_id)
            if pooled is not None:
                outputs.append(self._finish_pooled(request, pooled))
                continue
            verified = scheduler_output.scheduled_spec_decode_tokens.get(req_id, [])
            if verified:
                self._roll_back_rejected(request, len(verified), num_accepted(len(sampled)))
            new_token_ids = self._append_until_stop(request, sampled)
            if self._unsent_tokens is not None and not request.is_finished:
                self._unsent_tokens.setdefault(req_id, []).extend(new_token_ids)
            request.drafts.token_ids = self._next_drafts(request, next_drafts)
            prompt_logprobs = runner_output.prompt_logprobs.get(req_id)
            if new_token_ids or prompt_logprobs is not None or request.is_finished:
                logprobs = runner_output.logprobs.get(req_id)
                outputs.append(self._output(request, new_token_ids, logprobs, prompt_logprobs))
            if request.is_finished:
                self._dequeue(request)
                params = self._free(request)
                if params is not None:  # the request's output is the last one made
                    outputs[-1].kv_transfer_params = params
        connector_output = runner_output.kv_connector_output
        return EngineCoreOutputs(
            outputs=outputs,
            timestamp=time.monotonic(),
            kv_transfer_times=connector_output.transfer_times if connector_output else [],
        )

    def _dequeue(self, request: Request) -> None:
        """Take a request that finished out of its queue: running, or waiting when it was
        preempted while a step that samples for it ran (steps overlap: pipeline stages,
        async scheduling)."""
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting.remove(request)

    def _finish_pooled(self, request: Request, pooled: list[float]) -> EngineCoreOutput:
        """A pooled request is done once its prompt is computed: its vector is its output."""
        request.status = RequestStatus.FINISHED_STOPPED
        output = self._output(request, [], None, None)
        output.pooling_output = pooled
        self._dequeue(request)
        self._free(request)
        return output

    def _roll_back_rejected(self, request: Request, num_drafts: int, accepted: int) -> None:
        """Forget the KV of rejected drafts (the slots get overwritten) and count the result."""
        request.num_computed_tokens -= num_drafts - accepted
        assert self.spec_stats is not None  # drafts are only scheduled with speculation on
        self.spec_stats.observe(num_drafts, accepted)

    def _next_drafts(self, request: Request, drafts: list[int]) -> list[int]:
        """The drafts the next step may verify: those whose verification's tokens fit
        under max_tokens and max_model_len; under a grammar, only the prefix the grammar
        allows; none for a finished request."""
        if request.is_finished:
            return []
        room = min(
            request.max_tokens - request.num_output_tokens,
            self.max_model_len - request.num_tokens,
        )
        drafts = drafts[: num_drafts_within(room)]
        if drafts and self.grammars is not None and request.request_id in self.grammars:
            drafts = self.grammars.validate_tokens(request.request_id, drafts)
        return drafts

    def _output(
        self,
        request: Request,
        new_token_ids: list[int],
        logprobs: LogprobsLists | None,
        prompt_logprobs: LogprobsLists | None,
    ) -> EngineCoreOutput:
        return EngineCoreOutput(
            request_id=request.request_id,
            new_token_ids=new_token_ids,
            new_logprobs=logprobs,
            new_prompt_logprobs=prompt_logprobs,
            finish_reason=request.get_finished_reason(),
            stop_reason=request.stop_reason,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            events=request.take_events(),
        )

    def _append_until_stop(self, request: Request, sampled: list[int]) -> list[int]:
        for i, token_id in enumerate(sampled):
            request.append_output_token_ids(token_id)
            if self._check_grammar(request, token_id) or self._check_stop(request, token_id):
                return sampled[: i + 1]
        return sampled

    def _check_grammar(self, request: Request, token_id: int) -> bool:
        """Advance the request's grammar; finish the request when the grammar is done
        (STOPPED) or the token broke it (ERROR, which the bitmask should make impossible)."""
        req_id = request.request_id
        if self.grammars is None or req_id not in self.grammars:
            return False
        if not self.grammars.accept_tokens(req_id, [token_id]):
            request.status = RequestStatus.FINISHED_ERROR
            request.stop_reason = f"token {token_id} is not allowed by the grammar"
            return True
        if self.grammars.is_terminated(req_id):
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        return False

    def _check_stop(self, request: Request, token_id: int) -> bool:
        """Set the finished status when the new token ends the request.

        A stop token at the last allowed position reports "stop", not "length". Stop
        strings are the frontend's: it detokenizes, and aborts the request on a match.
        """
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            if token_id == request.eos_token_id and not params.ignore_eos:
                request.status = RequestStatus.FINISHED_STOPPED
                return True
            if params.stop_token_ids and token_id in params.stop_token_ids:
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = token_id
                return True
        if (
            request.num_output_tokens >= request.max_tokens
            or request.num_tokens >= self.max_model_len
        ):
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    # -- stats ----------------------------------------------------------------------------

    def _transfer_stats(self) -> dict[str, Any]:
        """SchedulerStats' KV connector fields (all 0 without one)."""
        if self.remote is None:
            return {}
        totals = self.remote.transfers
        return {
            "external_prefix_cache_queries": self.remote.num_queried_tokens,
            "external_prefix_cache_hits": self.remote.num_hit_tokens,
            "kv_transfer_blocks": totals.num_blocks,
            "kv_transfer_bytes": totals.num_bytes,
            "kv_transfer_failed_loads": totals.num_failed_loads,
        }

    def make_stats(self) -> SchedulerStats:
        cache = self.kv.prefix_cache_stats
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=self.kv.usage,
            prefix_cache_queries=cache.queries,
            prefix_cache_hits=cache.hits,
            num_preemptions=self.num_preemptions,
            num_waiting_deferred=num_deferred(
                self.waiting, self._running_adapters(), self.max_loras, self.grammars
            ),
            **self._transfer_stats(),
            spec_decoding=self.spec_stats and self.spec_stats.snapshot(),
            expert_imbalance=self.expert_imbalance,
            running_lora_adapters=_count_adapters(self.running),
            waiting_lora_adapters=_count_adapters(self.waiting),
            mm_cache_queries=self.encoder_cache.num_queries,
            mm_cache_hits=self.encoder_cache.num_hits,
            num_encoder_inputs=self.num_encoder_inputs,
            encoder_cache_usage=self.encoder_cache.usage,
        )


def _count_adapters(requests: Iterable[Request]) -> dict[str, int]:
    """{adapter name: how many of `requests` use it}."""
    return dict(Counter(r.lora_name for r in requests if r.lora_name is not None))
