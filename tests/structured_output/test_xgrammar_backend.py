"""The xgrammar backend on the real SmolLM2 vocabulary: what a greedy fake model produces
under each kind of constraint, the vocabulary xgrammar sees, and compile errors."""

from __future__ import annotations

import importlib.util
import json
import re
import time
from pathlib import Path

import pytest
from gguf_vocab_fixtures import write_sentencepiece_gguf
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer
from xgrammar import VocabType

from core.sampling_params import StructuredOutputsParams
from core.structured_output.xgrammar_backend import (
    Grammar,
    XgrammarBackend,
    build_grammar,
    build_tokenizer_info,
)
from core.tokenizer import Tokenizer
from core.worker.grammar_bitmask import allowed_token_mask

SEEDS = range(4)

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
}


def _allowed_ids(grammar: Grammar, backend: XgrammarBackend) -> set[int]:
    bitmask = backend.allocate_bitmask(1)
    grammar.fill_bitmask(bitmask, 0)
    return set(allowed_token_mask(bitmask, backend.vocab_size)[0].nonzero().flatten().tolist())


# --- the fake model under each constraint --------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_regex_output_matches_the_regex(smollm2_backend, decode_text, seed):
    regex = r"[A-Z][a-z]{1,6}-\d{2,4}( [a-z]+)?"
    text = decode_text(smollm2_backend.compile(StructuredOutputsParams(regex=regex)), seed)
    assert re.fullmatch(regex, text), text


def test_choice_output_is_one_of_the_choices(smollm2_backend, decode_text):
    # Quotes, backslashes, newlines and non-ASCII must survive the choice -> EBNF quoting.
    choices = ['say "hi"', "back\\slash", "two\nlines", "日本", "café", "ca"]
    params = StructuredOutputsParams(choice=choices)
    texts = [decode_text(smollm2_backend.compile(params), seed) for seed in range(8)]
    assert set(texts) <= set(choices)
    assert len(set(texts)) > 1  # the fake model really chooses


@pytest.mark.parametrize("as_text", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_json_schema_output_validates_against_the_schema(
    smollm2_backend, decode_text, seed, as_text
):
    schema = json.dumps(PERSON_SCHEMA) if as_text else PERSON_SCHEMA
    text = decode_text(smollm2_backend.compile(StructuredOutputsParams(json=schema)), seed)
    value = json.loads(text)
    _assert_person(value)
    if importlib.util.find_spec("jsonschema") is not None:
        import jsonschema

        jsonschema.validate(value, PERSON_SCHEMA)


def _assert_person(value: object) -> None:
    """PERSON_SCHEMA checked by hand, strict: no properties beyond the schema's."""
    assert isinstance(value, dict) and set(value) == {"name", "age", "tags", "ok"}
    assert isinstance(value["name"], str) and 1 <= len(value["name"]) <= 8
    assert type(value["age"]) is int and 0 <= value["age"] <= 120
    assert isinstance(value["tags"], list) and len(value["tags"]) <= 3
    assert set(value["tags"]) <= {"x", "y"}
    assert type(value["ok"]) is bool


@pytest.mark.parametrize("seed", SEEDS)
def test_json_object_output_parses_as_an_object(smollm2_backend, decode_text, seed):
    text = decode_text(smollm2_backend.compile(StructuredOutputsParams(json_object=True)), seed)
    assert isinstance(json.loads(text), dict), text


def test_json_object_rejects_a_top_level_array(smollm2_backend, smollm2_tokenizer):
    grammar = smollm2_backend.compile(StructuredOutputsParams(json_object=True))
    bracket = smollm2_tokenizer.encode("[", add_special_tokens=False)
    assert not grammar.accept_tokens(bracket)


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += 1 if char == "(" else -1
        if depth < 0:
            return False
    return depth == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_ebnf_grammar_output_is_in_the_language(smollm2_backend, decode_text, seed):
    # Non-empty balanced parentheses: not a regular language, so only the EBNF path can do it.
    grammar = 'root ::= "(" inner ")"\ninner ::= ("(" inner ")")*'
    text = decode_text(smollm2_backend.compile(StructuredOutputsParams(grammar=grammar)), seed)
    assert text and set(text) <= {"(", ")"} and _balanced(text), text


# --- Grammar --------------------------------------------------------------------------------


def test_terminated_grammar_allows_only_eos(smollm2_backend, smollm2_tokenizer):
    eos = smollm2_tokenizer.eos_token_id
    grammar = smollm2_backend.compile(StructuredOutputsParams(regex="ab"))
    assert grammar.accept_tokens(smollm2_tokenizer.encode("ab", add_special_tokens=False))
    assert eos in _allowed_ids(grammar, smollm2_backend)
    assert not grammar.is_terminated()
    assert grammar.accept_tokens([eos])
    assert grammar.is_terminated()
    assert _allowed_ids(grammar, smollm2_backend) == {eos}
    assert grammar.accept_tokens([eos])
    assert not grammar.accept_tokens(smollm2_tokenizer.encode("a", add_special_tokens=False))


def test_terminated_grammar_allows_each_stop_token(smollm2_tokenizer):
    # 63 sits at bit 31 of word 1: the int32 sign bit.
    backend = XgrammarBackend(smollm2_tokenizer, 49152, stop_token_ids=[2, 63])
    grammar = backend.compile(StructuredOutputsParams(regex="a"))
    grammar.accept_tokens([*smollm2_tokenizer.encode("a", add_special_tokens=False), 63])
    assert grammar.is_terminated()
    assert _allowed_ids(grammar, backend) == {2, 63}


def test_accept_tokens_rejects_a_token_the_grammar_does_not_allow(
    smollm2_backend, smollm2_tokenizer
):
    grammar = smollm2_backend.compile(StructuredOutputsParams(regex="abc"))
    (token_a,) = smollm2_tokenizer.encode("a", add_special_tokens=False)
    (token_z,) = smollm2_tokenizer.encode("z", add_special_tokens=False)
    assert token_z not in _allowed_ids(grammar, smollm2_backend)
    assert not grammar.accept_tokens([token_a, token_z])
    assert grammar.accept_tokens(smollm2_tokenizer.encode("bc", add_special_tokens=False))


def test_eos_is_allowed_only_once_the_grammar_is_complete(smollm2_backend, smollm2_tokenizer):
    eos = smollm2_tokenizer.eos_token_id
    grammar = smollm2_backend.compile(StructuredOutputsParams(regex="a+"))
    assert eos not in _allowed_ids(grammar, smollm2_backend)
    grammar.accept_tokens(smollm2_tokenizer.encode("a", add_special_tokens=False))
    assert eos in _allowed_ids(grammar, smollm2_backend)


# --- the vocabulary xgrammar sees -----------------------------------------------------------


def test_smollm2_vocabulary_is_byte_level_with_specials_never_allowed(
    smollm2_backend, smollm2_tokenizer
):
    info = smollm2_backend.tokenizer_info
    assert info.vocab_type == VocabType.BYTE_LEVEL
    assert info.vocab_size == 49152 and info.stop_token_ids == [smollm2_tokenizer.eos_token_id]
    decoded = info.decoded_vocab
    for text in [" the", "\n", " {"]:
        (token_id,) = smollm2_tokenizer.encode(text, add_special_tokens=False)
        assert decoded[token_id] == text.encode()
    im_start = smollm2_tokenizer.backend_tokenizer.token_to_id("<|im_start|>")
    assert decoded[im_start] == b"" and im_start in info.special_token_ids
    # "<|im_start|>" is not grammar text even where any text is allowed.
    anything = smollm2_backend.compile(StructuredOutputsParams(regex="(.|\n)*"))
    assert im_start not in _allowed_ids(anything, smollm2_backend)


def test_model_vocab_padding_is_never_allowed(smollm2_tokenizer):
    backend = XgrammarBackend(smollm2_tokenizer, 49152 + 40)
    assert backend.words_per_row == 1538
    grammar = backend.compile(StructuredOutputsParams(regex="(.|\n)*"))
    allowed = _allowed_ids(grammar, backend)
    assert not allowed & set(range(49152, 49152 + 40))
    assert len(allowed) > 40000


def test_sentencepiece_vocabulary_is_byte_fallback(tmp_path: Path):
    tokenizer = Tokenizer.from_gguf(
        write_sentencepiece_gguf(tmp_path / "sp.gguf", add_space_prefix=True)
    )
    info = build_tokenizer_info(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id])
    assert info.vocab_type == VocabType.BYTE_FALLBACK
    assert info.add_prefix_space
    backend = tokenizer.backend_tokenizer
    decoded = info.decoded_vocab
    assert decoded[backend.token_to_id("▁hello")] == b" hello"
    assert decoded[backend.token_to_id("<0x0A>")] == b"\n"
    assert decoded[backend.token_to_id("<tool>")] == b"<tool>"  # user-defined: plain text
    assert decoded[backend.token_to_id("<s>")] == b""  # control token: never text


def test_byte_level_added_tokens_decode_to_their_content():
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    model = models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[])
    backend = BackendTokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens([AddedToken("café", special=False)])
    backend.add_special_tokens([AddedToken("<|end|>", special=True)])
    tokenizer = Tokenizer(backend, {"eos_token": "<|end|>"}, {})
    info = build_tokenizer_info(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id])
    assert info.vocab_type == VocabType.BYTE_LEVEL
    assert info.decoded_vocab[backend.token_to_id("café")] == "café".encode()
    assert info.decoded_vocab[backend.token_to_id("Ġ")] == b" "


def test_tokenizer_info_needs_a_stop_token(smollm2_tokenizer):
    with pytest.raises(ValueError, match="stop_token_ids"):
        build_tokenizer_info(smollm2_tokenizer, 49152, [])
    with pytest.raises(ValueError, match="stop_token_ids"):
        build_tokenizer_info(smollm2_tokenizer, 49152, [49152])


# --- compilation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (StructuredOutputsParams(regex="(abc"), r"regex: .*parenthesis is not closed"),
        (StructuredOutputsParams(grammar="root ::= foo"), r'grammar: .*"foo" is not defined'),
        (StructuredOutputsParams(grammar="start ::= 'a'"), r"grammar: "),
        (StructuredOutputsParams(json="[1, 2]"), r"json: Schema should be an object or bool"),
        (StructuredOutputsParams(json={"type": "bogus"}), r'json: Unsupported type "bogus"'),
    ],
)
def test_bad_input_raises_value_error_with_the_reason(smollm2_backend, params, message):
    with pytest.raises(ValueError, match=rf"^invalid structured_outputs\.{message}"):
        build_grammar(params)
    with pytest.raises(ValueError, match=rf"^invalid structured_outputs\.{message}"):
        smollm2_backend.compile(params)


def test_small_schema_compiles_well_under_a_second(smollm2_backend):
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "q": {"type": "string"}}}
    start = time.perf_counter()
    smollm2_backend.compile(StructuredOutputsParams(json=schema))
    assert time.perf_counter() - start < 0.5


def test_recompiling_the_same_schema_hits_the_compiler_cache(smollm2_backend):
    params = StructuredOutputsParams(json={"type": "array", "items": {"type": "number"}})
    smollm2_backend.compile(params)
    cached = smollm2_backend.compiler.get_cache_size_bytes()
    first, second = smollm2_backend.compile(params), smollm2_backend.compile(params)
    assert smollm2_backend.compiler.get_cache_size_bytes() == cached
    assert first is not second  # a compiled grammar is shared, a Grammar is per request


def test_grammars_of_one_compile_advance_independently(smollm2_backend, smollm2_tokenizer):
    params = StructuredOutputsParams(choice=["ab", "cd"])
    first, second = smollm2_backend.compile(params), smollm2_backend.compile(params)
    assert first.accept_tokens(smollm2_tokenizer.encode("ab", add_special_tokens=False))
    assert second.accept_tokens(smollm2_tokenizer.encode("cd", add_special_tokens=False))


# --- speculative drafts: rows per draft position, state untouched ------------------------


def _person_prefix(tokenizer) -> list[int]:
    return tokenizer.encode('{"name": "Al", "age": 4', add_special_tokens=False)


def test_validate_tokens_keeps_the_longest_allowed_prefix_and_does_not_move(
    smollm2_backend, smollm2_tokenizer
):
    grammar = smollm2_backend.compile(StructuredOutputsParams(json=PERSON_SCHEMA))
    good = _person_prefix(smollm2_tokenizer)
    bad = smollm2_tokenizer.encode("]]", add_special_tokens=False)
    before = _allowed_ids(grammar, smollm2_backend)
    assert grammar.validate_tokens(good + bad + good) == good
    assert _allowed_ids(grammar, smollm2_backend) == before  # rolled back
    assert grammar.accept_tokens(good)  # and still at the start


def test_fill_bitmasks_gives_each_draft_position_the_mask_stepping_would(
    smollm2_backend, smollm2_tokenizer
):
    drafts = _person_prefix(smollm2_tokenizer)
    grammar = smollm2_backend.compile(StructuredOutputsParams(json=PERSON_SCHEMA))
    stepped = smollm2_backend.compile(StructuredOutputsParams(json=PERSON_SCHEMA))
    bitmask = smollm2_backend.allocate_bitmask(len(drafts) + 2)
    assert grammar.fill_bitmasks(bitmask, 1, drafts) == len(drafts) + 2
    allowed = allowed_token_mask(bitmask, smollm2_backend.vocab_size)
    for i, token_id in enumerate([*drafts, None]):
        expected = _allowed_ids(stepped, smollm2_backend)
        assert set(allowed[1 + i].nonzero().flatten().tolist()) == expected, i
        if token_id is not None:
            assert stepped.accept_tokens([token_id])
    # The grammar itself is where it was: the first draft is still what it allows.
    assert _allowed_ids(grammar, smollm2_backend) == set(allowed[1].nonzero().flatten().tolist())
