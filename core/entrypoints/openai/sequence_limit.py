"""How many sequences one generation request may create (--max-sequences-per-request).

A completions request makes one engine request per prompt and ``n`` samples of each, so a
body of a few kilobytes (400 one-word prompts, ``n`` 128) would queue 51,200 sequences:
work out of all proportion to what the client sent. The bound is checked before anything
is tokenized or queued. vLLM bounds ``n`` alone, with the VLLM_MAX_N_SEQUENCES environment
variable (16384); core bounds what it multiplies into, prompts x ``n``, with a flag.
"""

from __future__ import annotations

from http import HTTPStatus

from core.entrypoints.openai.errors import OpenAIError

__all__ = ["check_sequence_limit"]

_FLAG = "--max-sequences-per-request"


def check_sequence_limit(num_prompts: int, n: int, limit: int) -> None:
    """A 400 when ``num_prompts`` prompts of ``n`` samples each are more than ``limit``
    sequences: naming ``prompt`` when the prompts alone are too many (no ``n`` would do),
    else ``n``."""
    if num_prompts * n <= limit:
        return
    if num_prompts > limit:
        param, asked = "prompt", f"prompt holds {num_prompts} prompts"
    elif num_prompts == 1:
        param, asked = "n", f"n is {n}"
    else:
        param, asked = "n", f"n is {n} for each of {num_prompts} prompts ({num_prompts * n})"
    raise OpenAIError(
        HTTPStatus.BAD_REQUEST,
        f"{asked}, more than the {limit} sequences one request may create ({_FLAG})",
        param=param,
    )
