"""How many tokens a step may schedule: a fixed budget, or one sized from measured step times.

A fixed budget (`FixedBudget`, max_num_batched_tokens) is every step's: what vLLM does, and
what a user who sets --max-num-batched-tokens asks for. Where a platform's serving default
(or the user) sets `SchedulerConfig.burst_token_budget`, steps are sized from their
measured cost instead (`MeasuredBudget`), because the right budget depends on how fast
this machine computes a prefill token against a decode step, which no constant captures:
on a 2-core AVX2 EPYC a prefill token costs about a decode row (so 80 tokens of prefill
double a 32-stream step), on an AMX Xeon ten times less.

The measured rule: a step schedules its decode tokens plus a prefill allowance, each
waiting prompt spread over DRAIN_STEPS steps (so an arrival's first token comes a few
steps after it, and arrivals faster than that raise the allowance instead of queueing),
held between STEADY_SHARE and BURST_SHARE times the decode part's own time. The floor
lets a short prompt in at once for at most that share of extra inter-token latency; the
ceiling splits a wave of arrivals into steps whose decode rows (the wave's first streams,
already producing tokens) are at most a tenth of the work, so first tokens come out
chunk by chunk instead of all after the whole wave's prefill.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from core.config import SchedulerConfig

# Each pending prompt is spread over this many steps (see the module docstring).
DRAIN_STEPS = 4
# A step's prefill part costs at least this share of its decode part (when prompts wait)...
STEADY_SHARE = 0.75
# ... and at most this many times it: the decode rows stay about a tenth of a step.
BURST_SHARE = 9.0
# Step sizes are grouped by powers of two; each group keeps a moving average.
SMOOTHING = 0.25


@dataclass(frozen=True)
class StepLoad:
    """What the next step could do, in tokens."""

    # Tokens of running requests past their prompt: one each, plus drafts to verify.
    num_decode_tokens: int
    # The prompt tokens this step should compute for every pending prompt (of running
    # requests still prefilling, and of the waiting ones the step may admit) to be done
    # DRAIN_STEPS steps after it started: `drain_tokens` summed over them.
    num_drain_tokens: int


def drain_tokens(num_tokens: int, num_computed_tokens: int) -> int:
    """A prompt's share of a step: a DRAIN_STEPS-th of it, or what remains of it if less
    (a share of the whole, not of the rest, so it is done in DRAIN_STEPS steps, not in a
    tail of ever smaller chunks). Prefix-cache hits are not known before admission."""
    return min(num_tokens - num_computed_tokens, math.ceil(num_tokens / DRAIN_STEPS))


class StepBudget(ABC):
    """The token budget of each step. `tokens` is called once per step before anything is
    scheduled; `observe` after each step that ran, with its scheduled tokens and the
    seconds its execution took (never while steps overlap, as under pipeline parallelism)."""

    # Whether `tokens` reads the load (the scheduler computes it only then).
    measured: bool = False

    @abstractmethod
    def tokens(self, load: StepLoad) -> int:
        """The most tokens the next step may schedule: at least 1."""

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Learn from a step that ran; budgets that measure nothing ignore it."""


class FixedBudget(StepBudget):
    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens

    def tokens(self, load: StepLoad) -> int:
        return self.num_tokens


class StepCost:
    """A step's seconds as `fixed + per_token * tokens`, fit over step-size groups.

    Each power-of-two group of step sizes keeps a moving average of its steps' tokens and
    seconds, so a fit keeps the spread of sizes it has seen (the start-up samples, a
    burst) while thousands of decode steps of one size only refine their own group."""

    def __init__(self) -> None:
        self._groups: dict[int, tuple[float, float]] = {}

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens <= 0 or seconds <= 0:
            return
        group = num_tokens.bit_length()
        old = self._groups.get(group)
        if old is None:
            self._groups[group] = (float(num_tokens), seconds)
            return
        self._groups[group] = (
            old[0] + SMOOTHING * (num_tokens - old[0]),
            old[1] + SMOOTHING * (seconds - old[1]),
        )

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per token) by least squares over the groups; None until
        two groups exist or when the seconds do not grow with tokens."""
        if len(self._groups) < 2:
            return None
        xs, ys = zip(*self._groups.values(), strict=True)
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mean_x) ** 2 for x in xs)
        per_token = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
        if per_token <= 0:
            return None
        return max(mean_y - per_token * mean_x, 0.0), per_token


class MeasuredBudget(StepBudget):
    """The module docstring's rule, on `StepCost`'s fit; `cold_tokens` until a fit exists,
    never more than `max_tokens` (what the model runner's buffers hold)."""

    measured = True

    def __init__(self, cold_tokens: int, max_tokens: int) -> None:
        self.cold_tokens = cold_tokens
        self.max_tokens = max_tokens
        self.cost = StepCost()

    def observe(self, num_tokens: int, seconds: float) -> None:
        self.cost.observe(num_tokens, seconds)

    def describe(self) -> str:
        """The current fit in words, for logs."""
        fit = self.cost.fit()
        if fit is None:
            return f"no fit yet: {self.cold_tokens} tokens a step"
        fixed, per_token = fit
        return f"a step costs {fixed * 1e3:.1f} ms + {per_token * 1e3:.3f} ms a token"

    def tokens(self, load: StepLoad) -> int:
        fit = self.cost.fit()
        if fit is None:
            return self.cold_tokens
        fixed, per_token = fit
        # The decode part's time (the step's fixed cost included) in prefill tokens.
        decode_part = fixed / per_token + load.num_decode_tokens
        allowance = min(
            max(load.num_drain_tokens, STEADY_SHARE * decode_part), BURST_SHARE * decode_part
        )
        budget = load.num_decode_tokens + max(math.floor(allowance + 0.5), 1)
        return min(budget, self.max_tokens)


def step_budget(config: SchedulerConfig, max_model_len: int) -> StepBudget:
    """Measured where a burst budget is set (it caps the steps), else fixed."""
    budget = config.max_num_batched_tokens or max_model_len
    if config.burst_token_budget is None:
        return FixedBudget(budget)
    return MeasuredBudget(budget, config.max_step_tokens(max_model_len))
