"""Which kernel serves an op, chosen by timing the candidates on this machine.

A kernel package registers several implementations (`KernelCandidate`) of one op, say a
dense linear layer through a GEMV, through torch, or through oneDNN on a prepacked weight.
Which is fastest depends on the CPU (AMX tiles, AVX512_BF16, AVX2 only), on the weight's
format and shape, and on how many rows the activation has: a rule keyed on CPU flags or on
figures from one machine picks wrong elsewhere. So the worker, once its model is loaded,
records the problems the model's ops pose (`recording`: an op with candidates names its
`Problem` and its real arguments at each call) and `measure`s each candidate on them at
every row bucket, keeping the fastest. Afterwards an op asks `kernel(problem, rows)`: a
dict lookup.

A call timed alone finds its weight in the caches, where a decode step finds it in memory
when the model is larger than the caches: between two calls on one layer's weight, the
step reads every other weight. So for an op whose weights stream (`OpTiming`), a call takes
at least the time to read what the candidate reads (its copy, else the weight) at the
bandwidth of a read as large as the model's weights (`read_bandwidth`, measured here): a
bf16 copy of a 4-bit weight reads 3.2x its bytes, which a call timed in the caches hides
(SmolLM2's layers at one row, AMD EPYC Zen 4: the copy 1.5-2x faster per call alone, the
decode step 1.5x slower with it). Where the model fits in the caches, so does that read.

The choices are cached per CPU model, thread count and versions of torch and of the
candidates' packages (`core info` prints them with the timings behind them); a change to
any of these measures again. CORE_KERNEL_CHOICE forces candidates ("linear=onednn",
"quant_linear/bfloat16=dequantized"): a forced candidate serves every problem of that op
(and format) it takes, measured or not. A candidate whose `available()` is False (the CPU
or torch lacks what it needs) is never timed nor chosen, nor may it be forced.

In batch-invariant mode (core.batch_invariant) only candidates that declare
`batch_invariant` are live, and one of them serves every row count of a problem (two
kernels at two row counts would sum a row in two orders): the forced one, else the first
registered. Nothing is timed.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import torch

from core import batch_invariant, envs, measurement_cache

logger = logging.getLogger(__name__)

# Rows are bucketed by powers of two: bucket i holds [2^i, 2^(i+1)); the last bucket holds
# every row count from its start on (past a few hundred rows a GEMM's speed per row is flat,
# and timing larger ones would cost seconds at start).
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CACHE_FILE_NAME = "kernel_choices.json"
# A candidate this many times slower than the best of a bucket, and slow in absolute terms,
# is not timed at the larger buckets of the same problem: its larger runs would cost seconds
# (torch's bf16 matmul on a CPU without native bf16 runs ~100x slower than the
# alternatives). Fast calls are always timed on: a GEMM many times slower than a GEMV on
# one row may win at many rows.
HOPELESS_RATIO = 8.0
HOPELESS_MIN_S = 1e-3
# Timing stops once this much time has passed (the remaining buckets keep the choice of
# the largest bucket measured).
MEASURE_BUDGET_S = 8.0
# Each candidate's time is the fastest of NUM_REPEATS calls (a call the OS preempted
# reads several ms long: one call alone could cache a wrong choice), or of two where a
# call takes longer than MAX_CALL_S.
NUM_REPEATS = 3
# Once the fastest call of a bucket takes this long, larger buckets keep its choice: past
# it a GEMM's time per row no longer changes with the row count, while timing the larger
# buckets would take most of the start-up (a 49,152-row head at 512 rows: ~0.5 s a call).
MAX_CALL_S = 0.03
# The smaller bucket's kernel stays the choice unless another is this much faster: two
# kernels within the timings' noise would otherwise alternate from bucket to bucket.
SWITCH_GAIN = 1.05


@dataclass(frozen=True)
class Problem:
    """What a kernel choice depends on besides the row count: the op, the weight's format
    (its dtype, or its packing and the activation's dtype) and the weight's shape."""

    op: str
    format: str
    shape: tuple[int, ...]

    def label(self) -> str:
        return f"{self.op} {self.format} {'x'.join(map(str, self.shape))}"


class KernelCandidate(ABC):
    """One implementation of an op that `KernelChoices` may choose.

    Contract: `__call__` takes the op's arguments and returns what the op's reference
    returns (to its dtype's precision) for every problem `takes` accepts; `available`
    says whether this machine can run it at all and is never False for a candidate that
    was chosen (it is read once, before timing). `copy_bytes` is the memory the candidate
    keeps beside the weight (a prepacked or dequantized copy), for `core info`.

    `batch_invariant` declares that while core.batch_invariant.enabled(), each output row
    is computed from that row of the activation alone, in an order fixed by the problem's
    shape: bit-identical whatever the row count, the row's position and the thread count
    (the conformance kit checks it). Only such candidates serve that mode.
    """

    op: str
    name: str
    provider: str  # the distribution that ships it (its version keys the cache)
    batch_invariant: bool = False

    def available(self) -> bool:
        return True

    def takes(self, problem: Problem) -> bool:
        return True

    def copy_bytes(self, problem: Problem) -> int:
        return 0

    @abstractmethod
    def __call__(self, *args: Any) -> Any: ...


@dataclass(frozen=True)
class OpTiming:
    """How `measure` times an op: `resize(problem, args, rows)` gives the op's recorded
    arguments with a `rows`-row activation (new values, same dtype and layout).
    `weights_stream`: the tensors after the activation are a weight that a step reads once
    (a linear layer's): a candidate with a copy reads the copy instead (`copy_bytes`)."""

    resize: Callable[[Problem, tuple, int], tuple]
    weights_stream: bool = False


@dataclass
class Choice:
    """The kernel of each row bucket of one problem, and why."""

    names: list[str]  # by ROW_BUCKETS index
    times: list[dict[str, float]]  # seconds by candidate name, per bucket measured
    reason: str
    copy_bytes: dict[str, int] = field(default_factory=dict)  # by candidate name, if any

    def to_record(self) -> dict[str, Any]:
        return {"names": self.names, "times": self.times, "reason": self.reason,
                "copy_bytes": self.copy_bytes}  # fmt: skip

    @classmethod
    def from_record(cls, record: object) -> Choice:
        if not isinstance(record, dict):
            raise TypeError("a choice record is a JSON object")
        names, times = record["names"], record["times"]
        if len(names) != len(ROW_BUCKETS) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"names must list a kernel per row bucket, not {names!r}")
        copies = record.get("copy_bytes", {})
        if not isinstance(copies, dict):
            raise TypeError("copy_bytes is a JSON object")
        copies = {str(n): int(b) for n, b in copies.items()}
        return cls(list(names), [dict(t) for t in times], str(record["reason"]), copies)


# Seconds one call of a candidate takes on a problem's arguments (the activation first);
# tests inject figures measured elsewhere through it.
Timer = Callable[[KernelCandidate, Problem, tuple], float]


def bucket_index(rows: int) -> int:
    """The ROW_BUCKETS index that holds `rows` (>= 1)."""
    return min(rows.bit_length(), len(ROW_BUCKETS)) - 1


@dataclass
class KernelChoices:
    """The candidates of each op and the choices made for this process's problems."""

    candidates: dict[str, list[KernelCandidate]] = field(default_factory=dict)
    timings: dict[str, OpTiming] = field(default_factory=dict)
    chosen: dict[Problem, list[KernelCandidate]] = field(default_factory=dict)
    choices: dict[Problem, Choice] = field(default_factory=dict)
    _recorded: dict[Problem, tuple] | None = None  # first call's arguments, while recording
    _invariant: bool = False  # the batch-invariant mode `chosen` was made in

    # -- registration (kernel packages, from their core.general entry points) ----------

    def declare_op(self, op: str, timing: OpTiming) -> None:
        self.timings[op] = timing

    def register(self, candidate: KernelCandidate) -> None:
        """Add a candidate for its op. Re-entrant: a candidate of the same class and name is
        kept as it is (with the choices made). The first registered candidate of an op
        serves its problems until they are measured."""
        found = self.candidates.setdefault(candidate.op, [])
        if any(type(c) is type(candidate) and c.name == candidate.name for c in found):
            return
        found[:] = [c for c in found if c.name != candidate.name]
        found.append(candidate)
        self.chosen.clear()

    # -- the op's side ---------------------------------------------------------------

    def kernel(self, problem: Problem, rows: int, args: tuple) -> KernelCandidate:
        """The candidate that serves `problem` with `rows` rows (`args`: the call's
        arguments, kept while recording). The op must have a registered candidate."""
        if self._invariant != batch_invariant.enabled():
            self._invariant = batch_invariant.enabled()
            self.chosen.clear()
            self.choices.clear()
        chosen = self.chosen.get(problem)
        if self._recorded is not None:
            self._recorded.setdefault(problem, args)
        if chosen is None:
            chosen = self._unmeasured(problem)
        return chosen[bucket_index(rows)]

    @contextmanager
    def recording(self) -> Iterator[dict[Problem, tuple]]:
        """Record every problem an op with candidates poses meanwhile (a dummy forward of
        the model), with its first call's arguments."""
        self._recorded = {}
        try:
            yield self._recorded
        finally:
            self._recorded = None

    # -- choosing ------------------------------------------------------------------------

    def measure(
        self,
        recorded: dict[Problem, tuple],
        max_rows: int,
        timer: Timer | None = None,
        weight_bytes: int | None = None,
    ) -> dict[Problem, Choice]:
        """Choose the kernel of every row bucket up to `max_rows` of each recorded problem:
        the forced candidate, else the cached choice, else the fastest by `timer` (default:
        the best of a few calls on the model's real weights). With `weight_bytes` (what the
        model's weights take), the calls of ops whose weights stream take at least their
        reads at `read_bandwidth(weight_bytes)` (the module's docstring). Saves what it
        measured. In batch-invariant mode: the problems' unmeasured choices, timing nothing."""
        if batch_invariant.enabled():
            return self._invariant_choices(recorded)
        path = measurement_cache.cache_path(CACHE_FILE_NAME)
        entries = measurement_cache.load_entries(path)
        measured: dict[str, object] = {}
        machine = machine_key()
        deadline = time.perf_counter() + MEASURE_BUDGET_S
        timer = timer or _best_time
        streaming = None if weight_bytes is None else _Streaming(timer, weight_bytes)
        for problem, args in recorded.items():
            live = self._live(problem)
            if len(live) < 2:
                continue
            streams = streaming is not None and self.timings[problem.op].weights_stream
            key = _cache_key(machine, problem, live, streams)
            choice = _cached(entries.get(key), live)
            if choice is None:
                op_timer = streaming if streams else timer
                choice = self._measure_one(problem, args, live, max_rows, op_timer, deadline)
                if streams:
                    choice.reason += f"; reads counted at {streaming.bandwidth / 1e9:.1f} GB/s"
                measured[key] = choice.to_record()
            self._adopt(problem, choice, live)
        if measured:
            measurement_cache.save_entries(path, {**entries, **measured})
        return {p: c for p, c in self.choices.items() if p in recorded}

    def _invariant_choices(self, recorded: dict[Problem, tuple]) -> dict[Problem, Choice]:
        """Batch-invariant mode's choice of each problem: one kernel for every row count."""
        for problem, args in recorded.items():
            kernel = self.kernel(problem, 1, args)
            reason = "batch-invariant mode: one kernel for every row count"
            self.choices[problem] = Choice([kernel.name] * len(ROW_BUCKETS), [], reason)
        return {p: c for p, c in self.choices.items() if p in recorded}

    def _measure_one(
        self,
        problem: Problem,
        args: tuple,
        live: list[KernelCandidate],
        max_rows: int,
        timer: Timer,
        deadline: float,
    ) -> Choice:
        resize = self.timings[problem.op].resize
        names: list[str] = []
        times: list[dict[str, float]] = []
        racing = list(live)
        for rows in ROW_BUCKETS:
            if names and (rows > max_rows or self._done(times[-1], deadline)):
                names.append(names[-1])
                continue
            example = resize(problem, args, rows)
            found = {c.name: timer(c, problem, example) for c in racing}
            best = min(found, key=found.__getitem__)
            if names and found.get(names[-1], math.inf) <= SWITCH_GAIN * found[best]:
                best = names[-1]
            racing = [c for c in racing if not _hopeless(found[c.name], found[best])]
            names.append(best)
            times.append(found)
        copies = {c.name: c.copy_bytes(problem) for c in live if c.copy_bytes(problem)}
        return Choice(names, times, "measured", copies)

    @staticmethod
    def _done(last: dict[str, float], deadline: float) -> bool:
        """Whether the larger buckets keep the last measured one's choice."""
        return min(last.values()) > MAX_CALL_S or time.perf_counter() > deadline

    def _adopt(self, problem: Problem, choice: Choice, live: list[KernelCandidate]) -> None:
        by_name = {c.name: c for c in live}
        forced = self._forced(problem, live)
        if forced is not None:
            self.chosen[problem] = [forced] * len(ROW_BUCKETS)
            self.choices[problem] = Choice([forced.name] * len(ROW_BUCKETS), choice.times,
                                           f"forced by {envs.KERNEL_CHOICE_ENV}")  # fmt: skip
            return
        self.chosen[problem] = [by_name[name] for name in choice.names]
        self.choices[problem] = choice

    def _unmeasured(self, problem: Problem) -> list[KernelCandidate]:
        """The forced candidate, else the op's first registered one that takes it."""
        live = self._live(problem)
        if not live:
            mode = " in batch-invariant mode" if batch_invariant.enabled() else ""
            raise ValueError(f"no available kernel of {problem.op} takes {problem.label()}{mode}")
        chosen = [self._forced(problem, live) or live[0]] * len(ROW_BUCKETS)
        self.chosen[problem] = chosen
        return chosen

    def _live(self, problem: Problem) -> list[KernelCandidate]:
        invariant = batch_invariant.enabled()
        return [
            c
            for c in self.candidates.get(problem.op, ())
            if c.available() and c.takes(problem) and (c.batch_invariant or not invariant)
        ]

    def _forced(self, problem: Problem, live: list[KernelCandidate]) -> KernelCandidate | None:
        forced = envs.kernel_choices_forced()
        name = forced.get(f"{problem.op}/{problem.format}") or forced.get(problem.op)
        if name is None:
            return None
        known = {c.name: c for c in self.candidates.get(problem.op, ())}
        if name not in known:
            raise ValueError(
                f"{envs.KERNEL_CHOICE_ENV}: {problem.op} has no kernel {name!r}; "
                f"its kernels: {', '.join(known) or 'none'}"
            )
        if not known[name].available():
            raise ValueError(f"{envs.KERNEL_CHOICE_ENV}: {name} cannot run on this machine")
        if batch_invariant.enabled() and not known[name].batch_invariant:
            raise ValueError(
                f"{envs.KERNEL_CHOICE_ENV}: {name} does not serve batch-invariant mode "
                f"(--batch-invariant); {problem.op}'s kernels that do: "
                f"{', '.join(c.name for c in known.values() if c.batch_invariant) or 'none'}"
            )
        return known[name] if known[name] in live else None


def machine_key() -> str:
    """The CPU model (name, family, model, stepping) and the thread count: what a
    measured choice holds for."""
    from core.platforms.cpu import cpuinfo

    info = cpuinfo()
    model = info.get("model name", "unknown CPU")
    ids = "/".join(info.get(field, "?") for field in ("cpu family", "model", "stepping"))
    return f"{model} ({ids}) | {torch.get_num_threads()} threads"


def _cache_key(machine: str, problem: Problem, live: list[KernelCandidate], streamed: bool) -> str:
    """What a measured choice holds for: the machine, torch's and the candidates' package
    versions, the problem, the candidates timed and whether their reads were counted."""
    versions = sorted({f"{c.provider} {_version(c.provider)}" for c in live})
    names = "+".join(c.name for c in live)
    parts = [machine, f"torch {torch.__version__}", *versions, problem.label(), names]
    return " | ".join(parts + (["reads counted"] if streamed else []))


def _hopeless(seconds: float, best: float) -> bool:
    return seconds > HOPELESS_RATIO * best and seconds > HOPELESS_MIN_S


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def _cached(record: object, live: list[KernelCandidate]) -> Choice | None:
    """The cached choice, if there is a well-formed one naming live candidates only."""
    if record is None:
        return None
    try:
        choice = Choice.from_record(record)
    except (KeyError, TypeError, ValueError) as exc:
        logger.warning("ignoring a malformed kernel choice (%r); measuring again", exc)
        return None
    names = {c.name for c in live}
    return choice if set(choice.names) <= names else None


def _best_time(candidate: KernelCandidate, problem: Problem, args: tuple) -> float:
    """The fastest of NUM_REPEATS calls (two for a call past MAX_CALL_S), after one
    untimed call (a copy made, caches warmed)."""
    with torch.inference_mode():
        candidate(*args)
        best = math.inf
        for repeat in range(NUM_REPEATS):
            start = time.perf_counter()
            candidate(*args)
            best = min(best, time.perf_counter() - start)
            if repeat and best > MAX_CALL_S:
                break
    return best


class _Streaming:
    """A timer whose calls take at least their candidate's reads at `bandwidth` (bytes/s),
    measured once, at the first call."""

    def __init__(self, timer: Timer, weight_bytes: int) -> None:
        self.timer, self.weight_bytes = timer, weight_bytes
        self.bandwidth: float | None = None

    def __call__(self, candidate: KernelCandidate, problem: Problem, args: tuple) -> float:
        if self.bandwidth is None:
            self.bandwidth = read_bandwidth(self.weight_bytes)
        weight = sum(arg.nbytes for arg in args[1:] if isinstance(arg, torch.Tensor))
        read = candidate.copy_bytes(problem) or weight
        return max(self.timer(candidate, problem, args), read / self.bandwidth)


# The most a read-bandwidth measurement reads: past any CPU's caches, so a model larger
# than this streams from memory at the bandwidth it measures.
MAX_BANDWIDTH_BYTES = 512 << 20


def read_bandwidth(num_bytes: int, repeats: int = 3) -> float:
    """Bytes per second at which this machine's threads read a buffer of `num_bytes` (at
    most MAX_BANDWIDTH_BYTES) again and again, as a decode step reads the weights: a
    float32 sum streams each byte once; the fastest of `repeats` after one untimed read."""
    x = torch.ones(max(1, min(num_bytes, MAX_BANDWIDTH_BYTES) // 4), dtype=torch.float32)
    x.sum()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.nbytes / best


def table_lines(choices: KernelChoices) -> list[str]:
    """`core info`'s table: the candidates of each op and every choice cached for this
    machine, as row ranges -> kernel, the memory the kernel's copy of that weight costs,
    and the timings that made the choice (microseconds per call at each bucket's first
    row count)."""
    lines = [f"kernel choices (core.kernel_choice; forced with {envs.KERNEL_CHOICE_ENV}):"]
    lines += [f"  {op}: {_names(found)}" for op, found in sorted(choices.candidates.items())]
    path = measurement_cache.cache_path(CACHE_FILE_NAME)
    prefix = machine_key() + " | "
    entries = measurement_cache.load_entries(path)
    mine = sorted((k, v) for k, v in entries.items() if k.startswith(prefix))
    if not mine:
        return [*lines, f"  measured: nothing yet on this CPU ({path}); a model's first start does"]
    lines.append(f"  measured on this CPU ({path}):")
    for key, record in mine:
        try:
            choice = Choice.from_record(record)
        except (KeyError, TypeError, ValueError):
            continue
        lines.append(f"    {key.removeprefix(prefix)}")
        lines += [f"      {span}" for span in _spans(choice)]
    return lines


def _spans(choice: Choice) -> list[str]:
    """Consecutive buckets with the same kernel as one line, with the timings of each."""
    spans: list[str] = []
    start = 0
    for i in range(1, len(ROW_BUCKETS) + 1):
        if i < len(ROW_BUCKETS) and choice.names[i] == choice.names[start]:
            continue
        last = "+" if i == len(ROW_BUCKETS) else f"-{ROW_BUCKETS[i] - 1}"
        last = "" if last == f"-{ROW_BUCKETS[start]}" else last
        times = "; ".join(
            f"{ROW_BUCKETS[b]}: " + ", ".join(f"{n} {t * 1e6:.0f}" for n, t in
                                             sorted(choice.times[b].items(), key=lambda x: x[1]))
            for b in range(start, min(i, len(choice.times)))
        )  # fmt: skip
        name = choice.names[start]
        copy = choice.copy_bytes.get(name, 0)
        cost = f", a {copy / 2**20:.1f} MiB copy" if copy else ""
        spans.append(f"rows {ROW_BUCKETS[start]}{last}: {name}{cost} (us: {times})")
        start = i
    return spans


def invariant_lines(choices: KernelChoices) -> list[str]:
    """`core info`'s kernels of batch-invariant mode: each op's candidates that declare
    `batch_invariant`. In the mode `kernel` takes the forced one, else the first that runs
    here and takes the problem, and raises where none does: the op's reference does not
    stand in for a missing candidate."""
    lines = ["  kernels that serve it (the first that runs here and takes a problem, "
             f"unless {envs.KERNEL_CHOICE_ENV} forces another):"]  # fmt: skip
    for op, found in sorted(choices.candidates.items()):
        serving = [c for c in found if c.batch_invariant]
        names = _names(serving) or "none declares it (a call in the mode fails, naming the op)"
        lines.append(f"    {op}: {names}")
    return lines


def _names(candidates: list[KernelCandidate]) -> str:
    return ", ".join(c.name + ("" if c.available() else " (not on this CPU)") for c in candidates)


KERNEL_CHOICES = KernelChoices()
"""The process's candidates and choices; kernel packages register into it."""
