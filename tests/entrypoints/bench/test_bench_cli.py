"""`core bench`: flags, the JSON it writes, and smoke runs on the default model."""

from __future__ import annotations

import json
import math

import click
import pytest
from click.testing import CliRunner

from core.entrypoints.bench.cli import LENGTH, bench
from core.entrypoints.bench.serve_client import fake_openai_app, running_server

TINY_ENGINE = ["--max-model-len", "256", "--kv-cache-memory", "64MiB"]
SERVE_FIELDS = {
    "num_requests", "num_failed", "duration_s", "prompt_tokens", "output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput",
    "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "client_overhead_ms", "errors", "settings",
}  # fmt: skip


def invoke(*args: str) -> click.testing.Result:
    result = CliRunner().invoke(bench, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_bench_has_the_three_commands():
    output = invoke("--help").output
    assert all(name in output for name in ("throughput", "latency", "serve"))


@pytest.mark.parametrize("text, value", [("128", 128), ("64:256", (64, 256)), ("5:5", (5, 5))])
def test_lengths_are_a_count_or_a_range(text, value):
    assert LENGTH.convert(text, None, None) == value


@pytest.mark.parametrize("text", ["0", "5:3", "a", "1:2:3", "-4"])
def test_bad_lengths_are_refused(text):
    with pytest.raises(click.BadParameter, match="MIN:MAX"):
        LENGTH.convert(text, None, None)


def test_serve_writes_the_table_and_json_against_an_instant_server(tmp_path):
    dataset = tmp_path / "prompts.json"
    dataset.write_text(json.dumps([[1, 2, 3], {"prompt": [4, 5]}, [6]]))
    out = tmp_path / "serve.json"
    with running_server(fake_openai_app()) as url:
        result = invoke(
            "serve", "--base-url", url, "--model", "fake", "--dataset", str(dataset),
            "--output-len", "4", "--max-concurrency", "2", "--measure-client-overhead",
            "--output-json", str(out),
        )  # fmt: skip
    assert "median ITL (ms)" in result.output and "client busy" in result.output
    data = json.loads(out.read_text())
    assert set(data) == SERVE_FIELDS
    assert (data["num_requests"], data["num_failed"]) == (3, 0)
    assert (data["prompt_tokens"], data["output_tokens"]) == (6, 12)
    assert data["client_overhead_ms"] > 0
    assert data["settings"]["max_concurrency"] == 2 and data["settings"]["request_rate"] is None


def test_serve_asks_the_server_for_its_model_and_draws_synthetic_prompts(tmp_path):
    out = tmp_path / "serve.json"
    with running_server(_models_app()) as url:
        invoke("serve", "--base-url", url, "--num-prompts", "3", "--input-len", "10:12",
               "--output-len", "2", "--output-json", str(out))  # fmt: skip
    data = json.loads(out.read_text())
    assert data["num_failed"] == 0 and 30 <= data["prompt_tokens"] <= 36
    assert data["client_overhead_ms"] is None


def _models_app():
    app = fake_openai_app()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    return app


def test_serve_reports_an_unreachable_server_as_a_cli_error():
    result = CliRunner().invoke(bench, ["serve", "--base-url", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "Error" in result.output


def test_throughput_refuses_a_bad_dataset_before_loading_the_model(tmp_path):
    dataset = tmp_path / "prompts.json"
    dataset.write_text('["fine", 3]')
    result = CliRunner().invoke(bench, ["throughput", "--dataset", str(dataset)])
    assert result.exit_code == 1 and "prompt 1 must be" in result.output


@pytest.mark.slow
def test_throughput_smoke_on_the_default_model(tmp_path):
    out = tmp_path / "throughput.json"
    invoke("throughput", "--num-prompts", "4", "--input-len", "16", "--output-len", "8",
           *TINY_ENGINE, "--output-json", str(out))  # fmt: skip
    data = json.loads(out.read_text())
    assert (data["num_requests"], data["prompt_tokens"], data["output_tokens"]) == (4, 64, 32)
    assert data["output_tokens_per_s"] == pytest.approx(32 / data["duration_s"])
    assert data["total_tokens_per_s"] == pytest.approx(96 / data["duration_s"])
    assert data["settings"]["input_len"] == 16


@pytest.mark.slow
def test_latency_smoke_on_the_default_model(tmp_path):
    out = tmp_path / "latency.json"
    invoke("latency", "--input-len", "16", "--output-len", "4", "--batch-size", "2",
           "--num-iters", "2", "--num-warmup", "1", *TINY_ENGINE,
           "--output-json", str(out))  # fmt: skip
    data = json.loads(out.read_text())
    assert (data["batch_size"], data["num_iters"]) == (2, 2)
    ttft, tpot, e2e = data["ttft_ms"], data["tpot_ms"], data["e2e_ms"]
    assert 0 < ttft["median"] < e2e["median"] and tpot["median"] > 0
    # e2e = ttft + 3 further tokens for every request, so the means add up
    assert e2e["mean"] == pytest.approx(ttft["mean"] + 3 * tpot["mean"], rel=1e-6)


@pytest.mark.slow
def test_serve_smoke_against_core_serve(default_server, tmp_path):
    out = tmp_path / "serve.json"
    invoke("serve", "--base-url", default_server.url, "--num-prompts", "4", "--input-len", "16",
           "--output-len", "8", "--output-json", str(out))  # fmt: skip
    data = json.loads(out.read_text())
    assert (data["num_requests"], data["num_failed"], data["errors"]) == (4, 0, {})
    assert (data["prompt_tokens"], data["output_tokens"]) == (64, 32)
    for figure in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert math.isfinite(data[figure]["median"]) and data[figure]["median"] >= 0
    assert data["e2e_ms"]["median"] >= data["ttft_ms"]["median"]
