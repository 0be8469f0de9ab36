"""Drives a Worker step by step with hand-built SchedulerOutputs (there is no scheduler).

Block ids come from a simple counter (block 0 stays the null block); a request can start
from blocks another request already filled, as a prefix-cache hit would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core.sample.interface import Sampler, SamplerOutput
from core.sample.metadata import SamplingMetadata
from core.sampling_params import SamplingParams
from core.worker.contract import CachedRequestData, NewRequestData, SchedulerOutput


class RecordingSampler(Sampler):
    """Wraps a sampler and keeps the logits of every call (for parity checks)."""

    def __init__(self, inner: Sampler) -> None:
        super().__init__()
        self.inner = inner
        self.calls: list[torch.Tensor] = []

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        self.calls.append(logits.clone())
        return self.inner(logits, metadata)


@dataclass
class _Req:
    prompt: list[int]
    params: SamplingParams
    blocks: list[int]
    computed: int
    output: list[int] = field(default_factory=list)
    known_to_worker: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class StepDriver:
    def __init__(self, worker, block_size: int = 16) -> None:
        self.worker = worker
        self.block_size = block_size
        self.reqs: dict[str, _Req] = {}
        self._next_block = 1

    def add(
        self,
        req_id: str,
        prompt: list[int],
        params: SamplingParams | None = None,
        shared_blocks: list[int] | None = None,
        num_cached_tokens: int = 0,
    ) -> None:
        """Queue a request; `shared_blocks` holding `num_cached_tokens` are a cache hit."""
        params = params or SamplingParams(temperature=0.0, max_tokens=64)
        self.reqs[req_id] = _Req(prompt, params, list(shared_blocks or []), num_cached_tokens)

    def blocks_of(self, req_id: str) -> list[int]:
        return list(self.reqs[req_id].blocks)

    def step(self, schedule: dict[str, int], finished: set[str] = frozenset()):
        """Compute `schedule[req_id]` more tokens of each request; returns the output."""
        new, cached = [], CachedRequestData()
        for req_id, count in schedule.items():
            req = self.reqs[req_id]
            added = self._grow(req, req.computed + count)
            if not req.known_to_worker:
                new.append(NewRequestData(req_id=req_id, prompt_token_ids=req.prompt,
                                          sampling_params=req.params, block_ids=(req.blocks,),
                                          num_computed_tokens=req.computed))  # fmt: skip
                req.known_to_worker = True
            else:
                cached.req_ids.append(req_id)
                cached.resumed_from_preemption.append(False)
                cached.new_block_ids.append((added,) if added else None)
                cached.num_computed_tokens.append(req.computed)
        output = self.worker.execute_model(
            SchedulerOutput(
                scheduled_new_reqs=new,
                scheduled_cached_reqs=cached,
                num_scheduled_tokens=dict(schedule),
                total_num_scheduled_tokens=sum(schedule.values()),
                finished_req_ids=set(finished),
            )
        )
        for req_id, count in schedule.items():
            self.reqs[req_id].computed += count
        for req_id, tokens in zip(output.req_ids, output.sampled_token_ids, strict=True):
            self.reqs[req_id].output.extend(tokens)
        for req_id in finished:
            self.reqs.pop(req_id, None)
        return output

    def _grow(self, req: _Req, num_tokens: int) -> list[int]:
        needed = -(-num_tokens // self.block_size) - len(req.blocks)
        added = list(range(self._next_block, self._next_block + max(needed, 0)))
        self._next_block += len(added)
        req.blocks.extend(added)
        return added
