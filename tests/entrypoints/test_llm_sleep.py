"""LLM.sleep / wake_up / is_sleeping (vLLM's sleep mode): the answers after waking equal
those before, at level 1 (weights offloaded) and level 2 (reloaded from the checkpoint);
nothing runs while asleep; the prefix cache starts empty after; without
enable_sleep_mode it is refused. The slow tests measure the worker process's RSS, which
must drop by at least the weights' size, with the worker in this process (uni executor)
and in a process of its own (mp executor)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
from tiny_engine_checkpoint import engine_kwargs, write_tiny_checkpoint

from core import LLM, SamplingParams
from core.testing.tiny_checkpoint import VOCAB, random_llama

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[3, 4, 5], "w1 w2 w3 w4"]
LONG_PROMPT = list(range(3, 23))  # 20 tokens: one full 16-token block to cache


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def answers(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("level", [1, 2])
def test_answers_after_waking_equal_those_before_and_nothing_runs_asleep(tiny, level):
    llm = LLM(**engine_kwargs(tiny), enable_sleep_mode=True)
    before = answers(llm)
    llm.sleep(level)
    assert llm.is_sleeping()
    with pytest.raises(RuntimeError, match="sleeping"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.wake_up(["weights"])
    assert llm.is_sleeping()  # the KV cache still sleeps
    llm.wake_up()
    assert not llm.is_sleeping()
    assert answers(llm) == before


def test_the_prefix_cache_starts_empty_after_waking(tiny):
    llm = LLM(**engine_kwargs(tiny), enable_sleep_mode=True)

    def cached() -> int:
        return llm.generate([LONG_PROMPT], GREEDY, use_tqdm=False)[0].num_cached_tokens

    cached()
    assert cached() == 16
    llm.sleep(1)
    llm.wake_up()
    assert cached() == 0


def test_without_enable_sleep_mode_sleep_and_wake_up_are_refused(tiny):
    llm = LLM(**engine_kwargs(tiny))
    with pytest.raises(ValueError, match="^enable_sleep_mode"):
        llm.sleep()
    with pytest.raises(ValueError, match="^enable_sleep_mode"):
        llm.wake_up()
    assert not llm.is_sleeping()
    assert answers(llm)  # it serves on


def test_a_bad_level_is_refused_before_anything_sleeps(tiny):
    llm = LLM(**engine_kwargs(tiny), enable_sleep_mode=True)
    with pytest.raises(ValueError, match="^level"):
        llm.sleep(3)
    assert not llm.is_sleeping()


# -- the worker's memory -------------------------------------------------------------------


@pytest.fixture(scope="module")
def fifty_mb(tmp_path_factory) -> tuple[Path, int]:
    """A random llama of about 50 MB of float32 weights (two 256 x 8192 MLPs), and that
    size in bytes."""
    model = random_llama(
        VOCAB, hidden_size=256, intermediate_size=8192, num_heads=4, num_kv_heads=1,
        num_layers=2, max_positions=64, seed=0,
    )  # fmt: skip
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return write_tiny_checkpoint(tmp_path_factory.mktemp("fifty"), model), size


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["uni", "mp"])
def test_sleeping_frees_at_least_the_weights_of_the_worker_process(fifty_mb, backend):
    checkpoint, weights_bytes = fifty_mb
    kwargs = engine_kwargs(checkpoint, distributed_executor_backend=backend)
    llm = LLM(**kwargs, enable_sleep_mode=True)
    executor = llm.engine.core.executor
    pid = executor.workers[0].pid if backend == "mp" else os.getpid()
    try:
        before = answers(llm)
        for level in (1, 2):
            gc.collect()
            awake = rss_bytes(pid)
            llm.sleep(level)
            assert awake - rss_bytes(pid) >= weights_bytes, f"level {level}"
            llm.wake_up()
            assert answers(llm) == before, f"level {level}"
    finally:
        llm.engine.shutdown()
