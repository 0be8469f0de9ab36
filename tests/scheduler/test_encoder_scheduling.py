"""The scheduler's multimodal side: each item encoded once, before the step that first
computes one of its placeholder positions, within the step's encoder budget and the
encoder cache's room; items shared by identifier and evicted only when unreferenced."""

from __future__ import annotations

import torch
from test_scheduler import BLOCK, EOS, MAX_LEN, fake_run, make_scheduler

from core.multimodal.inputs import MultiModalFeature, PlaceholderRange, TensorData
from core.request import Request
from core.sampling_params import SamplingParams
from core.scheduler.scheduler import Scheduler
from core.worker.contract import SchedulerOutput

IMAGE_TOKEN = 99
PIXELS = TensorData.from_tensor(torch.zeros(1))


def image(identifier: str, offset: int, length: int) -> MultiModalFeature:
    return MultiModalFeature("image", identifier, PlaceholderRange(offset, length), {"p": PIXELS})


def add(scheduler: Scheduler, req_id: str, prompt: list[int], features, arrival=0.0) -> Request:
    request = Request(
        req_id,
        prompt,
        SamplingParams(temperature=0.0, max_tokens=2),
        eos_token_id=EOS,
        arrival_time=arrival,
        block_hasher=scheduler.kv.block_hasher,
        max_model_len=MAX_LEN,
        mm_features=features,
    )
    scheduler.add_request(request)
    return request


def prompt_with(runs: list[tuple[int, int]], length: int, seed: int = 0) -> list[int]:
    """A prompt of `length` text tokens (from `seed` on) with image placeholder runs
    (offset, length)."""
    prompt = [((seed + i) % 50) + 1 for i in range(length)]
    for offset, run in runs:
        prompt[offset : offset + run] = [IMAGE_TOKEN] * run
    return prompt


def run(scheduler: Scheduler) -> list[SchedulerOutput]:
    outputs = []
    while scheduler.has_unfinished_requests():
        so = scheduler.schedule()
        scheduler.update_from_output(so, fake_run(scheduler, so))
        outputs.append(so)
    return outputs


def encoded(outputs: list[SchedulerOutput]) -> list[list[str]]:
    """Per step, the identifiers of the items scheduled for encoding."""
    features = {new.req_id: new.mm_features for so in outputs for new in so.scheduled_new_reqs}
    return [
        [features[req_id][i].identifier for req_id, idx in
         so.scheduled_encoder_inputs.items() for i in idx]
        for so in outputs
    ]  # fmt: skip


def test_an_item_split_by_chunked_prefill_is_encoded_once_before_its_first_position():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    features = [image("a", 3, 10)]
    add(scheduler, "r", prompt_with([(3, 10)], 16), features)
    steps = encoded(run(scheduler))
    assert steps[0] == ["a"]  # the first chunk reaches position 3
    assert all(step == [] for step in steps[1:])  # the rest of the run reuses it
    assert scheduler.num_encoder_inputs == 1


def test_the_chunk_stops_before_an_item_the_encoder_budget_cannot_take():
    scheduler = make_scheduler(max_num_batched_tokens=32, max_num_encoder_input_tokens=6)
    features = [image("a", 2, 5), image("b", 9, 5)]
    add(scheduler, "r", prompt_with([(2, 5), (9, 5)], 20), features)
    first = scheduler.schedule()
    assert first.num_scheduled_tokens["r"] == 9  # up to b's first position
    assert first.scheduled_encoder_inputs == {"r": [0]}
    scheduler.update_from_output(first, fake_run(scheduler, first))
    second = scheduler.schedule()
    assert second.scheduled_encoder_inputs == {"r": [1]}
    assert second.num_scheduled_tokens["r"] == 11


def test_requests_with_the_same_image_share_one_encoding():
    scheduler = make_scheduler(max_num_batched_tokens=64)
    # Different text before the image: no request hits another's blocks in the prefix cache.
    for i in range(4):
        add(scheduler, f"r{i}", prompt_with([(1, 6)], 10, seed=i), [image("same", 1, 6)])
    assert sum(len(step) for step in encoded(run(scheduler))) == 1
    cache = scheduler.encoder_cache
    assert (cache.num_queries, cache.num_hits) == (4, 3)


def test_a_finished_items_output_stays_until_its_room_is_needed():
    scheduler = make_scheduler(max_num_batched_tokens=64, encoder_cache_size=8)
    add(scheduler, "a", prompt_with([(1, 6)], 10), [image("x", 1, 6)])
    run(scheduler)
    assert scheduler.encoder_cache.holds("x")  # freeable, not evicted
    add(scheduler, "b", prompt_with([(1, 6)], 12), [image("x", 1, 6)], arrival=1.0)
    outputs = run(scheduler)
    assert all(not so.scheduled_encoder_inputs for so in outputs)  # reused
    add(scheduler, "c", prompt_with([(1, 5)], 12), [image("y", 1, 5)], arrival=2.0)
    outputs = run(scheduler)
    assert outputs[0].free_encoder_mm_hashes == ["x"]  # evicted to make room for y
    assert outputs[0].scheduled_encoder_inputs == {"c": [0]}


def test_an_item_in_use_is_never_evicted_the_next_waits():
    scheduler = make_scheduler(max_num_batched_tokens=4, encoder_cache_size=8)
    add(scheduler, "a", prompt_with([(0, 6)], 10), [image("x", 0, 6)])
    add(scheduler, "b", prompt_with([(0, 6)], 10), [image("y", 0, 6)], arrival=1.0)
    first = scheduler.schedule()
    # a's first chunk holds x (6 of 8); y does not fit beside it, so b waits.
    assert first.scheduled_encoder_inputs == {"a": [0]}
    assert "b" not in first.num_scheduled_tokens
    scheduler.update_from_output(first, fake_run(scheduler, first))
    outputs = [first, *run(scheduler)]
    assert ["y"] in encoded(outputs)


def test_an_item_larger_than_the_default_budget_is_encoded_alone():
    scheduler = make_scheduler(max_num_batched_tokens=4)  # budget 4, the item 10
    add(scheduler, "r", prompt_with([(0, 10)], 12), [image("big", 0, 10)])
    first = scheduler.schedule()
    assert first.scheduled_encoder_inputs == {"r": [0]}
    assert first.num_scheduled_tokens["r"] == 4


def test_an_item_in_the_prefix_cache_is_not_encoded_again():
    scheduler = make_scheduler(max_num_batched_tokens=64)
    prompt = prompt_with([(0, 2 * BLOCK)], 3 * BLOCK + 1)
    add(scheduler, "a", prompt, [image("x", 0, 2 * BLOCK)])
    run(scheduler)
    scheduler.encoder_cache.allocate("evictor", image("filler", 0, scheduler.encoder_cache.room()))
    assert not scheduler.encoder_cache.holds("x")  # its output is gone, its KV is not
    b = add(scheduler, "b", prompt, [image("x", 0, 2 * BLOCK)], arrival=1.0)
    so = scheduler.schedule()
    assert so.scheduled_encoder_inputs == {}
    assert b.num_computed_tokens - so.num_scheduled_tokens["b"] == 3 * BLOCK
