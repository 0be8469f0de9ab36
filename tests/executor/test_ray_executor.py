"""Tensor parallelism over Ray actors (`--distributed-executor-backend ray`, gloo).

On a local Ray started by the module (the executor attaches to it, as to a cluster), the
tiny llama of tp_checkpoint generates with 2 ranks the greedy tokens of one worker in the
engine core; an actor killed mid-generation fails the generation with an error instead of
hanging it; shutdown leaves no actor behind. Without Ray installed the flag is refused
before anything starts.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time

import psutil
import pytest
from tp_checkpoint import write_tp_checkpoint

from core import LLM, SamplingParams
from core.executor.multiproc import WorkerDiedError

PROMPTS = [[(7 * i + 3 * j) % 250 + 3 for j in range(5 + 9 * i)] for i in range(6)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tp_checkpoint(tmp_path_factory.mktemp("tp"))


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance of 2 CPUs for the module; stopped at its end."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def engine(model_dir, **overrides) -> LLM:
    # A 16-token budget: the longer prompts are prefilled in chunks beside decodes.
    settings = dict(dtype="float32", max_model_len=128, kv_cache_memory="4MiB",
                    max_num_batched_tokens=16)  # fmt: skip
    return LLM(str(model_dir), **{**settings, **overrides})


def ray_engine(model_dir, **overrides) -> LLM:
    ray = dict(tensor_parallel_size=2, distributed_executor_backend="ray")
    return engine(model_dir, **ray, **overrides)


def generate(llm: LLM) -> list[list[int]]:
    try:
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    finally:
        llm.engine.shutdown()


def all_exit(pids: list[int], timeout_s: float = 10.0) -> bool:
    """Whether every process of `pids` is gone (or a zombie) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if psutil.pid_exists(pid)]
        if all(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in alive):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_two_ray_actors_generate_what_one_worker_does(
    model_dir, local_ray, async_scheduling
) -> None:
    """Also with async scheduling: the next step is started while one runs."""
    from core.executor.ray_executor import RayExecutor

    one_rank = generate(engine(model_dir))
    llm = ray_engine(model_dir, async_scheduling=async_scheduling)
    executor = llm.engine.core.executor
    assert isinstance(executor, RayExecutor) and len(executor.workers) == 2
    pids = list(executor.worker_pids)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert generate(llm) == one_rank
    assert all_exit(pids)
    assert local_ray.is_initialized()  # the executor attached to the test's Ray, left it up
    states = {g["state"] for g in local_ray.util.placement_group_table().values()}
    assert states == {"REMOVED"}


@pytest.mark.slow
def test_a_call_that_raises_on_the_workers_reports_the_traceback(model_dir, local_ray) -> None:
    llm = ray_engine(model_dir)
    executor = llm.engine.core.executor
    try:
        with pytest.raises(RuntimeError, match=r"(?s)^worker rank 0 failed:.*AttributeError"):
            executor.collective_rpc("no_such_method")
        # The workers still answer: each rank holds 1 of the 2 KV heads of each layer.
        [specs] = executor.collective_rpc("get_kv_cache_spec", reply_ranks=(1,))
        assert sorted(specs) == ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
        assert {spec.num_kv_heads for spec in specs.values()} == {1}
    finally:
        llm.engine.shutdown()


@pytest.mark.slow
def test_a_killed_actor_fails_the_generation_within_seconds(model_dir, local_ray) -> None:
    llm = ray_engine(model_dir)
    pids = list(llm.engine.core.executor.worker_pids)
    long = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)

    def kill_soon() -> None:
        time.sleep(0.5)
        os.kill(pids[1], signal.SIGKILL)

    threading.Thread(target=kill_soon, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(WorkerDiedError, match=rf"^worker rank 1 \(Ray actor, pid {pids[1]}\) died"):
        llm.generate(PROMPTS * 4, long, use_tqdm=False)
    assert time.monotonic() - started < 10
    llm.engine.shutdown()
    assert all_exit(pids)


def test_ray_backend_without_ray_is_refused_before_anything_starts(model_dir, monkeypatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a)
    )
    before = psutil.Process().children(recursive=True)
    with pytest.raises(ValueError, match=r"^--distributed-executor-backend ray needs Ray: pip"):
        ray_engine(model_dir)
    assert psutil.Process().children(recursive=True) == before
