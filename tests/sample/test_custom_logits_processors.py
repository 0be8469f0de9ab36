"""Custom logits processors inside the worker and the sampler: the persistent batch's
changes reach them as BatchUpdates (removed, added, moved), they see the whole batch row for
row, and the reference sampler applies them where DESIGN.md section 5 puts them."""

from __future__ import annotations

import math

import pytest
import torch

from core.sample.logit_softcap import SoftcapLogitsProcessor
from core.sample.logits_processor import (
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
    update_row_states,
)
from core.sample.logits_processors import LogitsProcessors
from core.sample.metadata import SamplingMetadata
from core.sample.sampler import DefaultSampler
from core.sampling_params import SamplingParams
from core.worker.input_batch import CachedRequestState, InputBatch

UNI, SWAP = MoveDirectionality.UNIDIRECTIONAL, MoveDirectionality.SWAP


def state(req_id: str, params: SamplingParams | None = None) -> CachedRequestState:
    return CachedRequestState(req_id, [1, 2], params or SamplingParams(), None, ([],), 0)


def test_the_batch_reports_removals_additions_and_condensing_moves_in_order():
    batch = InputBatch(max_num_reqs=4, max_model_len=8, block_sizes=[4])
    states = [state(name) for name in "abcd"]
    for s in states:
        batch.add(s)
    first = batch.changes.build(batch.num_reqs)
    assert [(row, params) for row, params, *_ in first.added] == [
        (i, s.sampling_params) for i, s in enumerate(states)
    ]
    assert first.added[2][3] is states[2].output_token_ids  # the live list, not a copy
    batch.remove("a")
    batch.remove("c")
    batch.add(state("e"))  # takes the lowest free row
    batch.condense()  # d (row 3) moves into row 2
    update = batch.changes.build(batch.num_reqs)
    assert (update.batch_size, list(update.removed)) == (3, [0, 2])
    assert [row for row, *_ in update.added] == [0]
    assert list(update.moved) == [(3, 2, UNI)]
    assert batch.changes.build(batch.num_reqs) is None  # nothing since


def test_row_states_follow_removals_additions_and_moves():
    states = {0: "a", 1: "b", 3: "d"}
    ask = SamplingParams(extra_args={"x": "e"})
    update = BatchUpdate(
        batch_size=3,
        removed=[1],
        added=[(1, ask, [], []), (3, SamplingParams(), [], [])],  # row 3: a request not asking
        moved=[(0, 2, UNI), (1, 2, SWAP)],
    )
    update_row_states(states, update, lambda p: (p.extra_args or {}).get("x"))
    # a: 0 -> 2; then e (row 1) and a (row 2) swap; row 3's request asks for nothing
    assert states == {2: "e", 1: "a"}
    update_row_states(states, None, lambda p: None)
    assert states == {2: "e", 1: "a"}


class Recorder(LogitsProcessor):
    """Records the logits it is applied to and adds `shift` to every row."""

    def __init__(self, argmax_invariant: bool, shift: float = 0.0, in_place: bool = False):
        self.argmax_invariant, self.shift, self.in_place = argmax_invariant, shift, in_place
        self.seen: list[torch.Tensor] = []

    def is_argmax_invariant(self) -> bool:
        return self.argmax_invariant

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self.seen.append(logits.clone())
        if self.in_place:
            logits += self.shift
            return logits
        return logits + self.shift


def test_processors_see_the_whole_batch_while_only_sampling_rows_come_back():
    recorder = Recorder(argmax_invariant=False, shift=1.0, in_place=True)
    step = LogitsProcessors([recorder]).of_step([0, 2], batch_size=3)
    logits = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # batch rows 0 and 2
    out = step.apply(logits, argmax_invariant=False)
    assert torch.equal(recorder.seen[0], torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, 4.0]]))
    assert torch.equal(out, logits + 1.0)
    assert torch.equal(logits, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))  # never modified
    whole = LogitsProcessors([recorder]).of_step([0, 1], batch_size=2)
    assert torch.equal(whole.apply(logits, argmax_invariant=False), logits + 1.0)
    assert torch.equal(logits, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert LogitsProcessors([]).of_step([0], batch_size=1) is None


def metadata(
    params: list[SamplingParams], processors: list[LogitsProcessor], **kwargs
) -> SamplingMetadata:
    step = LogitsProcessors(processors).of_step(range(len(params)), len(params))
    return SamplingMetadata.from_params(
        params,
        output_token_ids=[[] for _ in params],
        prompt_token_ids=[[0] for _ in params],
        vocab_size=4,
        logits_processors=step,
        **kwargs,
    )


def test_the_sampler_applies_them_where_design_section_5_puts_them():
    logits = torch.tensor([[0.0, 4.0, 2.0, 1.0]])
    params = [SamplingParams(temperature=2.0, logit_bias={0: 10.0}, frequency_penalty=0.0)]
    before, after = Recorder(argmax_invariant=False), Recorder(argmax_invariant=True)
    DefaultSampler().process_logits(logits, metadata(params, [before, after]))
    # The other kind: with the logit bias (before temperature); argmax-invariant: after it.
    assert torch.equal(before.seen[0], torch.tensor([[10.0, 4.0, 2.0, 1.0]]))
    assert torch.equal(after.seen[0], torch.tensor([[5.0, 2.0, 1.0, 0.5]]))


def test_a_processor_that_moves_the_argmax_decides_greedy_tokens_the_others_do_not_run():
    logits = torch.tensor([[0.0, 4.0, 2.0, 1.0]])
    greedy = [SamplingParams(temperature=0.0)]
    boost_last = Recorder(argmax_invariant=False)
    boost_last.apply = lambda x: x + torch.tensor([0.0, 0.0, 0.0, 9.0])  # type: ignore[method-assign]
    invariant = Recorder(argmax_invariant=True)
    out = DefaultSampler()(logits, metadata(greedy, [boost_last, invariant]))
    assert out.sampled_token_ids.tolist() == [3]
    assert invariant.seen == []  # skipped: every row is greedy


def test_the_reference_softcap_squashes_only_the_rows_that_ask():
    capped = SamplingParams(extra_args={"logit_softcap": 2.0})
    processor = SoftcapLogitsProcessor(None, torch.device("cpu"), False)  # type: ignore[arg-type]
    processor.update_state(
        BatchUpdate(2, [], [(0, SamplingParams(), [], []), (1, capped, [], [])], [])
    )
    assert processor.is_argmax_invariant()
    out = processor.apply(torch.tensor([[8.0, -1.0], [8.0, -1.0]]))
    assert out[0].tolist() == [8.0, -1.0]
    assert out[1].tolist() == pytest.approx([2 * math.tanh(4.0), 2 * math.tanh(-0.5)])


@pytest.mark.parametrize("value", [0, -1.5, "2", True, math.inf, [1]])
def test_the_reference_softcap_refuses_what_is_no_positive_number(value):
    with pytest.raises(ValueError, match="logit_softcap must be"):
        SoftcapLogitsProcessor.validate_params(SamplingParams(extra_args={"logit_softcap": value}))
    SoftcapLogitsProcessor.validate_params(SamplingParams(extra_args={"other": 1}))
