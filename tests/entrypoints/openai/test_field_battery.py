"""A battery over every field of vLLM's completions and chat request protocols, sent with a
value that asks for something, to a real `core serve` of the default model: each answer is a
200 (the field is honoured, and EFFECTS names the test that shows what it does) or a 400
naming the field (refused); never a 5xx, never a hang.

The field lists are vLLM's (vllm/entrypoints/openai/protocol.py's CompletionRequest and
ChatCompletionRequest, with OpenAI's own fields), written here rather than read from core,
so a field core forgets is still sent.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[2]
OPENAI = "entrypoints/openai/"
PARAMS = (f"{OPENAI}test_params.py", "test_field_maps_to_sampling_params")
STRUCTURED = (f"{OPENAI}test_params.py", "test_structured_output_fields_map_to_one_constraint")

# Both routes: field -> a value that asks for something (valid, so a 400 is a refusal).
COMMON: dict[str, Any] = {
    "model": "SmolLM2-135M-Instruct",
    "frequency_penalty": 0.5,
    "logit_bias": {"28": 5},
    "max_tokens": 3,
    "n": 2,
    "presence_penalty": 0.5,
    "seed": 7,
    "stop": ["zzz"],
    "stream_options": {"include_usage": True},
    "temperature": 0.7,
    "top_p": 0.9,
    "user": "battery",
    "best_of": 3,
    "use_beam_search": True,
    "top_k": 5,
    "min_p": 0.1,
    "repetition_penalty": 1.1,
    "length_penalty": 0.5,
    "stop_token_ids": [2],
    "include_stop_str_in_output": True,
    "ignore_eos": True,
    "min_tokens": 1,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 4,
    "prompt_logprobs": 1,
    "allowed_token_ids": [28, 29, 30],
    "bad_words": ["zzz"],
    "response_format": {"type": "json_object"},
    "structured_outputs": {"regex": "[a-z]+"},
    "guided_json": {"type": "object"},
    "guided_regex": "[a-z]+",
    "guided_choice": ["yes", "no"],
    "guided_grammar": 'root ::= "yes" | "no"',
    "guided_decoding_backend": "outlines",
    "guided_whitespace_pattern": " ",
    "priority": 1,
    "request_id": "battery-1",
    "logits_processors": ["pkg.Processor"],
    "return_tokens_as_token_ids": True,
    "return_token_ids": True,
    "cache_salt": "tenant",
    "kv_transfer_params": {"do_remote_prefill": True},
    "vllm_xargs": {"key": "value"},
}
COMPLETION_ONLY: dict[str, Any] = {
    "prompt": "Hello",
    "echo": True,
    "logprobs": 2,
    "suffix": "end",
    "stream": True,
    "prompt_embeds": "AAAA",
    "add_special_tokens": False,  # completions add them by default
}
CHAT_ONLY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Hello"}],
    "logprobs": True,
    "top_logprobs": 2,
    "max_completion_tokens": 3,
    "stream": True,
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": "none",
    "parallel_tool_calls": False,
    "reasoning_effort": "low",
    "include_reasoning": False,
    "echo": True,
    "add_generation_prompt": False,
    "continue_final_message": True,
    "documents": [{"title": "t", "text": "x"}],
    "chat_template": "{{ messages[0].content }}",
    "chat_template_kwargs": {"enable_thinking": False},
    "mm_processor_kwargs": {"num_crops": 4},
    "media_io_kwargs": {"image": {"x": 1}},
    "store": True,
    "metadata": {"k": "v"},
    "service_tier": "flex",
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "x"},
    "web_search_options": {},
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "add_special_tokens": True,  # the chat template writes them: not added by default
}
# The honoured fields, and the test (file under tests/, function; "": the whole file) that
# shows each one's effect.
EFFECTS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(
        ["frequency_penalty", "presence_penalty", "seed", "stop", "temperature", "top_p",
         "top_k", "min_p", "repetition_penalty", "stop_token_ids", "include_stop_str_in_output",
         "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
         "allowed_token_ids", "bad_words", "logit_bias", "n"],
        PARAMS,
    ),  # fmt: skip
    **dict.fromkeys(
        ["response_format", "structured_outputs", "guided_json", "guided_regex",
         "guided_choice", "guided_grammar"],
        STRUCTURED,
    ),  # fmt: skip
    "model": (
        f"{OPENAI}test_lora_server.py",
        "test_one_batch_mixing_adapters_and_the_base_model_matches_peft",
    ),
    "max_tokens": (
        f"{OPENAI}test_params.py",
        "test_completion_max_tokens_default_explicit_and_null",
    ),
    "max_completion_tokens": (
        f"{OPENAI}test_params.py",
        "test_chat_max_completion_tokens_wins_over_max_tokens",
    ),
    "stream": (
        f"{OPENAI}test_usage_options.py",
        "test_a_stream_of_n_samples_sends_one_choice_a_chunk",
    ),
    "stream_options": (
        f"{OPENAI}test_usage_options.py",
        "test_every_stream_ends_with_the_usage_chunk_unasked",
    ),
    "user": (f"{OPENAI}test_request_logger.py", ""),
    "use_beam_search": (f"{OPENAI}test_beam_search_server.py", ""),
    "length_penalty": (f"{OPENAI}test_beam_search_server.py", ""),
    "prompt_logprobs": (f"{OPENAI}test_prompt_logprobs.py", ""),
    "cache_salt": (
        f"{OPENAI}test_request_options.py",
        "test_priority_and_cache_salt_reach_the_engine_under_the_priority_policy",
    ),
    "vllm_xargs": (
        f"{OPENAI}test_request_fields.py",
        "test_vllm_xargs_reach_the_engine_as_extra_args",
    ),
    "prompt": (f"{OPENAI}test_server.py", ""),
    "echo": (
        f"{OPENAI}test_params.py",
        "test_completion_logprobs_and_echo_ask_for_prompt_logprobs",
    ),
    "logprobs": (
        f"{OPENAI}test_params.py",
        "test_chat_logprobs_flag_and_top_logprobs",
    ),
    "top_logprobs": (
        f"{OPENAI}test_params.py",
        "test_chat_logprobs_flag_and_top_logprobs",
    ),
    "messages": (f"{OPENAI}test_server.py", ""),
    "tools": (f"{OPENAI}test_tool_calling.py", ""),
    "tool_choice": (
        f"{OPENAI}test_tool_calling.py",
        "test_choice_none_leaves_the_output_as_text",
    ),
    "parallel_tool_calls": (
        f"{OPENAI}test_tool_calling.py",
        "test_required_choice_without_parallel_calls_allows_one_call",
    ),
    "add_generation_prompt": ("test_chat_template.py", ""),
    "continue_final_message": ("entrypoints/test_llm_chat.py", ""),
    "chat_template": (f"{OPENAI}test_request_template_isolation.py", ""),
    "chat_template_kwargs": (f"{OPENAI}test_bad_inputs.py", ""),
}  # fmt: skip


def cases() -> list[tuple[str, str, Any]]:
    routes = {
        "/v1/completions": {**COMMON, **COMPLETION_ONLY},
        "/v1/chat/completions": {**COMMON, **CHAT_ONLY},
    }
    return [
        (route, field, value) for route, table in routes.items() for field, value in table.items()
    ]


def base(route: str) -> dict[str, Any]:
    if route == "/v1/completions":
        return {"prompt": "Hello", "max_tokens": 3}
    return {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}


@pytest.mark.parametrize(("route", "field", "value"), cases())
def test_every_field_is_honoured_or_refused_by_name(default_server, route, field, value):
    body = {**base(route), field: value}
    if field in ("use_beam_search", "length_penalty"):
        body.update(use_beam_search=True, temperature=0)  # beam search's own terms
    if field == "tools":
        body["tool_choice"] = "none"  # "auto" needs the server's tool-parser flags
    if field == "continue_final_message":
        body["messages"] = [*body["messages"], {"role": "assistant", "content": "Hi"}]
    answer = httpx.post(f"{default_server.url}{route}", json=body, timeout=120)
    assert answer.status_code in (200, 400), answer.text
    if answer.status_code == 400:
        error = answer.json()["error"]
        named = f"{error.get('param')} {error['message']}"
        assert re.search(rf"\b{re.escape(field)}\b", named), (field, error)
    else:
        assert field in EFFECTS, f"{field} is accepted: which test shows what it does?"


def test_every_named_effect_test_exists():
    for field, (path, name) in EFFECTS.items():
        text = (TESTS / path).read_text()
        assert not name or f"def {name}(" in text, (field, path, name)
