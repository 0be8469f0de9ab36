"""W5's prompts: chat requests whose answer repeats long spans of the prompt.

Two kinds, alternating: a list to repeat with every number incremented, and code to
rewrite with one variable renamed. Both are drawn from a fixed seed and rendered with the
model's chat template, so an instruction-tuned model answers by copying (SmolLM2-135M
copies most of the material, though it often forgets the change it was asked for). The
material grows line by line until it holds `copy_len` tokens, so the answer's copy fills
about that many output tokens.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

__all__ = ["copy_prompts"]

_ITEMS = (
    "apples", "pears", "bolts", "nails", "chairs", "lamps", "books", "cups", "pens", "boxes",
    "ropes", "tiles", "bricks", "hats", "coats", "shoes", "plates", "spoons", "keys", "maps",
    "forks", "knives", "bowls", "jars", "bags", "cards", "coins", "gloves", "socks", "belts",
    "rings", "bells", "drums", "flags", "kites", "bikes", "tents", "rugs", "clocks", "mugs",
)  # fmt: skip
_VARIABLES = ("total", "count", "value", "index", "result", "buffer", "offset", "limit")
_KEYS = (
    "alpha", "beta", "gamma", "delta", "width", "height", "depth", "speed", "mode", "level",
    "scale", "ratio", "margin", "rate", "steps", "seed", "size", "color", "angle", "limit",
)  # fmt: skip


def copy_prompts(tokenizer: Any, num_prompts: int, copy_len: int, seed: int) -> list[list[int]]:
    """`num_prompts` chat prompts as token ids, the kinds alternating (list first); the same
    seed gives the same prompts."""
    if num_prompts < 1 or copy_len < 1:
        raise ValueError(f"num_prompts and copy_len must be >= 1, got {num_prompts}, {copy_len}")
    rng = random.Random(seed)
    tasks = [(_list_task, _code_task)[i % 2](tokenizer, copy_len, rng) for i in range(num_prompts)]
    return [_chat_ids(tokenizer, task) for task in tasks]


def _chat_ids(tokenizer: Any, content: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}])
    return tokenizer.encode(text, add_special_tokens=False)


def _material(tokenizer: Any, lines: Iterator[str], copy_len: int) -> str:
    """Lines joined until the text holds at least `copy_len` tokens."""
    text = next(lines)
    while len(tokenizer.encode(text, add_special_tokens=False)) < copy_len:
        text += "\n" + next(lines)
    return text


def _cycle(rng: random.Random, pool: tuple[str, ...]) -> Iterator[str]:
    """The pool in a fresh shuffled order each time round."""
    while True:
        yield from rng.sample(pool, len(pool))


def _list_task(tokenizer: Any, copy_len: int, rng: random.Random) -> str:
    lines = (f"- {item}: {rng.randint(2, 98)}" for item in _cycle(rng, _ITEMS))
    body = _material(tokenizer, lines, copy_len)
    return f"Repeat this list with every number incremented by one:\n{body}"


def _code_task(tokenizer: Any, copy_len: int, rng: random.Random) -> str:
    old, new = rng.sample(_VARIABLES, 2)
    body = _material(tokenizer, _code_lines(old, rng), copy_len)
    code = f"def build_settings({old}):\n    settings = {{}}\n{body}\n    return settings"
    return f"Rewrite this code, renaming the variable {old} to {new}:\n\n```python\n{code}\n```"


def _code_lines(variable: str, rng: random.Random) -> Iterator[str]:
    for key in _cycle(rng, _KEYS):
        yield f'    settings["{key}"] = {variable} * {rng.randint(2, 9)} + {rng.randint(1, 99)}'
