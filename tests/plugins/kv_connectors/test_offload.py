"""`offload` in an engine: a working set larger than the KV pool is re-served from host
memory, a restarted engine reads the disk tier, and a bad block file is recomputed; greedy
answers equal transformers' throughout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from core_kv_connectors.block_files import BlockFileError, read_block, write_block
from tiny_engine_checkpoint import (
    VOCAB,
    engine_args,
    greedy_reference,
    reference_model,
)

from core.engine.llm_engine import LLMEngine
from core.sampling_params import SamplingParams

BLOCK = 4
WORDS = [w for w in VOCAB if w.startswith("w")]
# Six prompts of 13 tokens (three full blocks each, 18 in all) against a pool of 11 blocks.
PROMPTS = {f"p{i}": [VOCAB[WORDS[(5 * i + j * (i + 2)) % len(WORDS)]] for j in range(13)]
           for i in range(6)}  # fmt: skip
MAX_TOKENS = 3


@pytest.fixture(scope="module")
def references() -> dict[str, list[int]]:
    model = reference_model()
    return {name: greedy_reference(model, prompt, MAX_TOKENS) for name, prompt in PROMPTS.items()}


def offload_engine(checkpoint: Path, **extra) -> LLMEngine:
    transfer = {"kv_connector": "offload", "kv_role": "kv_both", "kv_connector_extra_config": extra}
    # 12 KiB: the null block and 11 of 4 tokens for this model.
    args = engine_args(checkpoint, block_size=BLOCK, kv_cache_memory="12KiB",
                       kv_transfer_config=json.dumps(transfer))  # fmt: skip
    return LLMEngine(args)


def serve(engine: LLMEngine, names: list[str]) -> dict[str, tuple[list[int], int]]:
    """Each prompt alone, in order: (greedy tokens, prompt tokens served without compute)."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    found = {}
    for name in names:
        engine.add_request(name, PROMPTS[name], params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    found[name] = (output.outputs[0].token_ids, output.num_cached_tokens)
    return found


def test_a_working_set_three_times_the_pool_is_served_again_from_host_memory(
    tiny_checkpoint, references
):
    engine = offload_engine(tiny_checkpoint, num_cpu_blocks=64)
    try:
        assert engine.core.num_gpu_blocks - 1 == 11
        first = serve(engine, list(PROMPTS))
        again = serve(engine, list(PROMPTS))
        stats = engine.core.scheduler.make_stats()
    finally:
        engine.shutdown()
    for name in PROMPTS:
        assert first[name][0] == references[name] and again[name][0] == references[name]
    assert all(cached == 0 for _, cached in first.values())
    # p0..p2 left the pool long ago: their three blocks (12 tokens) came from host memory.
    assert [again[name][1] for name in ("p0", "p1", "p2")] == [12, 12, 12]
    # What the metrics export: every prompt asked the connector; it supplied those blocks.
    assert stats.external_prefix_cache_queries == 12 * 13
    assert stats.external_prefix_cache_hits == sum(again[name][1] for name in PROMPTS)
    # 18 blocks saved in the first round, the reads of the second and their saves after.
    assert stats.kv_transfer_blocks >= 18 + 9 and stats.kv_transfer_failed_loads == 0


def test_a_restarted_engine_reads_the_blocks_its_predecessor_spilled_to_disk(
    tiny_checkpoint, references, tmp_path
):
    # Four host slots: most of the 18 blocks are spilled to disk as they are evicted.
    engine = offload_engine(tiny_checkpoint, num_cpu_blocks=4, disk_path=str(tmp_path))
    try:
        serve(engine, list(PROMPTS))
    finally:
        engine.shutdown()
    assert len(list(tmp_path.rglob("*.kv"))) >= 12
    engine = offload_engine(tiny_checkpoint, num_cpu_blocks=4, disk_path=str(tmp_path))
    try:
        restarted = serve(engine, ["p0", "p1"])
    finally:
        engine.shutdown()
    assert restarted == {name: (references[name], 12) for name in ("p0", "p1")}


@pytest.mark.parametrize("damage", ["truncate", "flip a byte"])
def test_a_damaged_block_file_is_detected_and_its_prompt_recomputed(
    tiny_checkpoint, references, tmp_path, damage
):
    engine = offload_engine(tiny_checkpoint, num_cpu_blocks=1, disk_path=str(tmp_path))
    try:
        serve(engine, ["p0", "p1"])  # one host slot: p0's blocks all reach the disk
    finally:
        engine.shutdown()
    for path in tmp_path.rglob("*.kv"):
        data = path.read_bytes()
        path.write_bytes(data[:-7] if damage == "truncate" else data[:-1] + bytes([data[-1] ^ 1]))
    engine = offload_engine(tiny_checkpoint, num_cpu_blocks=1, disk_path=str(tmp_path))
    try:
        again = serve(engine, ["p0"])
        assert engine.core.scheduler.kv.coordinator.block_pools[0].get_num_free_blocks() == 11
        assert engine.core.scheduler.make_stats().kv_transfer_failed_loads == 1
    finally:
        engine.shutdown()
    assert again == {"p0": (references["p0"], 0)}


def test_engines_of_other_block_sizes_keep_apart_directories(tiny_checkpoint, tmp_path):
    engine = offload_engine(tiny_checkpoint, num_cpu_blocks=1, disk_path=str(tmp_path))
    try:
        serve(engine, ["p0", "p1"])
    finally:
        engine.shutdown()
    transfer = {
        "kv_connector": "offload",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"num_cpu_blocks": 1, "disk_path": str(tmp_path)},
    }
    other = LLMEngine(engine_args(tiny_checkpoint, block_size=8, kv_cache_memory="12KiB",
                                  kv_transfer_config=json.dumps(transfer)))  # fmt: skip
    try:
        found = serve(other, ["p0", "p1"])  # one slot: p0's block is spilled on p1's
        assert found["p0"][1] == 0
    finally:
        other.shutdown()
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2


def test_block_files_round_trip_and_refuse_damage_or_another_layout(tmp_path):
    block = torch.randn(3, 2, 4, 5)[:, 1]  # not contiguous
    path = tmp_path / "ab" / "abcd.kv"
    write_block(path, block)
    assert torch.equal(read_block(path, (3, 4, 5), torch.float32), block)
    with pytest.raises(BlockFileError, match="shape"):
        read_block(path, (3, 5, 4), torch.float32)
    with pytest.raises(BlockFileError, match="dtype"):
        read_block(path, (3, 4, 5), torch.bfloat16)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(BlockFileError, match="checksum"):
        read_block(path, (3, 4, 5), torch.float32)
    with pytest.raises(BlockFileError):
        read_block(tmp_path / "missing.kv", (3, 4, 5), torch.float32)
    assert not list(tmp_path.rglob(".tmp-*"))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"num_cpu_blocks": 0}, "num_cpu_blocks"),
        ({"num_cpu_blocks": "many"}, "num_cpu_blocks must be an integer"),
        ({"cpu_bytes": 1}, "unknown keys"),
    ],
)
def test_bad_options_are_refused_naming_the_key(tiny_checkpoint, extra, message):
    with pytest.raises(ValueError, match=message):
        offload_engine(tiny_checkpoint, **extra)


def test_multi_takes_each_request_from_the_first_connector_that_has_its_blocks(
    tiny_checkpoint, references
):
    # The first offload keeps one block in host memory, the second all of them: p0's
    # blocks come back from the second.
    connectors = [
        {"kv_connector": "offload", "kv_connector_extra_config": {"num_cpu_blocks": 1}},
        {"kv_connector": "offload", "kv_connector_extra_config": {"num_cpu_blocks": 64}},
    ]
    transfer = {"kv_connector": "multi", "kv_role": "kv_both",
                "kv_connector_extra_config": {"connectors": connectors}}  # fmt: skip
    engine = LLMEngine(engine_args(tiny_checkpoint, block_size=BLOCK, kv_cache_memory="12KiB",
                                   kv_transfer_config=json.dumps(transfer)))  # fmt: skip
    try:
        serve(engine, list(PROMPTS))
        again = serve(engine, ["p0", "p1"])
        stats = engine.core.scheduler.make_stats()
    finally:
        engine.shutdown()
    assert again == {name: (references[name], 12) for name in ("p0", "p1")}
    # Both connectors' moves reach the metrics: each saved the 18 blocks of the first
    # round, and p0's and p1's three blocks each were read back.
    assert stats.kv_transfer_blocks >= 2 * 18 + 6


def test_multi_refuses_a_list_that_names_no_connector(tiny_checkpoint):
    transfer = {"kv_connector": "multi", "kv_connector_extra_config": {"connectors": [{}]}}
    with pytest.raises(ValueError, match="names no connector"):
        LLMEngine(engine_args(tiny_checkpoint, kv_transfer_config=json.dumps(transfer)))
