"""RequestLogger: a request's inputs, cut to --max-log-len."""

from __future__ import annotations

import logging

from core.engine.processor import PreparedRequest
from core.entrypoints.openai.request_logger import RequestLogger
from core.lora.request import LoRARequest
from core.sampling_params import SamplingParams


def test_prompt_and_token_ids_are_cut_to_max_log_len(caplog):
    caplog.set_level(logging.INFO, logger="core.entrypoints.openai.request_logger")
    prepared = PreparedRequest("abcdefgh", list(range(10)), SamplingParams(max_tokens=3))
    RequestLogger(max_log_len=4).log_inputs("trace-1-0", prepared, LoRARequest("sql", 1, "/a"))
    (line,) = caplog.messages
    assert line.startswith(
        "Received request trace-1-0: prompt: 'abcd', prompt_token_ids: [0, 1, 2, 3], params: "
    )
    assert "max_tokens=3" in line and line.endswith("lora: sql")


def test_without_max_log_len_everything_is_logged(caplog):
    caplog.set_level(logging.INFO, logger="core.entrypoints.openai.request_logger")
    prepared = PreparedRequest(None, [5, 6, 7], SamplingParams())
    RequestLogger().log_inputs("req-0-0", prepared, None)
    assert "prompt: None, prompt_token_ids: [5, 6, 7]" in caplog.messages[0]
    assert caplog.messages[0].endswith("lora: None")
