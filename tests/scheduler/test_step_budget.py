"""Step budgets: a fixed one, and one sized from a line fit through measured step times."""

from __future__ import annotations

import pytest

from core.config import SchedulerConfig
from core.scheduler.step_budget import (
    FixedBudget,
    MeasuredBudget,
    StepCost,
    StepLoad,
    drain_tokens,
    step_budget,
)


def linear_cost(fixed: float, per_token: float, sizes=(1, 32, 128, 512)) -> StepCost:
    cost = StepCost()
    for num_tokens in sizes:
        cost.observe(num_tokens, fixed + per_token * num_tokens)
    return cost


def measured(fixed: float, per_token: float, max_tokens: int = 4096) -> MeasuredBudget:
    budget = MeasuredBudget(cold_tokens=8, max_tokens=max_tokens)
    budget.cost = linear_cost(fixed, per_token)
    return budget


def test_the_fit_recovers_a_linear_step_cost():
    fixed, per_token = linear_cost(0.05, 0.002).fit()
    assert fixed == pytest.approx(0.05, abs=1e-12)
    assert per_token == pytest.approx(0.002, rel=1e-12)


def test_no_fit_from_one_step_size_or_from_times_that_fall_with_tokens():
    assert linear_cost(0.05, 0.002, sizes=(128, 130)).fit() is None  # one power-of-two group
    falling = StepCost()
    falling.observe(1, 0.5)
    falling.observe(256, 0.1)
    assert falling.fit() is None


def test_many_decode_steps_keep_the_spread_a_burst_measured():
    cost = linear_cost(0.05, 0.002, sizes=(1, 1024))
    for _ in range(5000):
        cost.observe(32, 0.05 + 0.002 * 32)
    fixed, per_token = cost.fit()
    assert (fixed, per_token) == (pytest.approx(0.05), pytest.approx(0.002))


def test_a_step_that_drifts_slower_moves_its_groups_average_not_a_single_sample():
    cost = linear_cost(0.05, 0.002, sizes=(1, 512))
    cost.observe(512, 10.0)  # one outlier (a busy machine) moves 512's average a quarter
    _, per_token = cost.fit()
    assert 0.002 < per_token < (0.05 + 0.002 * 512 + 0.25 * 10.0) / 511


def test_a_measured_budget_uses_the_cold_budget_until_a_fit_exists():
    budget = MeasuredBudget(cold_tokens=8, max_tokens=4096)
    assert budget.tokens(StepLoad(num_decode_tokens=3, num_drain_tokens=125)) == 8
    budget.observe(1, 0.05)
    assert budget.tokens(StepLoad(3, 125)) == 8
    budget.observe(512, 0.05 + 0.002 * 511)
    assert budget.tokens(StepLoad(3, 125)) != 8


def test_a_prompt_drains_in_four_equal_shares_not_a_shrinking_tail():
    shares, computed = [], 0
    while computed < 161:
        shares.append(drain_tokens(161, computed))
        computed += shares[-1]
    assert shares == [41, 41, 41, 38]


# fixed 0.04 s and 0.002 s per token: the step's fixed cost is worth 20 prefill tokens.
@pytest.mark.parametrize(
    ("num_decode", "num_drain", "expected"),
    [
        # Nothing waits: the decode tokens and the steady share of their part (0.75 * 52).
        (32, 0, 32 + 39),
        # A short prompt fits that share: it is admitted at once.
        (32, 10, 32 + 39),
        # A 400-token prompt beside 32 streams: its quarter, 100 tokens.
        (32, 100, 32 + 100),
        # A wave of 5000 tokens onto an idle engine: nine times the fixed cost's 20 tokens.
        (0, 1250, 180),
        # The same wave once 32 streams run: nine times their part (9 * 52).
        (32, 1250, 32 + 468),
    ],
)
def test_the_allowance_drains_prompts_within_the_steady_and_burst_shares(
    num_decode, num_drain, expected
):
    budget = measured(0.04, 0.002)
    assert budget.tokens(StepLoad(num_decode, num_drain)) == expected


def test_a_measured_budget_never_exceeds_what_the_runner_holds():
    budget = measured(0.04, 0.002, max_tokens=100)
    assert budget.tokens(StepLoad(32, 1250)) == 100


def test_a_slower_prefill_token_shrinks_the_allowance():
    fast, slow = measured(0.04, 0.0002), measured(0.04, 0.002)
    load = StepLoad(0, 100_000)
    assert fast.tokens(load) == 10 * slow.tokens(load)


def test_a_fixed_budget_ignores_the_load_and_the_times():
    budget = FixedBudget(80)
    budget.observe(512, 3.0)
    assert budget.tokens(StepLoad(32, 1250)) == 80 and not budget.measured


def test_a_burst_budget_makes_steps_measured_up_to_it():
    assert isinstance(step_budget(SchedulerConfig(max_num_batched_tokens=80), 2048), FixedBudget)
    budget = step_budget(SchedulerConfig(max_num_batched_tokens=80, burst_token_budget=512), 2048)
    assert isinstance(budget, MeasuredBudget)
    assert (budget.cold_tokens, budget.max_tokens) == (80, 512)


def test_a_measured_budget_describes_its_fit_for_the_logs():
    budget = MeasuredBudget(cold_tokens=80, max_tokens=4096)
    assert budget.describe() == "no fit yet: 80 tokens a step"
    budget.cost = linear_cost(0.04, 0.002)
    assert budget.describe() == "a step costs 40.0 ms + 2.000 ms a token"
