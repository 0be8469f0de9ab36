"""`core serve --tensor-parallel-size 2`: the openai client gets one worker's greedy
tokens; a killed worker fails the requests in flight with a 5xx and the server exits 1
(for its supervisor to restart it) within 10 s; SIGTERM stops every rank; no process
outlives the server."""

from __future__ import annotations

import subprocess
import threading
import time

import httpx
import openai
import psutil
import pytest
from server_process import ServerProcess, completions_at_once, engine_series
from test_multiproc_executor import PROMPTS, engine
from tp_checkpoint import write_tp_checkpoint

from core import SamplingParams

pytestmark = pytest.mark.slow  # two servers of two worker processes, about 30 s


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tp_checkpoint(tmp_path_factory.mktemp("tp-server"))


def start(model_dir) -> tuple[ServerProcess, list[psutil.Process]]:
    server = ServerProcess(
        str(model_dir), "--dtype", "float32", "--max-model-len", "128",
        "--kv-cache-memory", "4MiB", "--tensor-parallel-size", "2",
    ).wait_ready()  # fmt: skip
    tree = psutil.Process(server.proc.pid).children(recursive=True)
    return server, tree


def workers(tree: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in tree if "core.executor.worker_proc" in " ".join(p.cmdline())]


def test_two_ranks_serve_one_workers_tokens_and_sigterm_stops_them_all(model_dir) -> None:
    llm = engine(model_dir, max_num_batched_tokens=None)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = [o.outputs[0].text for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    llm.engine.shutdown()
    server, tree = start(model_dir)
    try:
        assert len(workers(tree)) == 2
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        for prompt, expected in zip(PROMPTS, want, strict=True):
            out = client.completions.create(
                model=model, prompt=prompt, max_tokens=24, temperature=0,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            assert out.choices[0].text == expected
    finally:
        server.stop()  # SIGTERM
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive


def test_a_killed_worker_fails_requests_in_flight_and_the_server_exits_1(model_dir) -> None:
    server, tree = start(model_dir)
    errors: list[int] = []

    def long_request() -> None:
        try:
            response = httpx.post(
                f"{server.url}/v1/completions",
                json={"prompt": PROMPTS[3], "max_tokens": 90, "ignore_eos": True},
                timeout=30,
            )
            errors.append(response.status_code)
        except httpx.HTTPError as exc:  # a dropped connection also counts as a failure
            errors.append(type(exc).__name__)

    try:
        request = threading.Thread(target=long_request)
        request.start()
        time.sleep(0.3)
        workers(tree)[1].kill()
        killed = time.monotonic()
        request.join(30)
        assert errors and (not isinstance(errors[0], int) or errors[0] >= 500), errors
        assert server.wait_exit(10) == 1
        assert time.monotonic() - killed < 10
    finally:
        server.stop()
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive


def test_two_data_parallel_engines_share_the_requests_and_answer_like_one(model_dir) -> None:
    llm = engine(model_dir, max_num_batched_tokens=None)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = [o.outputs[0].text for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    llm.engine.shutdown()
    server = ServerProcess(
        str(model_dir), "--dtype", "float32", "--max-model-len", "128",
        "--kv-cache-memory", "4MiB", "--data-parallel-size", "2",
    ).wait_ready()  # fmt: skip
    tree = psutil.Process(server.proc.pid).children(recursive=True)
    try:
        engines = [p for p in tree if "core.engine.core_proc" in " ".join(p.cmdline())]
        assert len(engines) == 2
        before = [sum(e.cpu_times()[:2]) for e in engines]
        assert completions_at_once(server.url, PROMPTS, 24) == want
        worked = [sum(e.cpu_times()[:2]) - b for e, b in zip(engines, before, strict=True)]
        assert min(worked) > 0.05 * max(worked), worked  # the requests were shared (an idle
        # engine core waits on its socket and uses next to no CPU)
        by_engine = engine_series(
            server.url, "vllm:generation_tokens_total"
        )  # each engine its own series
        assert sorted(by_engine) == ["0", "1"] and min(by_engine.values()) > 0
        assert sum(by_engine.values()) == 24 * len(PROMPTS)
    finally:
        server.stop()
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive


def test_a_headless_node_runs_the_second_engine_core_and_its_loss_is_noticed(model_dir) -> None:
    """Two "nodes" on this host: the primary (API server, engine core 0) and a headless one
    (engine core 1, connecting over TCP). Requests are shared and answered like one
    engine's; when the headless node dies, the primary notices within the heartbeat
    timeout instead of hanging, and exits 1."""
    from server_process import SERVE, SMALL, free_port_pair

    llm = engine(model_dir, max_num_batched_tokens=None)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = [o.outputs[0].text for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    llm.engine.shutdown()
    rpc_port = free_port_pair()
    same = ["--dtype", "float32", "--max-model-len", "128", "--kv-cache-memory", "4MiB",
            "--data-parallel-size", "2", "--data-parallel-size-local", "1",
            "--data-parallel-rpc-port", str(rpc_port)]  # fmt: skip
    primary = ServerProcess(str(model_dir), *same)
    remote: list[psutil.Process] = []
    node = subprocess.Popen(
        [*SERVE, str(model_dir), *SMALL, *same, "--headless", "--data-parallel-start-rank", "1"]
    )
    try:
        primary.wait_ready()
        remote = [
            p for p in psutil.Process(node.pid).children() if "core_proc" in " ".join(p.cmdline())
        ]
        before = sum(remote[0].cpu_times()[:2])
        assert completions_at_once(primary.url, PROMPTS, 24) == want
        assert sum(remote[0].cpu_times()[:2]) - before > 0.05  # the remote engine worked
        node.kill()
        lost = time.monotonic()
        assert primary.wait_exit(30) == 1
        assert time.monotonic() - lost < 20, "the primary outlived the lost node by 20 s"
    finally:
        node.kill()
        node.wait()
        primary.stop()
    _, alive = psutil.wait_procs(remote, timeout=10)
    assert not alive
