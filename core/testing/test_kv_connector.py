"""Conformance of a KV connector (`--core-conformance=kv_connector:NAME`).

The class subclasses KVConnector (checked when it is looked up), constructs as
`cls(config, role)` for both roles, and answers in the documented types: in the
scheduler role, on a prompt of one request, (matched tokens within the prompt, async
flag), None after allocation, a KVConnectorMetadata for the step, (keep blocks, transfer
params or None) when the request finishes; in the worker role, one whole step over
reference-layout KV caches with that metadata bound (load, per-layer wait and save,
wait for saves), then a KVConnectorOutput of request-id sets. A connector that offers
saved KV back (a store, not a one-way sender) returns it byte for byte into other blocks
for a request with the same prompt, reports an asynchronous load in finished_recving, and
offers no block again once a load of it was reported failed. Every instance is shut down
after its check (`shutdown`: a listening socket is released, so the next check may bind
it again).

`--core-conformance-kv-config NAME=JSON` gives connector NAME its
kv_connector_extra_config (e.g. a port, or the list a composite connector wraps).
"""

from __future__ import annotations

import pytest
import torch

from core.attention.backends.torch_ref import TorchRefBackend
from core.attention.interface import CommonAttentionMetadata
from core.config import CacheConfig, EngineConfig, KVTransferConfig
from core.forward_context import ForwardContext
from core.kv_cache.spec import FullAttentionSpec
from core.kv_transfer.interface import (
    KVConnector,
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorRole,
)
from core.request import Request
from core.sampling_params import SamplingParams
from core.testing.plugin import kv_config_of, targets_of
from core.worker.contract import NewRequestData, SchedulerOutput

REQ_ID = "conformance-0"
PROMPT = list(range(1, 11))  # 10 tokens
BLOCK_SIZE, BLOCK_IDS = 4, [3, 1, 2]  # the prompt's blocks, out of order on purpose
FREE_BLOCK_IDS = [4, 6, 5]  # where a second request with that prompt loads it
NUM_BLOCKS, NUM_KV_HEADS, HEAD_SIZE = 7, 2, 8
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    targets = targets_of(metafunc.config, "kv_connector")
    params = [pytest.param(t.value, t.spec.name, id=t.id) for t in targets]
    metafunc.parametrize(("connector_cls", "connector_name"), params)


@pytest.fixture
def config(connector_name: str, request: pytest.FixtureRequest) -> EngineConfig:
    extra = kv_config_of(request.config, connector_name)
    transfer = KVTransferConfig(
        kv_connector=connector_name, kv_role="kv_both", kv_connector_extra_config=extra
    )
    return EngineConfig(kv_transfer=transfer, cache=CacheConfig(block_size=BLOCK_SIZE))


@pytest.fixture
def make(connector_cls: type[KVConnector], config: EngineConfig):
    """`make(role)`: a connector of the class under test, shut down after the check."""
    made: list[KVConnector] = []

    def build(role: KVConnectorRole) -> KVConnector:
        made.append(connector_cls(config, role))
        return made[-1]

    yield build
    for connector in made:
        connector.shutdown()


def request() -> Request:
    return Request(REQ_ID, PROMPT, SamplingParams(max_tokens=4), eos_token_id=None,
                   arrival_time=0, block_hasher=_hasher())  # fmt: skip


def scheduler_output() -> SchedulerOutput:
    new = NewRequestData(
        req_id=REQ_ID,
        prompt_token_ids=PROMPT,
        sampling_params=SamplingParams(max_tokens=4),
        block_ids=(BLOCK_IDS,),
        num_computed_tokens=0,
    )
    return SchedulerOutput(
        scheduled_new_reqs=[new],
        num_scheduled_tokens={REQ_ID: len(PROMPT)},
        total_num_scheduled_tokens=len(PROMPT),
    )


@pytest.mark.parametrize("role", list(KVConnectorRole), ids=lambda r: r.value)
def test_constructs_in_both_roles(make, role: KVConnectorRole) -> None:
    assert make(role).role is role


@pytest.mark.parametrize("num_computed", [0, BLOCK_SIZE])
def test_scheduler_role_answers_in_the_documented_types(make, num_computed: int) -> None:
    connector = make(KVConnectorRole.SCHEDULER)
    req = request()
    matched, is_async = connector.get_num_new_matched_tokens(req, num_computed)
    assert type(matched) is int and type(is_async) is bool, f"{(matched, is_async)!r}"
    assert 0 <= matched <= req.num_tokens - num_computed, f"{matched} matched tokens"
    assert connector.update_state_after_alloc(req, (BLOCK_IDS,), matched) is None
    assert isinstance(connector.build_connector_meta(scheduler_output()), KVConnectorMetadata)
    keep, params = connector.request_finished(req, (BLOCK_IDS,))
    assert type(keep) is bool and (params is None or isinstance(params, dict)), (keep, params)


def test_worker_role_runs_a_step(make) -> None:
    scheduler = make(KVConnectorRole.SCHEDULER)
    req = request()
    matched, _ = scheduler.get_num_new_matched_tokens(req, 0)
    scheduler.update_state_after_alloc(req, (BLOCK_IDS,), matched)
    metadata = scheduler.build_connector_meta(scheduler_output())

    worker = make(KVConnectorRole.WORKER)
    shape = TorchRefBackend.get_kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    kv_caches = {layer: torch.randn(shape) for layer in LAYERS}
    worker.register_kv_caches(kv_caches)
    output = _run_worker_step(worker, metadata, kv_caches, finished={REQ_ID})
    assert isinstance(output, KVConnectorOutput), f"get_finished returned {output!r}"
    for field in ("finished_sending", "finished_recving", "failed_recving"):
        ids = getattr(output, field)
        assert isinstance(ids, set) and all(isinstance(i, str) for i in ids), f"{field}: {ids!r}"


def test_saved_blocks_load_back_byte_for_byte(make) -> None:
    scheduler, worker, kv_caches = _saved_prompt(make)
    saved = {layer: cache.clone() for layer, cache in kv_caches.items()}
    loader = _request("conformance-1")
    matched, is_async = scheduler.get_num_new_matched_tokens(loader, 0)
    if matched == 0:
        pytest.skip("the connector offers nothing back to the engine that saved (a sender)")
    # Whole blocks, or up to the prompt's last token (the scheduler computes that one).
    assert matched < len(PROMPT), f"{matched} matched tokens of a {len(PROMPT)}-token prompt"
    assert matched % BLOCK_SIZE == 0 or matched == len(PROMPT) - 1, f"{matched} matched tokens"
    targets = FREE_BLOCK_IDS[: -(-matched // BLOCK_SIZE)]
    scheduler.update_state_after_alloc(loader, (FREE_BLOCK_IDS,), matched)
    output = _run_worker_step(worker, scheduler.build_connector_meta(SchedulerOutput()), kv_caches)
    for layer in LAYERS:
        for source, target in zip(BLOCK_IDS, targets, strict=False):
            assert torch.equal(kv_caches[layer][target], saved[layer][source]), (
                f"{layer}: block {target} does not hold what block {source} saved"
            )
    if is_async:
        assert output.finished_recving == {loader.request_id}, output
        assert not output.failed_recving, output


def test_blocks_of_a_failed_load_are_not_offered_again(make) -> None:
    scheduler, _, _ = _saved_prompt(make)
    loader = _request("conformance-1")
    matched, _ = scheduler.get_num_new_matched_tokens(loader, 0)
    if matched == 0:
        pytest.skip("the connector offers nothing back to the engine that saved (a sender)")
    scheduler.update_state_after_alloc(loader, (FREE_BLOCK_IDS,), matched)
    scheduler.build_connector_meta(SchedulerOutput())
    scheduler.update_connector_output(KVConnectorOutput(failed_recving={loader.request_id}))
    again, _ = scheduler.get_num_new_matched_tokens(_request("conformance-2"), 0)
    assert again == 0, f"{again} tokens offered again from blocks whose load failed"


def _saved_prompt(make):
    """Both roles, reference caches, and the conformance request's prompt computed in one
    step (blocks BLOCK_IDS) with the connector's metadata."""
    scheduler = make(KVConnectorRole.SCHEDULER)
    worker = make(KVConnectorRole.WORKER)
    shape = TorchRefBackend.get_kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    kv_caches = {layer: torch.randn(shape) for layer in LAYERS}
    worker.register_kv_caches(kv_caches)
    saver = request()
    scheduler.update_state_after_alloc(saver, (BLOCK_IDS,), 0)
    saver.num_computed_tokens = len(PROMPT)
    _run_worker_step(worker, scheduler.build_connector_meta(scheduler_output()), kv_caches)
    return scheduler, worker, kv_caches


def _request(req_id: str) -> Request:
    return Request(req_id, PROMPT, SamplingParams(max_tokens=4), eos_token_id=None,
                   arrival_time=1, block_hasher=_hasher())  # fmt: skip


def _hasher():
    from core.kv_cache.block_hash import make_block_hasher

    return make_block_hasher(BLOCK_SIZE, "sha256")


def _run_worker_step(worker, metadata, kv_caches, finished=frozenset()) -> KVConnectorOutput:
    """One step's worker-role calls, in the engine's order, over the conformance prompt."""
    attn_metadata = _attention_metadata()
    context = ForwardContext(dict.fromkeys(LAYERS, attn_metadata), len(PROMPT))
    worker.bind_connector_metadata(metadata)
    worker.start_load_kv(context)
    for layer in LAYERS:
        worker.wait_for_layer_load(layer)
        worker.save_kv_layer(layer, kv_caches[layer], attn_metadata)
    worker.wait_for_save()
    output = worker.get_finished(set(finished))
    worker.clear_connector_metadata()
    return output


def _attention_metadata():
    """The reference backend's metadata for the request's whole prompt in one step."""
    slots = [BLOCK_IDS[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(len(PROMPT))]
    common = CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, len(PROMPT)], dtype=torch.int32),
        seq_lens=torch.tensor([len(PROMPT)], dtype=torch.int32),
        num_computed_tokens=torch.tensor([0], dtype=torch.int32),
        block_table=torch.tensor([BLOCK_IDS], dtype=torch.int32),
        slot_mapping=torch.tensor(slots),
        num_reqs=1,
        num_actual_tokens=len(PROMPT),
        max_query_len=len(PROMPT),
        max_seq_len=len(PROMPT),
    )
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float32
    )
    builder = TorchRefBackend.get_builder_cls()(spec, list(LAYERS), torch.device("cpu"))
    return builder.build(common)
