"""Benchmark prompts: synthetic token-id prompts of exact lengths, or a JSON file of prompts."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Protocol

# Plain English prose, so synthetic prompts tokenize and attend like real text rather
# than like random ids (which inflate the vocabulary spread and skew sampling work).
_SENTENCES = (
    "The river had risen overnight, and by morning the low road to the mill was under water.",
    "Most of the village gathered on the bridge to watch the brown current carry branches past.",
    "A baker on the corner kept his ovens going, because people still needed bread.",
    "Nobody could remember a spring as wet as this one, not even the oldest fishermen.",
    "The library opened its doors early so that children had somewhere dry to spend the day.",
    "Inside, a volunteer read aloud from a book about ships that sailed to distant islands.",
    "Engineers from the city arrived in the afternoon with pumps, sandbags and a long list.",
    "They measured the level every hour and wrote the numbers on a board outside the hall.",
    "A good measurement is worth more than a confident guess, one of them told the crowd.",
    "By evening the water had stopped rising, and the mood in the square grew lighter.",
    "Someone brought a guitar, and the old songs about the valley were sung again.",
    "Scientists study weather by combining satellite images, ground stations and careful models.",
    "A model is only useful when its assumptions are stated plainly and tested often.",
    "Small errors in the starting conditions can grow into large differences a week later.",
    "That is why forecasts speak of probabilities instead of promising a single outcome.",
    "Computers made it possible to run many forecasts at once and compare their spread.",
    "The first programmable machines filled whole rooms and consumed enormous amounts of power.",
    "A phone today does more arithmetic each second than those rooms managed in a year.",
    "Yet the hard part of computing was never the arithmetic but deciding what to compute.",
    "A clear question often leads to a simple program, while a vague one leads to a tangle.",
    "Gardeners know that patience matters more than any particular tool or fertilizer.",
    "Tomatoes want sun and steady water, and they sulk when the nights turn cold.",
    "Beans climb whatever you give them, a fence, a pole, or the stalk of a neighbour's corn.",
    "In autumn the leaves are raked into heaps that slowly turn into dark, crumbling soil.",
    "The museum downtown keeps a collection of maps drawn long before aircraft existed.",
    "Some coastlines on those maps are astonishingly accurate, others wildly imagined.",
    "Sailors relied on the stars, a compass, and a great deal of hard-won experience.",
    "A mistake of one degree could mean missing a harbour by many miles after a long voyage.",
    "Teachers say that the best way to learn something is to explain it to someone else.",
    "Explaining forces you to notice the steps you skipped when you first understood it.",
    "Good writing works the same way, removing every sentence the reader does not need.",
    "The train to the coast leaves at seven and stops at every small station along the line.",
    "Passengers read, sleep, or watch the fields slide by in long green and yellow stripes.",
    "Near the end of the journey the air changes, and you can smell the salt before the sea.",
    "Music travels between cultures faster than almost anything else people make.",
    "A rhythm heard once in a distant market can turn up years later in a popular song.",
    "Every instrument began as an experiment, a hollow log, a stretched skin, a taut string.",
    "Cooks improvise in a similar spirit, tasting and adjusting until the balance feels right.",
    "A pinch of salt can make sweetness brighter, and a little acid can lift a heavy stew.",
    "At the end of the day the lights of the town come on one by one across the hill.",
)


class _Encoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


Length = int | tuple[int, int]


def draw_lengths(num: int, length: Length, seed: int = 0) -> list[int]:
    """`num` lengths: all `length`, or uniform in the inclusive range (lo, hi), seeded."""
    return _draw(random.Random(seed), num, length)


def synthetic_prompts(
    tokenizer: _Encoder, num_prompts: int, input_len: Length, seed: int = 0
) -> list[list[int]]:
    """Token-id prompts of exactly the drawn lengths (uniform in a (lo, hi) range).

    Each is English prose: a tag naming the seed and the prompt's index, then the built-in
    sentences in a seeded shuffled order, repeated as needed and cut to length. The tag
    makes every prompt (of more than a few tokens) start differently, so no two share a
    prefix-cache block; runs with the same seed repeat exactly.
    """
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    rng = random.Random(seed)
    lengths = _draw(rng, num_prompts, input_len)
    return [
        _prose_tokens(tokenizer, f"Note {seed}.{index}:", length, rng)
        for index, length in enumerate(lengths)
    ]


def _draw(rng: random.Random, num: int, length: Length) -> list[int]:
    low, high = (length, length) if isinstance(length, int) else length
    if not 1 <= low <= high:
        raise ValueError(f"length must be >= 1 (a range as low <= high), got {length}")
    return [rng.randint(low, high) for _ in range(num)]


def _prose_tokens(tokenizer: _Encoder, tag: str, length: int, rng: random.Random) -> list[int]:
    ids = tokenizer.encode(tag, add_special_tokens=False)
    while len(ids) < length:
        order = rng.sample(_SENTENCES, len(_SENTENCES))
        ids += tokenizer.encode(" " + " ".join(order), add_special_tokens=False)
    return ids[:length]


def load_prompts_file(path: str | Path) -> list[str | list[int]]:
    """Prompts from a JSON list of strings, token-id lists, or objects with "prompt"."""
    try:
        items = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a JSON prompt list: {exc}") from exc
    if not isinstance(items, list) or not items:
        raise ValueError(f"{path}: expected a non-empty JSON list of prompts")
    return [_prompt(path, index, item) for index, item in enumerate(items)]


def _prompt(path: str | Path, index: int, item: Any) -> str | list[int]:
    value = item.get("prompt") if isinstance(item, dict) else item
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(type(t) is int and t >= 0 for t in value):
        return value
    raise ValueError(
        f"{path}: prompt {index} must be a non-empty string, a list of token ids, "
        f'or an object with "prompt" holding one'
    )


__all__ = ["Length", "draw_lengths", "load_prompts_file", "synthetic_prompts"]
