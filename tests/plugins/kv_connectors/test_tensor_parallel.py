"""KV connectors under tensor parallelism (two worker processes, gloo): each rank moves
its own KV heads of every block, and the executor reports a transfer done once both
ranks have. `offload` keeps one directory per rank and a restarted engine reads both;
`p2p` pairs rank r of the producer with rank r of the consumer. Greedy answers equal
transformers' throughout."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from kv_requests import free_blocks, run_request
from tiny_engine_checkpoint import greedy_reference
from tp_checkpoint import tp_model, write_tp_checkpoint

from core.engine.llm_engine import LLMEngine
from core.engine_args import EngineArgs

pytestmark = pytest.mark.slow  # engines of two worker processes each, about 40 s

BLOCK = 4
# Six prompts of 13 tokens: three full blocks each, 18 in all, against 11 blocks a rank.
PROMPTS = {f"p{i}": [(7 * i + 5 * j) % 250 + 3 for j in range(13)] for i in range(6)}
MAX_TOKENS = 3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_tp_checkpoint(tmp_path_factory.mktemp("tp"))


@pytest.fixture(scope="module")
def references() -> dict[str, list[int]]:
    model = tp_model()
    return {name: greedy_reference(model, prompt, MAX_TOKENS) for name, prompt in PROMPTS.items()}


def tp_engine(checkpoint: Path, connector: str, role: str, **extra) -> LLMEngine:
    transfer = {"kv_connector": connector, "kv_role": role, "kv_connector_extra_config": extra}
    # 12 KiB a rank: the null block and 11 of 4 tokens (one KV head of two layers, fp32).
    return LLMEngine(EngineArgs(
        model=str(checkpoint), dtype="float32", max_model_len=32, block_size=BLOCK,
        kv_cache_memory="12KiB", tensor_parallel_size=2, distributed_executor_backend="mp",
        kv_transfer_config=json.dumps(transfer),
    ))  # fmt: skip


def serve(engine: LLMEngine, name: str, max_tokens: int = MAX_TOKENS, params: dict | None = None):
    """Prompt `name` to its end: (greedy tokens, prompt tokens not computed, params)."""
    return run_request(engine, name, PROMPTS[name], max_tokens, params)


def test_offload_keeps_each_ranks_heads_and_a_restarted_engine_reads_both(
    checkpoint, references, tmp_path
):
    engine = tp_engine(checkpoint, "offload", "kv_both", num_cpu_blocks=4, disk_path=str(tmp_path))
    try:
        first = {name: serve(engine, name)[:2] for name in PROMPTS}
    finally:
        engine.shutdown()
    assert first == {name: (references[name], 0) for name in PROMPTS}
    (store,) = tmp_path.iterdir()
    files = {rank: {p.name for p in (store / f"rank{rank}").rglob("*.kv")} for rank in (0, 1)}
    assert len(files[0]) >= 12 and files[0] == files[1]
    engine = tp_engine(checkpoint, "offload", "kv_both", num_cpu_blocks=4, disk_path=str(tmp_path))
    try:
        again = {name: serve(engine, name)[:2] for name in ("p0", "p1")}
        stats = engine.core.scheduler.make_stats()
    finally:
        engine.shutdown()
    assert again == {name: (references[name], 12) for name in ("p0", "p1")}
    assert stats.kv_transfer_failed_loads == 0


def test_p2p_pairs_the_ranks_of_producer_and_consumer(checkpoint, references):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # rank 1 serves on the next port
    producer = tp_engine(checkpoint, "p2p", "kv_producer", kv_port=port)
    consumer = tp_engine(checkpoint, "p2p", "kv_consumer")
    try:
        total = free_blocks(producer)
        _, _, params = serve(producer, "p0", max_tokens=1, params={"do_remote_decode": True})
        producer.step()  # hands the finished request's blocks to both ranks' servers
        tokens, cached, _ = serve(consumer, "p0", params=params)
        assert (tokens, cached) == (references["p0"], 12)
        while producer.core.has_unfinished_requests():
            producer.step()  # until both ranks heard their reader's DONE
        assert free_blocks(producer) == total
        stats = consumer.core.scheduler.make_stats()
        assert stats.external_prefix_cache_hits == 12
        # Three full blocks, each rank its KV head: 2 layers x K and V x 16 dims x 4 tokens
        # x 4 bytes = 1 KiB a block and rank.
        assert (stats.kv_transfer_blocks, stats.kv_transfer_bytes) == (3, 3 * 2 * 1024)
    finally:
        producer.shutdown()
        consumer.shutdown()
