"""The CPU's default dtype: float32 without a native bf16 dot product, else whichever the
linear-layer probe measures faster, cached per CPU model in core's cache directory."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from core.entrypoints.reports import info_report
from core.platforms import cpu, cpu_dtype
from core.platforms.cpu import CpuPlatform
from core.platforms.cpu_dtype import ProbeTimes

AVX2 = frozenset({"avx2", "fma"})
AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512_bf16"})
AMX = frozenset({"avx512f", "amx_tile", "amx_bf16"})
ALL_CASES = len(cpu_dtype.PROBE_CASES)


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """A fresh per-process decision, an empty cache directory, and a CPU named "Test CPU"."""
    monkeypatch.setenv("CORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu, "cpuinfo", lambda: {"model name": "Test CPU"})
    cpu_dtype.choose_cpu_dtype.cache_clear()
    yield
    cpu_dtype.choose_cpu_dtype.cache_clear()


class FakeProbe:
    """Stands in for measure_linear_times: fixed times, and how often it was asked."""

    def __init__(self, float32_s: float, bfloat16_s: float) -> None:
        self.times = ProbeTimes(float32_s, bfloat16_s, ALL_CASES)
        self.calls = 0

    def __call__(self) -> ProbeTimes:
        self.calls += 1
        return self.times


def fake_cpu(monkeypatch, flags: frozenset[str], probe: FakeProbe | None = None) -> FakeProbe:
    probe = probe or FakeProbe(1.0, 0.5)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
    monkeypatch.setattr(cpu_dtype, "measure_linear_times", probe)
    return probe


def decide_again() -> CpuPlatform:
    """A new process's view: the per-process decision forgotten, the cache file kept."""
    cpu_dtype.choose_cpu_dtype.cache_clear()
    return CpuPlatform()


def cache_file(tmp_path):
    return tmp_path / "cache" / "cpu_dtype.json"


def test_without_amx_or_avx512_bf16_float32_is_chosen_without_probing(monkeypatch, tmp_path):
    probe = fake_cpu(monkeypatch, AVX2)
    platform = CpuPlatform()
    assert platform.default_dtype == torch.float32
    assert platform.default_dtype_reason == "no AMX or AVX512_BF16"
    assert probe.calls == 0
    assert not cache_file(tmp_path).exists()


@pytest.mark.parametrize("flags", [AMX, AVX512_BF16], ids=["amx_bf16", "avx512_bf16"])
@pytest.mark.parametrize(
    ("bfloat16_s", "dtype"),
    [(0.5, torch.bfloat16), (0.9, torch.bfloat16), (0.95, torch.float32), (3.0, torch.float32)],
)
def test_a_candidate_flag_picks_bfloat16_only_when_it_takes_at_most_0_9x_float32s_time(
    monkeypatch, flags, bfloat16_s, dtype
):
    probe = fake_cpu(monkeypatch, flags, FakeProbe(1.0, bfloat16_s))
    assert CpuPlatform().default_dtype == dtype
    assert probe.calls == 1


def test_the_reason_names_the_flag_and_the_measured_speed(monkeypatch, tmp_path):
    fake_cpu(monkeypatch, AVX512_BF16, FakeProbe(1.9, 1.0))
    reason = CpuPlatform().default_dtype_reason
    assert reason == (
        "avx512_bf16; bfloat16 measured 1.90x faster than float32; "
        f"measured now, saved to {cache_file(tmp_path)}"
    )
    fake_cpu(monkeypatch, AMX | AVX512_BF16, FakeProbe(1.0, 1.6))
    assert decide_again().default_dtype_reason.startswith(
        "amx_bf16+avx512_bf16, but bfloat16 measured 1.60x slower than float32; "
        "bfloat16 needs 1.11x; measured now"
    )


def test_the_probe_runs_at_most_once_per_process(monkeypatch):
    probe = fake_cpu(monkeypatch, AMX)
    for _ in range(3):
        platform = CpuPlatform()
        assert (platform.default_dtype, platform.default_dtype) == (torch.bfloat16,) * 2
        assert platform.default_dtype_reason
    assert probe.calls == 1


def test_a_cache_hit_skips_the_probe_and_keeps_the_measured_decision(monkeypatch, tmp_path):
    fake_cpu(monkeypatch, AMX, FakeProbe(1.0, 0.5))
    assert CpuPlatform().default_dtype == torch.bfloat16
    # The next start would measure float32 faster, but the cached decision stands.
    probe = fake_cpu(monkeypatch, AMX, FakeProbe(1.0, 2.0))
    platform = decide_again()
    assert platform.default_dtype == torch.bfloat16
    assert platform.default_dtype_reason == (
        f"amx_bf16; bfloat16 measured 2.00x faster than float32; cached in {cache_file(tmp_path)}"
    )
    assert probe.calls == 0


def test_the_cache_holds_the_choice_and_times_under_cpu_flags_torch_and_threads(
    monkeypatch, tmp_path
):
    fake_cpu(monkeypatch, AVX512_BF16, FakeProbe(0.3, 0.2))
    assert CpuPlatform().default_dtype == torch.bfloat16
    key = f"Test CPU | avx512_bf16 | torch {torch.__version__} | {torch.get_num_threads()} threads"
    assert json.loads(cache_file(tmp_path).read_text()) == {
        key: {
            "dtype": "bfloat16",
            "reason": "avx512_bf16; bfloat16 measured 1.50x faster than float32",
            "float32_s": 0.3,
            "bfloat16_s": 0.2,
            "num_cases": ALL_CASES,
        }
    }


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.setattr(cpu, "cpuinfo", lambda: {"model name": "Other CPU"}),
        lambda m: m.setattr(cpu, "cpu_flags", lambda: AMX | AVX512_BF16),
        lambda m: m.setattr(torch, "get_num_threads", lambda: 97),
    ],
    ids=["cpu model", "flags", "threads"],
)
def test_another_cpu_model_flag_set_or_thread_count_misses_the_cache(monkeypatch, tmp_path, change):
    fake_cpu(monkeypatch, AMX, FakeProbe(1.0, 0.5))
    assert CpuPlatform().default_dtype == torch.bfloat16
    probe = fake_cpu(monkeypatch, AMX, FakeProbe(1.0, 2.0))
    change(monkeypatch)
    assert decide_again().default_dtype == torch.float32
    assert probe.calls == 1
    assert len(json.loads(cache_file(tmp_path).read_text())) == 2  # both CPUs kept


GOOD_RECORD = {"dtype": "bfloat16", "reason": "r", "float32_s": 1.0, "bfloat16_s": 1.0}


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        b"\xff",
        {**GOOD_RECORD, "num_cases": 1, "dtype": "float64"},
        {**GOOD_RECORD, "num_cases": 1, "bfloat16_s": -1.0},
        {**GOOD_RECORD, "num_cases": "1"},
        {"dtype": "bfloat16"},
    ],
    ids=[
        "truncated",
        "not an object",
        "not utf-8",
        "unknown dtype",
        "negative time",
        "text count",
        "missing fields",
    ],
)
def test_a_corrupt_cache_is_measured_again_with_a_warning_and_rewritten(
    monkeypatch, tmp_path, caplog, content
):
    path = cache_file(tmp_path)
    path.parent.mkdir(parents=True)
    if isinstance(content, dict):  # a well-formed file with a malformed entry for this CPU
        key = f"Test CPU | amx_bf16 | torch {torch.__version__} | {torch.get_num_threads()} threads"
        content = json.dumps({key: content})
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    probe = fake_cpu(monkeypatch, AMX, FakeProbe(1.0, 0.5))
    with caplog.at_level(logging.WARNING, logger=cpu_dtype.__name__):
        assert CpuPlatform().default_dtype == torch.bfloat16
    assert probe.calls == 1
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert str(path) in caplog.records[0].getMessage()
    (entry,) = json.loads(path.read_text()).values()
    assert entry["dtype"] == "bfloat16"


def test_an_unwritable_cache_is_not_fatal(monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("CORE_CACHE_DIR", str(blocker))
    fake_cpu(monkeypatch, AMX, FakeProbe(1.0, 0.5))
    with caplog.at_level(logging.WARNING, logger=cpu_dtype.__name__):
        platform = CpuPlatform()
        assert platform.default_dtype == torch.bfloat16
    assert platform.default_dtype_reason.endswith("; measured now, not cached")
    assert "cannot write the measurement cache" in caplog.text
    assert list(tmp_path.iterdir()) == [blocker]  # no temporary file left behind


def test_the_cache_lives_under_xdg_cache_home_without_core_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("CORE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fake_cpu(monkeypatch, AMX)
    assert CpuPlatform().default_dtype == torch.bfloat16
    assert (tmp_path / "xdg" / "core" / "cpu_dtype.json").is_file()


def test_the_probe_times_every_case_in_both_dtypes_on_real_tensors(monkeypatch):
    cases = ((1, (8, 16)), (4, (16, 8)))
    monkeypatch.setattr(cpu_dtype, "PROBE_CASES", cases)
    calls = []

    def recording_linear(x, weight):
        calls.append((x.dtype, weight.dtype, tuple(x.shape), tuple(weight.shape)))
        return torch.nn.functional.linear(x, weight)

    monkeypatch.setattr(cpu_dtype, "probe_linear", recording_linear)
    times = cpu_dtype.measure_linear_times()
    assert times.num_cases == 2
    assert all(math.isfinite(t) and t > 0 for t in (times.float32_s, times.bfloat16_s))
    per_call = 1 + cpu_dtype.NUM_REPEATS  # one warm-up, then the timed repeats
    expected = [
        (dtype, dtype, (rows, in_features), (out_features, in_features))
        for rows, (in_features, out_features) in cases
        for dtype in (torch.float32, torch.bfloat16)
        for _ in range(per_call)
    ]
    assert calls == expected


def test_the_probe_runs_on_the_kernels_a_model_gets(monkeypatch):
    # Decode-batch rows, with whatever kernels the installed plugins register (the CPU
    # kernels' oneDNN path among them): the probe's tensors must be ones they take.
    monkeypatch.setattr(cpu_dtype, "PROBE_CASES", ((1, (64, 32)), (32, (64, 96))))
    times = cpu_dtype.measure_linear_times(budget_s=math.inf)
    assert times.num_cases == 2
    assert all(math.isfinite(t) and t > 0 for t in (times.float32_s, times.bfloat16_s))


def test_the_probe_leaves_the_global_random_state_alone(monkeypatch):
    monkeypatch.setattr(cpu_dtype, "PROBE_CASES", ((2, (8, 16)),))
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    cpu_dtype.measure_linear_times()
    assert torch.equal(torch.rand(4), expected)


def fake_best_time(float32_s: float, bfloat16_s: float):
    return lambda x, weight: bfloat16_s if x.dtype == torch.bfloat16 else float32_s


def test_the_probe_stops_once_bfloat16_is_hopeless(monkeypatch):
    monkeypatch.setattr(cpu_dtype, "PROBE_CASES", ((1, (8, 16)),) * 4)
    # Hopeless (over 5x) only counts once float32 has run for a millisecond: the third case.
    monkeypatch.setattr(cpu_dtype, "_best_time", fake_best_time(0.4e-3, 2.4e-3))
    times = cpu_dtype.measure_linear_times(budget_s=math.inf)
    assert times.num_cases == 3
    assert (times.float32_s, times.bfloat16_s) == pytest.approx((1.2e-3, 7.2e-3))
    choice = cpu_dtype.decide(times, "avx512_bf16")
    assert choice.dtype == torch.float32
    assert "6.00x slower than float32 (probe stopped after 3 of 4 matmuls)" in choice.reason


def test_the_probe_stops_after_the_case_that_passes_its_time_budget(monkeypatch):
    monkeypatch.setattr(cpu_dtype, "PROBE_CASES", ((1, (8, 16)),) * 4)
    monkeypatch.setattr(cpu_dtype, "_best_time", fake_best_time(1.0, 0.5))
    assert cpu_dtype.measure_linear_times(budget_s=0.0).num_cases == 1
    assert cpu_dtype.measure_linear_times(budget_s=math.inf).num_cases == 4


def test_core_info_says_which_dtype_the_cpu_picks_and_why(monkeypatch):
    monkeypatch.setenv("CORE_PLATFORM", "cpu")
    fake_cpu(monkeypatch, AVX2)
    assert "\ndefault dtype: float32 (no AMX or AVX512_BF16)\n" in info_report()
