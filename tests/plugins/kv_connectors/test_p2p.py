"""`p2p`: a prefill engine's KV read over TCP by a decode engine, and what happens when
either side dies or they do not match. Greedy answers equal transformers' throughout."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from core_kv_connectors import p2p_wire as wire
from kv_requests import free_blocks, run_request
from tiny_engine_checkpoint import (
    VOCAB,
    engine_args,
    greedy_reference,
    reference_model,
)

from core.engine.core import TRANSFER_POLL_S
from core.engine.llm_engine import LLMEngine

BLOCK = 4
WORDS = [w for w in VOCAB if w.startswith("w")]
PROMPT = [VOCAB[WORDS[(3 * j + 1) % len(WORDS)]] for j in range(14)]  # 3 full blocks + 2
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def reference() -> list[int]:
    return greedy_reference(reference_model(), PROMPT, MAX_TOKENS)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def p2p_engine(checkpoint: Path, role: str, block_size: int = BLOCK, **extra) -> LLMEngine:
    transfer = {"kv_connector": "p2p", "kv_role": role, "kv_connector_extra_config": extra}
    args = engine_args(checkpoint, block_size=block_size, kv_cache_memory="64KiB",
                       kv_transfer_config=json.dumps(transfer))  # fmt: skip
    return LLMEngine(args)


def block_bytes(engine: LLMEngine) -> int:
    """One block's bytes over every layer of `engine`'s KV cache."""
    layers = engine.core.executor.worker.loaded.attention_layers
    return sum(layer.kv_cache[0].numel() * layer.kv_cache.element_size() for layer in layers)


def run(engine: LLMEngine, req_id: str, max_tokens: int, kv_transfer_params: dict):
    """PROMPT to its end: (token ids, cached prompt tokens, kv_transfer_params)."""
    return run_request(engine, req_id, PROMPT, max_tokens, kv_transfer_params)


def prefill(producer: LLMEngine) -> dict:
    """The producer's prefill of PROMPT; its blocks registered for reading."""
    _, _, params = run(producer, "prefill", 1, {"do_remote_decode": True})
    producer.step()  # the step that hands the finished request's blocks to the server
    return params


def step_until_released(producer: LLMEngine, timeout_s: float = 10.0) -> None:
    """Step as the engine core's loop does while a transfer holds blocks (its frontend has
    nothing left to wait for)."""
    deadline = time.monotonic() + timeout_s
    while producer.core.has_unfinished_requests() and time.monotonic() < deadline:
        producer.step()


def test_a_decode_engine_computes_only_the_last_prompt_token_and_answers_as_one_engine(
    tiny_checkpoint, reference
):
    port = free_port()
    producer = p2p_engine(tiny_checkpoint, "kv_producer", kv_port=port)
    consumer = p2p_engine(tiny_checkpoint, "kv_consumer")
    try:
        total = free_blocks(producer)
        params = prefill(producer)
        assert params["do_remote_prefill"] and params["remote_port"] == port
        assert free_blocks(producer) < total  # held for the reader
        tokens, cached, _ = run(consumer, "decode", MAX_TOKENS, params)
        assert tokens == reference and cached == 13  # 14 prompt tokens: 13 read, 1 computed
        step_until_released(producer)  # the consumer's DONE frees the producer's blocks
        assert free_blocks(producer) == total and not producer.core.has_unfinished_requests()
        stats = consumer.core.scheduler.make_stats()
        assert stats.external_prefix_cache_hits == 13
        # Four blocks (the last partly filled) of every layer, moved once, nothing failed.
        assert (stats.kv_transfer_blocks, stats.kv_transfer_bytes) == (4, 4 * block_bytes(consumer))
        assert stats.kv_transfer_failed_loads == 0
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_a_consumer_killed_mid_read_leaves_the_blocks_to_the_lease(tiny_checkpoint):
    port = free_port()
    producer = p2p_engine(tiny_checkpoint, "kv_producer", kv_port=port, lease_s=1.0)
    try:
        total = free_blocks(producer)
        params = prefill(producer)
        facts = producer.core.executor.worker.runner.kv_connector.facts
        reader = subprocess.Popen([sys.executable, "-c", _DYING_READER, str(port),
                                   json.dumps(facts), json.dumps(params)])  # fmt: skip
        assert reader.wait(timeout=30) == -9  # SIGKILL, with no DONE sent
        assert free_blocks(producer) < total
        step_until_released(producer)
        assert free_blocks(producer) == total
    finally:
        producer.shutdown()


# Handshakes, asks for the blocks, takes a few bytes and is killed (SIGKILL).
_DYING_READER = """
import json, os, signal, socket, sys
from core_kv_connectors import p2p_wire as wire
port, facts, params = int(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
sock = socket.create_connection(("127.0.0.1", port))
wire.send_message(sock, {"type": "HELLO", "facts": facts})
wire.expect(wire.recv_message(sock), "OK")
wire.send_message(sock, {"type": "READ", "req_id": params["remote_request_id"],
                         "block_ids": params["remote_block_ids"][:4]})
sock.recv(8)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_producer_killed_mid_transfer_leaves_the_consumer_to_recompute(
    tiny_checkpoint, reference, caplog
):
    port = free_port()
    consumer = p2p_engine(tiny_checkpoint, "kv_consumer")
    num_bytes = 4 * block_bytes(consumer)
    producer = subprocess.Popen([sys.executable, "-c", _DYING_PRODUCER, str(port),
                                 str(num_bytes)], stdout=subprocess.PIPE)  # fmt: skip
    assert producer.stdout.readline().strip() == b"listening"
    params = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": port,
              "remote_block_ids": [1, 2, 3, 4], "remote_request_id": "gone"}  # fmt: skip
    try:
        with caplog.at_level(logging.WARNING, logger="core_kv_connectors.p2p"):
            tokens, cached, _ = run(consumer, "decode", MAX_TOKENS, params)
        assert free_blocks(consumer) == consumer.core.num_gpu_blocks - 1
        assert consumer.core.scheduler.make_stats().kv_transfer_failed_loads == 1
    finally:
        consumer.shutdown()
    assert producer.wait(timeout=30) == -9
    assert tokens == reference and cached == 0
    assert f"the peer closed after 100 of {num_bytes} bytes" in caplog.text


# Accepts the handshake, announces the four blocks asked for, sends 100 bytes, is killed.
_DYING_PRODUCER = """
import os, signal, socket, sys
from core_kv_connectors import p2p_wire as wire
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("listening", flush=True)
sock, _ = server.accept()
wire.expect(wire.recv_message(sock), "HELLO")
wire.send_message(sock, {"type": "OK", "engine_id": "dying"})
wire.expect(wire.recv_message(sock), "READ")
wire.send_message(sock, {"type": "DATA", "num_bytes": int(sys.argv[2])})
sock.sendall(bytes(100))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_engines_of_different_block_sizes_are_refused_at_the_handshake_naming_it(
    tiny_checkpoint, reference, caplog
):
    port = free_port()
    producer = p2p_engine(tiny_checkpoint, "kv_producer", kv_port=port, lease_s=1.0)
    consumer = p2p_engine(tiny_checkpoint, "kv_consumer", block_size=2 * BLOCK)
    try:
        params = prefill(producer)
        with caplog.at_level(logging.WARNING, logger="core_kv_connectors.p2p"):
            tokens, cached, _ = run(consumer, "decode", MAX_TOKENS, params)
        assert tokens == reference and cached == 0  # recomputed, not garbage
        assert "refused the handshake: block_size: 8 at the consumer, 4 here" in caplog.text
        step_until_released(producer)  # the lease frees what nobody read
        assert not producer.core.has_unfinished_requests()
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_the_handshake_names_the_first_fact_that_differs():
    here = {"core": "0.1.0", "model": "m", "dtype": "torch.float32", "block_size": 16,
            "num_layers": 2, "page_shape": [2, 16, 1, 8]}  # fmt: skip
    assert wire.incompatibility(here, dict(here)) is None
    there = {**here, "dtype": "torch.bfloat16", "num_layers": 3}
    assert wire.incompatibility(here, there) == (
        "dtype: 'torch.bfloat16' at the consumer, 'torch.float32' here"
    )


def test_a_request_without_do_remote_decode_frees_its_blocks_at_once(tiny_checkpoint):
    producer = p2p_engine(tiny_checkpoint, "kv_producer", kv_port=free_port())
    try:
        total = free_blocks(producer)
        _, _, params = run(producer, "plain", 2, {})
        assert params is None and free_blocks(producer) == total
        assert not producer.core.has_unfinished_requests()
    finally:
        producer.shutdown()


@pytest.mark.parametrize(
    ("extra", "message"),
    [({"kv_port": "80"}, "kv_port"), ({"lease": 3}, "unknown key 'lease'")],
)
def test_bad_options_are_refused_naming_the_key(tiny_checkpoint, extra, message):
    with pytest.raises(ValueError, match=message):
        p2p_engine(tiny_checkpoint, "kv_producer", **extra)


def test_an_engine_that_only_waits_for_a_transfer_polls_it_instead_of_spinning(tiny_checkpoint):
    producer = p2p_engine(tiny_checkpoint, "kv_producer", kv_port=free_port())
    try:
        prefill(producer)
        assert producer.core.has_unfinished_requests()  # the blocks wait for their reader
        start = time.perf_counter()
        for _ in range(20):
            assert producer.core.step().outputs == []
        assert time.perf_counter() - start >= 20 * TRANSFER_POLL_S
    finally:
        producer.shutdown()


def test_a_stopped_producer_frees_its_port_for_the_next_one(tiny_checkpoint):
    port = free_port()
    for _ in range(2):  # the second would find the port taken
        p2p_engine(tiny_checkpoint, "kv_producer", kv_port=port).shutdown()
