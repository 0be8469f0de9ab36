"""core.kernel_choice: the fastest candidate per problem and row bucket, cached per CPU model
and versions, forced by CORE_KERNEL_CHOICE, never a candidate the machine lacks."""

from __future__ import annotations

import pytest
import torch

from core import batch_invariant, kernel_choice
from core.kernel_choice import ROW_BUCKETS, KernelCandidate, KernelChoices, OpTiming, Problem

PROBLEM = Problem("matmul", "float32", (8, 4))


class Fake(KernelCandidate):
    op, provider = "matmul", "core"

    def __init__(
        self, name: str, available: bool = True, takes: bool = True, copy: int = 0
    ) -> None:
        self.name, self._available, self._takes, self._copy = name, available, takes, copy

    def available(self) -> bool:
        return self._available

    def takes(self, problem: Problem) -> bool:
        return self._takes

    def copy_bytes(self, problem: Problem) -> int:
        return self._copy

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x @ weight.T


def _resize(problem: Problem, args: tuple, rows: int) -> tuple:
    return (torch.zeros(rows, args[0].shape[1]), *args[1:])


def make_choices(*candidates: Fake, weights_stream: bool = False) -> KernelChoices:
    choices = KernelChoices()
    choices.declare_op("matmul", OpTiming(_resize, weights_stream=weights_stream))
    for candidate in candidates:
        choices.register(candidate)
    return choices


def record(choices: KernelChoices, problem: Problem = PROBLEM) -> dict:
    args = (torch.zeros(1, 4), torch.zeros(8, 4))
    with choices.recording() as recorded:
        choices.kernel(problem, 1, args)
    return dict(recorded)


class Timer:
    """Seconds per call from `speeds[name](rows)`; remembers what it timed."""

    def __init__(self, **speeds) -> None:
        self.speeds = speeds
        self.calls: list[tuple[str, int]] = []

    def __call__(self, candidate: KernelCandidate, problem: Problem, args: tuple) -> float:
        rows = args[0].shape[0]
        self.calls.append((candidate.name, rows))
        return self.speeds[candidate.name](rows)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CORE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CORE_KERNEL_CHOICE", raising=False)


def test_each_row_bucket_takes_the_fastest_candidate():
    choices = make_choices(Fake("gemv"), Fake("gemm"))
    # The GEMV costs 1 per row, the GEMM 20 plus 0.1 per row: the GEMM wins from 23 rows.
    timer = Timer(gemv=lambda r: 1e-6 * r, gemm=lambda r: 1e-6 * (20 + 0.1 * r))
    choices.measure(record(choices), max_rows=4096, timer=timer)
    for rows in (1, 2, 4, 8, 16, 31, 32, 100, 512, 4000):
        expected = "gemv" if rows < 32 else "gemm"  # the bucket of 16-31 is timed at 16
        assert choices.kernel(PROBLEM, rows, ()).name == expected, rows


def test_before_measuring_the_first_registered_candidate_serves():
    choices = make_choices(Fake("reference"), Fake("fast"))
    assert choices.kernel(PROBLEM, 7, ()).name == "reference"


def test_a_candidate_the_machine_lacks_is_never_timed_nor_chosen():
    choices = make_choices(Fake("slow"), Fake("amx", available=False), Fake("fast"))
    timer = Timer(slow=lambda r: 2.0 * r, fast=lambda r: 1.0 * r, amx=lambda r: 0.0)
    choices.measure(record(choices), max_rows=512, timer=timer)
    assert {name for name, _ in timer.calls} == {"slow", "fast"}
    assert {choices.kernel(PROBLEM, r, ()).name for r in ROW_BUCKETS} == {"fast"}


def test_a_candidate_that_does_not_take_the_problem_is_never_timed():
    choices = make_choices(Fake("a"), Fake("b"), Fake("other-dtype", takes=False))
    timer = Timer(a=lambda r: 1.0, b=lambda r: 2.0)  # other-dtype would raise KeyError
    choices.measure(record(choices), max_rows=512, timer=timer)
    assert choices.kernel(PROBLEM, 3, ()).name == "a"


def test_buckets_past_max_rows_keep_the_last_measured_choice():
    choices = make_choices(Fake("small"), Fake("big"))
    timer = Timer(small=lambda r: 1e-6 * r, big=lambda r: 1e-6 * 4)
    choices.measure(record(choices), max_rows=2, timer=timer)
    assert max(rows for _, rows in timer.calls) == 2
    assert choices.kernel(PROBLEM, 500, ()).name == "small"  # 2 rows: small (2) beat big (4)


def test_a_hopeless_candidate_is_not_timed_at_larger_buckets():
    choices = make_choices(Fake("fast"), Fake("emulated"))
    timer = Timer(fast=lambda r: 1e-6 * r, emulated=lambda r: 1e-3 * r)
    choices.measure(record(choices), max_rows=512, timer=timer)
    # 1 row: 1 ms, slow but not past HOPELESS_MIN_S; 2 rows: 2 ms, hopeless.
    assert [rows for name, rows in timer.calls if name == "emulated"] == [1, 2]


def test_noise_does_not_switch_kernels_between_buckets():
    choices = make_choices(Fake("a"), Fake("b"))
    # b is 2% faster from 8 rows on: within the noise SWITCH_GAIN allows, so a stays.
    timer = Timer(a=lambda r: 1e-6 * r, b=lambda r: 1e-6 * r * (0.98 if r >= 8 else 1.5))
    choices.measure(record(choices), max_rows=512, timer=timer)
    assert {choices.kernel(PROBLEM, r, ()).name for r in ROW_BUCKETS} == {"a"}


def test_a_choice_is_cached_and_read_back_without_timing():
    timer = Timer(a=lambda r: 1e-6 * r, b=lambda r: 2e-6 * r)
    choices = make_choices(Fake("a"), Fake("b"))
    choices.measure(record(choices), max_rows=512, timer=timer)
    later = make_choices(Fake("a"), Fake("b"))
    untimed = Timer()  # any timing would raise KeyError
    later.measure(record(later), max_rows=512, timer=untimed)
    assert untimed.calls == [] and later.kernel(PROBLEM, 64, ()).name == "a"


@pytest.mark.parametrize("change", ["cpu model", "package version", "thread count"])
def test_a_new_cpu_model_or_package_version_is_measured_again(change, monkeypatch):
    choices = make_choices(Fake("a"), Fake("b"))
    choices.measure(record(choices), 512, timer=Timer(a=lambda r: 1.0, b=lambda r: 2.0))
    if change == "cpu model":
        monkeypatch.setattr("core.platforms.cpu.cpuinfo", lambda: {"model name": "Other CPU"})
    elif change == "package version":
        monkeypatch.setattr(kernel_choice, "_version", lambda distribution: "9.9")
    else:
        monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    later = make_choices(Fake("a"), Fake("b"))
    timer = Timer(a=lambda r: 2.0, b=lambda r: 1.0)
    later.measure(record(later), 512, timer=timer)
    assert timer.calls and later.kernel(PROBLEM, 1, ()).name == "b"


# The recorded weight is [8, 4] float32: 128 bytes, read at 10 MB/s in 12.8 us; "copy" keeps
# 10x as many bytes beside it (128 us) and multiplies twice as fast.
BANDWIDTH = 1e7
HOT = {"packed": lambda r: 1e-6 * r, "copy": lambda r: 0.5e-6 * r}


@pytest.fixture
def bandwidth(monkeypatch):
    """read_bandwidth answers BANDWIDTH; the sizes it was asked for."""
    asked: list[int] = []
    monkeypatch.setattr(kernel_choice, "read_bandwidth", lambda n: asked.append(n) or BANDWIDTH)
    return asked


def test_a_copy_that_reads_more_loses_the_rows_where_a_step_streams_its_weights(bandwidth):
    choices = make_choices(Fake("packed"), Fake("copy", copy=1280), weights_stream=True)
    choices.measure(record(choices), max_rows=512, timer=Timer(**HOT), weight_bytes=5 << 20)
    # Up to 128 rows the copy's read (128 us) is the longest; at 256 the packed kernel's
    # 256 us of arithmetic are.
    assert [choices.kernel(PROBLEM, r, ()).name for r in (1, 8, 64, 128, 256, 512)] == [
        "packed", "packed", "packed", "packed", "copy", "copy",
    ]  # fmt: skip
    assert bandwidth == [5 << 20]  # measured once, at the model's size
    assert "reads counted at 0.0 GB/s" in choices.choices[PROBLEM].reason


@pytest.mark.parametrize("streams", [True, False], ids=["no weight bytes", "op not streaming"])
def test_without_streamed_weights_the_calls_alone_choose(bandwidth, streams):
    choices = make_choices(Fake("packed"), Fake("copy", copy=1280), weights_stream=streams)
    weight_bytes = None if streams else 5 << 20
    choices.measure(record(choices), max_rows=512, timer=Timer(**HOT), weight_bytes=weight_bytes)
    assert {choices.kernel(PROBLEM, r, ()).name for r in ROW_BUCKETS} == {"copy"}
    assert bandwidth == []


def test_a_choice_timed_without_reads_is_timed_again_with_them(bandwidth):
    choices = make_choices(Fake("packed"), Fake("copy", copy=1280), weights_stream=True)
    choices.measure(record(choices), max_rows=512, timer=Timer(**HOT))
    later = make_choices(Fake("packed"), Fake("copy", copy=1280), weights_stream=True)
    timer = Timer(**HOT)
    later.measure(record(later), max_rows=512, timer=timer, weight_bytes=5 << 20)
    assert timer.calls and later.kernel(PROBLEM, 1, ()).name == "packed"


def test_the_read_bandwidth_is_bytes_per_second_of_a_sum_over_at_most_the_cap(monkeypatch):
    monkeypatch.setattr(kernel_choice, "MAX_BANDWIDTH_BYTES", 1 << 20)
    seconds = iter([0.0, 1.0, 10.0, 10.5, 20.0, 22.0])  # 1.0 s, 0.5 s, 2.0 s
    monkeypatch.setattr(kernel_choice.time, "perf_counter", lambda: next(seconds))
    assert kernel_choice.read_bandwidth(64 << 20) == (1 << 20) / 0.5


def test_a_forced_choice_wins_over_measurement_and_cache(monkeypatch):
    choices = make_choices(Fake("a"), Fake("b"))
    choices.measure(record(choices), 512, timer=Timer(a=lambda r: 1.0, b=lambda r: 2.0))
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "matmul/float32=b")
    later = make_choices(Fake("a"), Fake("b"))
    later.measure(record(later), 512, timer=Timer())
    assert {later.kernel(PROBLEM, r, ()).name for r in ROW_BUCKETS} == {"b"}
    assert "forced by CORE_KERNEL_CHOICE" in later.choices[PROBLEM].reason
    other_format = Problem("matmul", "bfloat16", (8, 4))
    assert later.kernel(other_format, 1, ()).name == "a"  # the entry names float32 only


def test_a_forced_choice_serves_before_any_measurement(monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "matmul=b")
    assert make_choices(Fake("a"), Fake("b")).kernel(PROBLEM, 1, ()).name == "b"


@pytest.mark.parametrize(
    ("forced", "message"),
    [
        ("matmul=nope", "matmul has no kernel 'nope'; its kernels: a, amx"),
        ("matmul=amx", "amx cannot run on this machine"),
        ("matmul", "'matmul' is not op=kernel"),
    ],
)
def test_forcing_a_kernel_that_cannot_serve_is_refused(forced, message, monkeypatch):
    monkeypatch.setenv("CORE_KERNEL_CHOICE", forced)
    choices = make_choices(Fake("a"), Fake("amx", available=False))
    with pytest.raises(ValueError, match=message):
        choices.kernel(PROBLEM, 1, ())


def test_a_corrupt_cache_is_measured_again(tmp_path):
    (tmp_path / kernel_choice.CACHE_FILE_NAME).write_text("{not json")
    choices = make_choices(Fake("a"), Fake("b"))
    timer = Timer(a=lambda r: 2.0, b=lambda r: 1.0)
    choices.measure(record(choices), 512, timer=timer)
    assert timer.calls and choices.kernel(PROBLEM, 1, ()).name == "b"


def test_core_info_lists_the_candidates_and_the_cached_choices():
    choices = make_choices(Fake("gemv"), Fake("gemm", copy=3 << 19), Fake("amx", available=False))
    timer = Timer(gemv=lambda r: 1e-6 * r, gemm=lambda r: 1e-6 * (20 + 0.1 * r))
    choices.measure(record(choices), max_rows=4096, timer=timer)
    text = "\n".join(kernel_choice.table_lines(choices))
    assert "matmul: gemv, gemm, amx (not on this CPU)" in text
    assert "matmul float32 8x4" in text
    assert "rows 1-31: gemv (us:" in text  # no copy
    assert "rows 32+: gemm, a 1.5 MiB copy (us:" in text
    assert "32: gemm 23, gemv 32" in text  # microseconds, fastest first


@pytest.fixture
def invariant_mode():
    batch_invariant.set_enabled(True)
    yield
    batch_invariant.set_enabled(False)


def _invariant(name: str) -> Fake:
    fake = Fake(name)
    fake.batch_invariant = True
    return fake


@pytest.mark.usefixtures("invariant_mode")
def test_in_batch_invariant_mode_one_declared_kernel_serves_every_row_count_untimed():
    choices = make_choices(Fake("fast"), _invariant("rowwise"), _invariant("other"))
    timer = Timer(fast=lambda rows: 1e-6, rowwise=lambda rows: 1.0, other=lambda rows: 0.5)
    measured = choices.measure(record(choices), max_rows=512, timer=timer)
    assert timer.calls == []
    assert measured[PROBLEM].names == ["rowwise"] * len(ROW_BUCKETS)
    assert {choices.kernel(PROBLEM, rows, ()).name for rows in (1, 7, 64, 4096)} == {"rowwise"}


def test_leaving_batch_invariant_mode_restores_the_measured_choices(invariant_mode):
    choices = make_choices(Fake("fast"), _invariant("rowwise"))
    assert choices.kernel(PROBLEM, 1, ()).name == "rowwise"
    batch_invariant.set_enabled(False)
    assert choices.kernel(PROBLEM, 1, ()).name == "fast"


@pytest.mark.usefixtures("invariant_mode")
def test_in_batch_invariant_mode_forcing_an_undeclared_kernel_is_refused(monkeypatch):
    choices = make_choices(Fake("fast"), _invariant("rowwise"))
    monkeypatch.setenv("CORE_KERNEL_CHOICE", "matmul=fast")
    with pytest.raises(ValueError, match="fast does not serve batch-invariant mode.*: rowwise"):
        choices.kernel(PROBLEM, 1, ())


@pytest.mark.usefixtures("invariant_mode")
def test_in_batch_invariant_mode_an_op_without_a_declared_kernel_fails_naming_it():
    choices = make_choices(Fake("fast"))
    with pytest.raises(ValueError, match="no available kernel of matmul .* in batch-invariant"):
        choices.kernel(PROBLEM, 1, ())
