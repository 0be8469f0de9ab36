"""A tiny tokenizer with `<think>` and `</think>` as added tokens, for the parser tests."""

from __future__ import annotations

import tokenizers
from tokenizers import models, pre_tokenizers

from core.tokenizer import Tokenizer

WORDS = ["<unk>", "</s>", "the", "answer", "is", "42"]
START, END = "<think>", "</think>"


def think_tokenizer(special: bool = True, tags: tuple[str, ...] = (START, END)) -> Tokenizer:
    """Word-level over WORDS, plus `tags` as added tokens (special ones, unless not)."""
    backend = tokenizers.Tokenizer(
        models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    )
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<unk>", "</s>"])
    added = [tokenizers.AddedToken(tag, special=special) for tag in tags]
    if special:
        backend.add_special_tokens(added)
    else:
        backend.add_tokens(added)
    return Tokenizer(backend, {"eos_token": "</s>"}, {})
