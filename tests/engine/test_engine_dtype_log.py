"""The engine core says once at start which dtype the model runs in and why."""

from __future__ import annotations

import logging

import pytest
from tiny_engine_checkpoint import engine_args

from core.engine.llm_engine import LLMEngine
from core.platforms import cpu, cpu_dtype


@pytest.fixture
def no_bf16_cpu(monkeypatch):
    """A CPU without a native bf16 dot product, so "auto" means float32 unmeasured."""
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    cpu_dtype.choose_cpu_dtype.cache_clear()
    yield
    cpu_dtype.choose_cpu_dtype.cache_clear()


@pytest.mark.parametrize(
    ("dtype", "line"),
    [("auto", "dtype: float32 (no AMX or AVX512_BF16)"), ("float32", "dtype: float32 (--dtype)")],
)
def test_the_engine_logs_its_dtype_and_why_once(tiny_checkpoint, no_bf16_cpu, caplog, dtype, line):
    with caplog.at_level(logging.INFO, logger="core.engine.core"):
        engine = LLMEngine(engine_args(tiny_checkpoint, dtype=dtype))
        engine.shutdown()
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("dtype:")] == [line]
