"""deepseek_r1 and qwen3 on crafted outputs: the whole split, the same split streamed
however the text is cut (markers split across pieces included), and where the reasoning
ends in token ids."""

from __future__ import annotations

import itertools

import pytest
from think_vocab import END, START, think_tokenizer

from core.reasoning import ReasoningSplit, ReasoningStream, build_reasoning_parser
from core.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from core.reasoning.qwen3 import Qwen3ReasoningParser

# (output text, expected reasoning, expected content) per parser.
DEEPSEEK_R1 = [
    ("\nLet me see.</think>\n\nIt is 42.", "\nLet me see.", "\n\nIt is 42."),
    ("<think>\nhmm</think>42", "\nhmm", "42"),  # the model opened its reasoning itself
    ("still thinking when cut off", "still thinking when cut off", None),
    ("</think>42", None, "42"),
    ("done</think>", "done", None),
    ("a</think>b</think>c<think>d", "a", "b</think>c<think>d"),  # only the first end counts
    ("x < y and </thing> stays", "x < y and </thing> stays", None),
    ("", None, None),
]
QWEN3 = [
    ("<think>\nLet me see.\n</think>\n\nIt is 42.", "\nLet me see.\n", "\n\nIt is 42."),
    ("It is 42.", None, "It is 42."),  # thinking switched off: no tags at all
    ("no opening</think>so all content", None, "no opening</think>so all content"),
    ("<think>cut off while thinking", "cut off while thinking", None),
    ("<think></think>42", None, "42"),
    ("lead <think>r</think> tail", "r", "lead  tail"),
    ("<think>a</think>b<think>c</think>d", "a", "b<think>c</think>d"),
    ("x <thin y", None, "x <thin y"),
    ("", None, None),
]
CASES = [("deepseek_r1", *case) for case in DEEPSEEK_R1] + [("qwen3", *case) for case in QWEN3]


@pytest.fixture(scope="module")
def parsers():
    tokenizer = think_tokenizer()
    return {name: build_reasoning_parser(name, tokenizer) for name in ("deepseek_r1", "qwen3")}


def streamed(parser, pieces: list[str]) -> ReasoningSplit:
    """The pieces through one ReasoningStream, each part's pieces joined (None: none)."""
    stream = ReasoningStream(parser)
    reasoning, content = [], []
    for i, piece in enumerate(pieces):
        part = stream.step(piece, finished=i == len(pieces) - 1)
        reasoning.append(part.reasoning or "")
        content.append(part.content or "")
    return ReasoningSplit("".join(reasoning) or None, "".join(content) or None)


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
def test_whole_output_splits_into_reasoning_and_content(parsers, name, text, reasoning, content):
    assert parsers[name].extract_reasoning(text) == (reasoning, content)


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
def test_a_stream_cut_anywhere_adds_up_to_the_whole_split(parsers, name, text, reasoning, content):
    parser = parsers[name]
    cuts = [
        *([i] for i in range(len(text) + 1)),  # two pieces, at every position
        *(list(pair) for pair in itertools.combinations(range(1, len(text)), 2)),
        list(range(1, len(text))),  # one character at a time
    ]
    for cut in cuts:
        bounds = [0, *cut, len(text)]
        pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
        assert streamed(parser, pieces) == (reasoning, content), pieces


def test_a_stream_sends_reasoning_before_the_end_marker_arrives(parsers):
    stream = ReasoningStream(parsers["deepseek_r1"])
    assert stream.step("Let me") == ("Let me", None)
    assert stream.step(" see.</th") == (" see.", None)  # "</th" may begin the marker
    assert stream.step("ink>42") == (None, "42")
    assert stream.step("", finished=True) == (None, None)


def test_a_held_back_marker_start_is_released_when_it_turns_out_to_be_text(parsers):
    stream = ReasoningStream(parsers["qwen3"])
    assert stream.step("a <th") == (None, "a ")
    assert stream.step("e") == (None, "<the")
    assert stream.step("<", finished=True) == (None, "<")


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
def test_the_last_marker_token_says_whether_the_reasoning_ended(parsers, name):
    parser = parsers[name]
    start, end = parser.start_token_id, parser.end_token_id
    tokenizer = parser.tokenizer
    word = tokenizer.encode("answer", add_special_tokens=False)[0]
    assert (start, end) == tuple(tokenizer.encode(f"{START} {END}", add_special_tokens=False))
    assert parser.is_reasoning_end([word, end])
    assert parser.is_reasoning_end([start, word, end, word])
    assert not parser.is_reasoning_end([word, end, word, start])  # a new turn reopened it
    assert not parser.is_reasoning_end([word, start, word])
    assert not parser.is_reasoning_end([word])
    assert not parser.is_reasoning_end([])


@pytest.mark.parametrize("cls", [DeepSeekR1ReasoningParser, Qwen3ReasoningParser])
def test_special_marker_tokens_must_be_kept_in_the_text(cls):
    assert cls(think_tokenizer(special=True)).keeps_special_tokens
    assert not cls(think_tokenizer(special=False)).keeps_special_tokens


@pytest.mark.parametrize("missing", [START, END])
def test_a_tokenizer_without_a_marker_token_is_refused_naming_the_flag(missing):
    tokenizer = think_tokenizer(tags=tuple(t for t in (START, END) if t != missing))
    with pytest.raises(ValueError) as error:
        build_reasoning_parser("deepseek_r1", tokenizer)
    assert str(error.value).startswith("--reasoning-parser deepseek_r1:")
    assert repr(missing) in str(error.value)
