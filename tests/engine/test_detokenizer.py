"""IncrementalDetokenizer against the tokenizer's own batch decode, on SmolLM2's real vocabulary
(byte-level BPE: emoji and CJK characters span several tokens) and tiny hand-made ones."""

from __future__ import annotations

import random

import pytest
import tokenizers
from engine_output_helpers import load_smollm_tokenizer
from gguf_vocab_fixtures import write_sentencepiece_gguf
from tokenizers import decoders, models

from core.engine.detokenizer import IncrementalDetokenizer
from core.tokenizer import Tokenizer

MULTIBYTE_TEXT = "Hello 😀 world 日本語 🎉🎉 ok"
CHAT_TEXT = "<|im_start|>assistant\nHi 😀, 你好<|im_end|>"


@pytest.fixture(scope="module")
def smollm() -> Tokenizer:
    return load_smollm_tokenizer()


def _stream(tokenizer: Tokenizer, ids: list[int], **options) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, **options)
    return [detokenizer.decode_next(i) for i in ids] + [detokenizer.flush()]


def test_character_split_over_tokens_is_released_whole_by_the_token_completing_it(smollm):
    ids = smollm.encode(MULTIBYTE_TEXT, add_special_tokens=False)
    deltas = _stream(smollm, ids)
    # '😀' is the tokens 'ĠðŁĺ' + 'Ģ': the first completes nothing, the second all of it.
    emoji_end = smollm.convert_ids_to_tokens(ids).index("Ģ")
    assert deltas[emoji_end - 1 : emoji_end + 1] == ["", " 😀"]
    assert deltas.count("") >= 8  # the vocabulary really splits these characters
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == MULTIBYTE_TEXT


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_deltas_concatenate_to_batch_decode(smollm, skip_special_tokens):
    ids = smollm.encode(CHAT_TEXT, add_special_tokens=False)
    deltas = _stream(smollm, ids, skip_special_tokens=skip_special_tokens)
    expected = smollm.decode(ids, skip_special_tokens=skip_special_tokens)
    assert "".join(deltas) == expected
    assert expected == ("assistant\nHi 😀, 你好" if skip_special_tokens else CHAT_TEXT)


def test_flush_writes_a_cut_final_character_as_decode_does(smollm):
    ids = smollm.encode("Hi 😀", add_special_tokens=False)[:-1]  # drop the emoji's last byte
    deltas = _stream(smollm, ids)
    assert deltas[:-1] == ["Hi", ""]
    assert deltas[-1] == smollm.decode(ids)[len("Hi") :] == " \ufffd"


def test_random_ids_including_invalid_utf8_concatenate_to_decode(smollm):
    rng = random.Random(0)
    byte_tokens = smollm.encode("😀日本🎉", add_special_tokens=False)
    pool = [*byte_tokens, 0, 1, 2, *range(100, 400)]
    for _ in range(200):
        ids = [rng.choice(pool) for _ in range(rng.randrange(1, 12))]
        for skip in (True, False):
            joined = "".join(_stream(smollm, ids, skip_special_tokens=skip))
            assert joined == smollm.decode(ids, skip_special_tokens=skip), ids


def test_text_the_decoder_revises_is_kept_and_the_stream_goes_on(tmp_path):
    # Byte fallback decodes a run of byte tokens as a whole: 0x17 (a valid character, already
    # returned) and the invalid AD C4 C1 after it become four U+FFFD in a batch decode, which
    # DecodeStream reports as "Invalid prefix". The stream keeps '\x17' and restarts.
    spm = Tokenizer.from_gguf(write_sentencepiece_gguf(tmp_path / "spm.gguf"))
    ids = spm.encode("he", add_special_tokens=False)
    ids += [3 + byte for byte in (0x17, 0xAD, 0xC4, 0xC1)]  # <0x00> is id 3
    ids += spm.encode("d", add_special_tokens=False)[-1:]
    assert spm.convert_ids_to_tokens(ids)[-1] == "d"
    assert spm.decode(ids) == "he\ufffd\ufffd\ufffd\ufffdd"
    assert "".join(_stream(spm, ids, skip_special_tokens=False)) == "he\x17\ufffd\ufffd\ufffdd"


def _wordpiece_tokenizer() -> Tokenizer:
    """WordPiece joins tokens with spaces, so its decode puts one between special tokens."""
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "hello": 3, "world": 4, "##s": 5}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.decoder = decoders.WordPiece()
    backend.add_special_tokens(["[CLS]", "[SEP]"])
    return Tokenizer(backend, {}, {})


@pytest.mark.parametrize(
    ("skip_special_tokens", "spaces_between", "expected"),
    [
        (False, True, "[CLS] [SEP] hello worlds [SEP] [CLS]"),
        (False, False, "[CLS][SEP] hello worlds [SEP][CLS]"),
        (True, False, "hello worlds"),
    ],
)
def test_spaces_between_special_tokens(skip_special_tokens, spaces_between, expected):
    tokenizer = _wordpiece_tokenizer()
    ids = [1, 2, 3, 4, 5, 2, 1]
    deltas = _stream(
        tokenizer,
        ids,
        skip_special_tokens=skip_special_tokens,
        spaces_between_special_tokens=spaces_between,
    )
    assert "".join(deltas) == expected
    if spaces_between or skip_special_tokens:
        assert expected == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
