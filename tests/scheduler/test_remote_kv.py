"""The scheduler's side of a KV connector, on a real KV-cache manager with a fake connector:
asynchronous loads wait without blocking others and stay out of the prefix cache until
done, a failed load recomputes, and blocks a transfer still uses are never reused."""

from __future__ import annotations

from typing import Any

from test_scheduler import BLOCK, EOS, MAX_LEN, fake_run, make_request, make_scheduler

from core.kv_transfer.interface import KVConnector, KVConnectorMetadata, KVConnectorOutput
from core.request import Request, RequestStatus
from core.sampling_params import SamplingParams
from core.scheduler.scheduler import Scheduler
from core.worker.contract import SchedulerOutput


class FakeConnector(KVConnector):
    """Offers `offers[request id]` tokens (none for others), loaded asynchronously; records
    the calls."""

    def __init__(self, offers: dict[str, int] | None = None, keep_on_finish: bool = False):
        super().__init__(None, None)
        self.offers = offers or {}
        self.keep_on_finish = keep_on_finish
        self.allocs: list[tuple[str, int, int]] = []  # (id, local hit, external tokens)
        self.metas = 0
        self.finished: list[str] = []

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        offer = self.offers.get(request.request_id, 0)
        return offer, offer > 0

    def update_state_after_alloc(self, request, block_ids, num_external_tokens) -> None:
        self.allocs.append((request.request_id, request.num_computed_tokens, num_external_tokens))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        self.metas += 1
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        self.finished.append(request.request_id)
        return self.keep_on_finish, None

    def start_load_kv(self, forward_context: Any) -> None: ...

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata) -> None: ...


def connected(connector: FakeConnector) -> Scheduler:
    return make_scheduler(max_num_batched_tokens=64, kv_connector=connector)


def add(scheduler: Scheduler, req_id: str, prompt: list[int]) -> Request:
    request = Request(req_id, prompt, SamplingParams(temperature=0.0, max_tokens=4), EOS,
                      arrival_time=0, block_hasher=scheduler.kv.block_hasher,
                      max_model_len=MAX_LEN)  # fmt: skip
    scheduler.add_request(request)
    return request


def step(scheduler: Scheduler, kv_output: KVConnectorOutput | None = None) -> SchedulerOutput:
    so = scheduler.schedule()
    output = fake_run(scheduler, so)
    output.kv_connector_output = kv_output
    scheduler.update_from_output(so, output)
    return so


def free_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv.coordinator.block_pools[0].get_num_free_blocks()


def test_a_loading_request_waits_without_blocking_the_one_behind_it():
    connector = FakeConnector({"loading": 2 * BLOCK})
    scheduler = connected(connector)
    loading = make_request(scheduler, "loading", num_prompt=10)
    other = make_request(scheduler, "other", num_prompt=5)
    so = step(scheduler)
    assert so.num_scheduled_tokens == {"other": 5}
    assert loading.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert connector.allocs[0] == ("loading", 0, 8) and connector.metas == 1
    # Until the workers say the load is done, it waits; then only its last 2 tokens run.
    assert "loading" not in step(scheduler).num_scheduled_tokens
    so = step(scheduler, KVConnectorOutput(finished_recving={"loading"}))
    assert "loading" not in so.num_scheduled_tokens  # the report comes with the step's output
    so = step(scheduler)
    assert so.num_scheduled_tokens["loading"] == 2 and loading.num_output_tokens == 1
    assert loading.num_cached_tokens == 8 and other.num_output_tokens == 4


def test_loaded_blocks_join_the_prefix_cache_only_once_the_load_is_done():
    connector = FakeConnector({"first": 2 * BLOCK})
    scheduler = connected(connector)
    prompt = list(range(1, 11))
    add(scheduler, "first", prompt)
    step(scheduler)  # allocated and loading
    twin = add(scheduler, "twin", prompt)
    step(scheduler)
    assert twin.num_cached_tokens == 0  # nothing half-written was shared
    step(scheduler, KVConnectorOutput(finished_recving={"first"}))
    late_twin = add(scheduler, "late-twin", prompt)
    step(scheduler)
    assert late_twin.num_cached_tokens == 8
    # The connector hears of the admission with the local hit as computed, nothing external.
    assert connector.allocs[-1] == ("late-twin", 8, 0)


def test_a_failed_load_recomputes_the_prompt_without_asking_the_connector_again():
    connector = FakeConnector({"r": 2 * BLOCK})
    scheduler = connected(connector)
    request = make_request(scheduler, "r", num_prompt=10)
    step(scheduler)
    step(scheduler, KVConnectorOutput(failed_recving={"r"}))
    so = step(scheduler)
    assert so.num_scheduled_tokens == {"r": 10} and request.num_cached_tokens == 0
    assert connector.allocs == [("r", 0, 8), ("r", 0, 0)]  # no second offer taken
    while scheduler.has_unfinished_requests():
        step(scheduler)
    assert free_blocks(scheduler) == 63


def test_external_tokens_leave_the_prompts_last_token_to_compute():
    connector = FakeConnector({"r": 12})
    scheduler = connected(connector)
    make_request(scheduler, "r", num_prompt=12)
    step(scheduler)
    assert connector.allocs == [("r", 0, 11)]


def test_an_aborted_loading_request_keeps_its_blocks_until_the_load_reports():
    connector = FakeConnector({"r": 2 * BLOCK})
    scheduler = connected(connector)
    make_request(scheduler, "r", num_prompt=10)
    step(scheduler)
    held = free_blocks(scheduler)
    scheduler.finish_requests(["r"], RequestStatus.FINISHED_ABORTED)
    assert free_blocks(scheduler) == held and scheduler.has_unfinished_requests()
    assert connector.finished == []  # the connector learns nothing until its load is done
    step(scheduler, KVConnectorOutput(finished_recving={"r"}))
    assert free_blocks(scheduler) == 63 and not scheduler.has_unfinished_requests()


def test_blocks_a_send_holds_are_freed_when_the_send_finishes():
    connector = FakeConnector(keep_on_finish=True)
    scheduler = connected(connector)
    make_request(scheduler, "r", num_prompt=6, max_tokens=1)
    step(scheduler)
    assert connector.finished == ["r"] and free_blocks(scheduler) < 63
    assert scheduler.has_unfinished_requests()  # steps go on to hear the send end
    step(scheduler, KVConnectorOutput(finished_sending={"r"}))
    assert free_blocks(scheduler) == 63 and not scheduler.has_unfinished_requests()


def test_each_transfer_the_workers_timed_reaches_the_steps_outputs_once():
    scheduler = connected(FakeConnector(keep_on_finish=True))
    make_request(scheduler, "r", num_prompt=6, max_tokens=1)
    so = scheduler.schedule()
    output = fake_run(scheduler, so)
    output.kv_connector_output = KVConnectorOutput()
    output.kv_connector_output.count_moved(2, 2048, 0.25)
    output.kv_connector_output.count_moved(1, 1024, 0.5)
    assert scheduler.update_from_output(so, output).kv_transfer_times == [0.25, 0.5]
    so = scheduler.schedule()
    assert scheduler.update_from_output(so, fake_run(scheduler, so)).kv_transfer_times == []
    stats = scheduler.make_stats()
    assert (stats.kv_transfer_blocks, stats.kv_transfer_bytes) == (3, 3072)
