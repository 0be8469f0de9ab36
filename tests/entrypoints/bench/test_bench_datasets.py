"""Synthetic prompts (exact lengths, seeded, distinct prefixes) and prompt files."""

from __future__ import annotations

import json

import pytest

from core.entrypoints.bench.datasets import (
    _SENTENCES,
    draw_lengths,
    load_prompts_file,
    synthetic_prompts,
)
from core.model_loader import resolve_model
from core.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model(None))


def test_fixed_length_prompts_have_exactly_that_many_tokens(tokenizer):
    prompts = synthetic_prompts(tokenizer, 5, 37)
    assert [len(p) for p in prompts] == [37] * 5


def test_range_lengths_are_drawn_uniformly_within_the_inclusive_range(tokenizer):
    prompts = synthetic_prompts(tokenizer, 60, (3, 5), seed=1)
    assert {len(p) for p in prompts} == {3, 4, 5}
    assert [len(p) for p in synthetic_prompts(tokenizer, 4, (64, 256), seed=2)] == draw_lengths(
        4, (64, 256), seed=2
    )


def test_same_seed_repeats_and_another_seed_differs(tokenizer):
    first = synthetic_prompts(tokenizer, 8, (16, 64), seed=3)
    assert synthetic_prompts(tokenizer, 8, (16, 64), seed=3) == first
    assert synthetic_prompts(tokenizer, 8, (16, 64), seed=4) != first


def test_no_two_prompts_share_a_first_kv_block(tokenizer):
    prompts = synthetic_prompts(tokenizer, 64, 32, seed=0)
    assert len({tuple(p[:16]) for p in prompts}) == 64


def test_prompts_are_the_tagged_english_sentence_bank(tokenizer):
    (prompt,) = synthetic_prompts(tokenizer, 1, 1200, seed=7)
    text = tokenizer.decode(prompt)
    assert text.startswith("Note 7.0: ")
    assert all(sentence in text for sentence in _SENTENCES)


@pytest.mark.parametrize("length", [0, (5, 3), (0, 4)])
def test_bad_lengths_are_refused(tokenizer, length):
    with pytest.raises(ValueError, match="length must be >= 1"):
        synthetic_prompts(tokenizer, 2, length)


def test_zero_prompts_are_refused(tokenizer):
    with pytest.raises(ValueError, match="num_prompts"):
        synthetic_prompts(tokenizer, 0, 8)


def test_prompt_file_takes_strings_token_lists_and_prompt_objects(tmp_path):
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(["hello", [1, 2, 3], {"prompt": "hi"}, {"prompt": [4, 5]}]))
    assert load_prompts_file(path) == ["hello", [1, 2, 3], "hi", [4, 5]]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"prompt": "x"}', "non-empty JSON list"),
        ("[]", "non-empty JSON list"),
        ('["ok", 3]', "prompt 1 must be"),
        ('[{"text": "x"}]', "prompt 0 must be"),
        ("[[1, -2]]", "prompt 0 must be"),
        ("[", "cannot read"),
    ],
)
def test_bad_prompt_files_name_the_problem(tmp_path, content, message):
    path = tmp_path / "prompts.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_prompts_file(path)
