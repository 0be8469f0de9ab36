"""`core bench` with speculative decoding: acceptance figures of the measured requests only.

The tiny random-weight checkpoint drafts with n-gram lookup. Prompts of one repeated word
make it draft: its acceptance is high after some words and low after others, so a warm-up
and a timed prompt can have different figures, and counting the warm-up would show.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tiny_engine_checkpoint import engine_kwargs, write_tiny_checkpoint

from core import LLM, SamplingParams
from core.entrypoints.bench.cli import bench
from core.entrypoints.bench.latency import benchmark_latency_batches
from core.entrypoints.bench.speculation import spec_decoding_stats, stats_between
from core.entrypoints.bench.throughput import benchmark_throughput
from core.scheduler.output import SpecDecodingStats

K = 2
NGRAM = {"method": "ngram", "num_speculative_tokens": K}
MAX_MODEL_LEN = 64
OUTPUT_LEN = 24
# Prompts of one repeated word id: the tiny model's acceptance differs between them.
WARMUP_PROMPT, TIMED_PROMPTS = [20] * 8, [[6] * 8, [3] * 8]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def _llm(tiny_dir: Path) -> LLM:
    return LLM(**engine_kwargs(tiny_dir, max_model_len=MAX_MODEL_LEN, speculative_config=NGRAM))


def _alone(tiny_dir: Path, prompts: list[list[int]]) -> SpecDecodingStats:
    """The counts of a fresh engine that ran only `prompts` (all at once)."""
    llm = _llm(tiny_dir)
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_LEN, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    return spec_decoding_stats(llm)


def test_stats_between_subtracts_every_count():
    before = SpecDecodingStats(num_drafts=2, num_draft_tokens=4, num_accepted_tokens=3,
                               num_accepted_tokens_per_pos=[2, 1])  # fmt: skip
    after = SpecDecodingStats(num_drafts=5, num_draft_tokens=10, num_accepted_tokens=4,
                              num_accepted_tokens_per_pos=[3, 1])  # fmt: skip
    assert stats_between(before, after) == SpecDecodingStats(
        num_drafts=3, num_draft_tokens=6, num_accepted_tokens=1, num_accepted_tokens_per_pos=[1, 0]
    )


def test_stats_between_is_none_without_speculation():
    assert stats_between(None, None) is None


def test_latency_figures_count_the_timed_batches_only(tiny_dir):
    llm = _llm(tiny_dir)
    batches = [[WARMUP_PROMPT], *([p] for p in TIMED_PROMPTS)]
    result = benchmark_latency_batches(llm, batches, OUTPUT_LEN, warmup=1)
    # One request at a time draws the same drafts as a fresh engine running them together
    # (n-gram lookup and greedy verification depend on a request's own tokens only).
    timed = _alone(tiny_dir, TIMED_PROMPTS)
    assert result.acceptance_rate == pytest.approx(timed.acceptance_rate)
    assert result.mean_accepted_length == pytest.approx(timed.mean_accepted_length)
    with_warmup = spec_decoding_stats(llm)
    assert with_warmup.acceptance_rate != pytest.approx(timed.acceptance_rate)


def test_throughput_figures_leave_out_the_warmup_request(tiny_dir):
    llm = _llm(tiny_dir)
    prompts = [WARMUP_PROMPT, *TIMED_PROMPTS]  # the warm-up runs the first one reversed
    result = benchmark_throughput(llm, prompts, OUTPUT_LEN)
    timed = _alone(tiny_dir, prompts)
    assert result.acceptance_rate == pytest.approx(timed.acceptance_rate)
    assert result.mean_accepted_length == pytest.approx(timed.mean_accepted_length)
    assert spec_decoding_stats(llm).num_drafts > timed.num_drafts


def test_figures_are_none_with_speculation_off(tiny_dir):
    llm = LLM(**engine_kwargs(tiny_dir, max_model_len=MAX_MODEL_LEN))
    result = benchmark_throughput(llm, TIMED_PROMPTS, 4)
    assert (result.acceptance_rate, result.mean_accepted_length) == (None, None)
    assert "acceptance" not in result.table()


def _invoke(tiny_dir: Path, out: Path, *args: str) -> str:
    engine = ["--model", str(tiny_dir), "--dtype", "float32", "--max-model-len",
              str(MAX_MODEL_LEN), "--kv-cache-memory", "1MiB", "--speculative-config",
              json.dumps(NGRAM), "--output-json", str(out)]  # fmt: skip
    result = CliRunner().invoke(bench, [*args, *engine], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _assert_consistent(data: dict) -> None:
    assert 0.0 <= data["acceptance_rate"] <= 1.0
    assert 1.0 <= data["mean_accepted_length"] <= K + 1


@pytest.mark.parametrize(
    "command",
    [
        ["latency", "--input-len", "16", "--output-len", "16", "--num-iters", "2"],
        ["throughput", "--num-prompts", "3", "--input-len", "16", "--output-len", "16"],
    ],
)
def test_bench_commands_report_acceptance_with_speculation_on(tiny_dir, tmp_path, command):
    out = tmp_path / "result.json"
    output = _invoke(tiny_dir, out, *command)
    assert "draft acceptance rate" in output and "mean accepted length" in output
    data = json.loads(out.read_text())
    _assert_consistent(data)
    assert json.loads(data["settings"]["speculative_config"]) == NGRAM
