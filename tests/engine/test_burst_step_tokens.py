"""The engine sizes a burst's steps from the prefill cost the kernels measured at load."""

from __future__ import annotations

from core.config import UsageContext
from core.engine.core import BURST_STEP_S, _burst_step_tokens
from core.engine_args import EngineArgs
from core.platforms.cpu import CpuPlatform


def config(usage: UsageContext = UsageContext.SERVING, **kwargs):
    return EngineArgs(**kwargs).create_engine_config(CpuPlatform(), model_max_len=8192, usage=usage)


def test_a_burst_step_lasts_burst_step_s_at_the_slowest_ranks_measured_speed():
    c = config()
    assert c.scheduler.burst_token_budget == 8192  # the platform's: sizes the buffers
    slow = BURST_STEP_S / 1000  # 1,000 tokens in a burst step
    assert _burst_step_tokens(c, [slow / 2, slow, None]) == 1000
    assert _burst_step_tokens(c, [BURST_STEP_S / 10**6]) == 8192  # capped by the buffers
    step = c.scheduler.max_num_batched_tokens
    assert _burst_step_tokens(c, [BURST_STEP_S]) == step  # never under the step budget


def test_a_budget_the_user_set_or_nothing_measured_keeps_the_configured_one():
    assert _burst_step_tokens(config(burst_token_budget=4096), [1e-6]) is None
    assert _burst_step_tokens(config(), [None]) is None
    assert _burst_step_tokens(config(UsageContext.OFFLINE), [1e-6]) is None  # no bursts
