"""Tensor parallelism over worker processes (`--distributed-executor-backend mp`, gloo).

The tiny llama of tp_checkpoint (4 heads, 2 KV heads, vocabulary 256) generates the same
greedy tokens with 2 ranks, and with 4 (KV heads replicated), as with one worker in the
engine core, through chunked prefills and mixed batches. A worker killed mid-generation
fails the generation with an error instead of hanging it, and no process is left behind.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
from server_process import shared_server_tree
from tp_checkpoint import write_tp_checkpoint

from core import LLM, SamplingParams
from core.executor.multiproc import MultiprocExecutor, WorkerDiedError

pytestmark = pytest.mark.slow  # engines of 2 and 4 worker processes, about 40 s

PROMPTS = [[(7 * i + 3 * j) % 250 + 3 for j in range(5 + 9 * i)] for i in range(6)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tp_checkpoint(tmp_path_factory.mktemp("tp"))


def engine(model_dir, **overrides) -> LLM:
    # A 16-token budget: the longer prompts are prefilled in chunks beside decodes.
    settings = dict(dtype="float32", max_model_len=128, kv_cache_memory="4MiB",
                    max_num_batched_tokens=16)  # fmt: skip
    return LLM(str(model_dir), **{**settings, **overrides})


def generate(llm: LLM) -> list[list[int]]:
    try:
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    finally:
        llm.engine.shutdown()


def children() -> list[str]:
    """This process's descendants, but the resource tracker multiprocessing starts for
    the first shared-memory segment (it lives as long as this process) and the servers
    the session shares with other tests (they outlive this module)."""
    shared = shared_server_tree()
    found = psutil.Process(os.getpid()).children(recursive=True)
    commands = [" ".join(p.cmdline()) for p in found if p.pid not in shared]
    return [cmd for cmd in commands if "resource_tracker" not in cmd]


@pytest.fixture(scope="module")
def one_rank(model_dir) -> list[list[int]]:
    return generate(engine(model_dir))


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_ranks_generate_what_one_worker_does(model_dir, one_rank, tp) -> None:
    llm = engine(model_dir, tensor_parallel_size=tp)
    executor = llm.engine.core.executor
    assert isinstance(executor, MultiprocExecutor) and len(executor.workers) == tp
    assert generate(llm) == one_rank
    assert not children()


def test_a_killed_worker_fails_the_generation_and_leaves_no_process(model_dir) -> None:
    llm = engine(model_dir, tensor_parallel_size=2)
    victim = llm.engine.core.executor.workers[1]
    long = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)

    def kill_soon() -> None:
        time.sleep(0.5)
        os.kill(victim.pid, signal.SIGKILL)

    threading.Thread(target=kill_soon, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(WorkerDiedError, match="worker rank 1"):
        llm.generate(PROMPTS * 4, long, use_tqdm=False)
    assert time.monotonic() - started < 10
    llm.engine.shutdown()
    assert not children()


def test_speculative_decoding_over_tensor_parallel_ranks_keeps_the_outputs(model_dir, one_rank):
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
             "prompt_lookup_max": 3}  # fmt: skip
    llm = engine(model_dir, tensor_parallel_size=2, speculative_config=ngram)
    core = llm.engine.core
    assert generate(llm) == one_rank
    assert core.scheduler.make_stats().spec_decoding.num_draft_tokens > 0


def test_awq_weights_split_across_ranks_generate_what_one_worker_does(model_dir, tmp_path):
    """AWQ declares how qweight / qzeros / scales lie along W (packed outputs, grouped
    inputs): two ranks load their slices and compute what one worker does."""
    from core_quant_awq.awq import AWQConfig

    from core.model_loader import resolve_model

    awq_dir = tmp_path / "awq"
    AWQConfig.quantize_checkpoint(resolve_model(str(model_dir)), awq_dir, {"group_size": 32})
    whole = generate(engine(awq_dir))
    assert generate(engine(awq_dir, tensor_parallel_size=2)) == whole
