"""The tiny random-weight model of the engine tests (core.testing.tiny_checkpoint) and the
settings they start it with.

`reference_model` is the same model in transformers, for greedy parity; `engine_kwargs`
what the engine tests start it with (float32, a short context, a small cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

from core.engine_args import EngineArgs
from core.testing.tiny_checkpoint import (  # noqa: F401 (re-exported for the tests)
    EOS_TOKEN_ID,
    VOCAB,
    reference_model,
    write_tiny_checkpoint,
)

MAX_MODEL_LEN = 32


def engine_kwargs(model_dir: Path, **overrides: Any) -> dict[str, Any]:
    """The EngineArgs keywords (as LLM takes them) the engine tests start the model with."""
    settings = dict(dtype="float32", max_model_len=MAX_MODEL_LEN, kv_cache_memory="1MiB")
    return {"model": str(model_dir), **settings, **overrides}


def engine_args(model_dir: Path, **overrides: Any) -> EngineArgs:
    return EngineArgs(**engine_kwargs(model_dir, **overrides))


def next_token_logits(model: transformers.LlamaForCausalLM, tokens: list[int]) -> torch.Tensor:
    """The reference's logits [V] for the token after `tokens`."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1]


def greedy_reference(model: transformers.LlamaForCausalLM, prompt: list[int], n: int) -> list[int]:
    """The reference's greedy continuation of `prompt`: `n` argmax tokens, eos or not."""
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(next_token_logits(model, tokens).argmax()))
    return tokens[len(prompt) :]
