"""Tiny GGUF files holding only a tokenizer (and one dummy tensor), written with gguf.GGUFWriter.

Each vocabulary is small enough to reason about by hand, yet exercises what real files do:
control / unknown / user-defined / byte tokens, scores or merges, bos/eos flags.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType
from tokenizers.pre_tokenizers import ByteLevel

# SentencePiece pieces with their scores (higher merges first). Scores are distinct, so the
# merge order is unambiguous for both our tokenizer and transformers'.
SENTENCEPIECE_PIECES = {
    "▁the": -1.0,
    "▁hello": -1.5,
    "▁world": -2.0,
    "he": -2.5,
    "▁t": -3.0,
    "ll": -3.5,
    "llo": -4.0,
    "▁h": -4.5,
    "▁he": -4.7,
    "▁w": -5.0,
    "or": -5.5,
    "ld": -6.0,
    "▁wor": -6.5,
    "ab": -7.0,
    "abc": -7.5,
    "▁abc": -8.0,
    "日本": -8.5,
    "▁caf": -9.0,
    "▁": -10.0,
    **{c: -11.0 - i * 0.1 for i, c in enumerate("abcdefhlortwé日本")},
}
SENTENCEPIECE_USER_TOKEN = "<tool>"

# Byte-level merges, in rank order, over GPT-2's 256-character byte alphabet.
BYTE_LEVEL_MERGES = ["Ġ t", "h e", "Ġt he", "1 2", "12 3", "Ġ Ġ", "Ċ Ċ", "' s", "l l", "ll o"]
BYTE_LEVEL_CONTROL_TOKEN = "<|endoftext|>"
BYTE_LEVEL_USER_TOKEN = "<think>"

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def _start(path: Path, chat_template: str | list[dict[str, str]] | None) -> GGUFWriter:
    writer = GGUFWriter(str(path), arch="llama")
    writer.add_block_count(1)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    return writer


def _finish(writer: GGUFWriter) -> None:
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_sentencepiece_gguf(
    path: Path,
    *,
    add_bos: bool | None = True,
    add_eos: bool = False,
    add_space_prefix: bool | None = None,
    chat_template: str | list[dict[str, str]] | None = CHAT_TEMPLATE,
) -> Path:
    """A "llama" (SentencePiece) vocabulary: <unk>, <s>, </s>, <0x00>..<0xFF>, scored pieces
    and one user-defined token. A flag set to None is left out of the file."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    scores = [0.0] * len(tokens)
    tokens += [*SENTENCEPIECE_PIECES, SENTENCEPIECE_USER_TOKEN]
    types += [TokenType.NORMAL] * len(SENTENCEPIECE_PIECES) + [TokenType.USER_DEFINED]
    scores += [*SENTENCEPIECE_PIECES.values(), 0.0]
    writer = _start(path, chat_template)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    _finish(writer)
    return path


def write_byte_level_gguf(
    path: Path,
    pre: str,
    *,
    chat_template: str | list[dict[str, str]] | None = CHAT_TEMPLATE,
) -> Path:
    """A "gpt2" (byte-level BPE) vocabulary: the byte alphabet, BYTE_LEVEL_MERGES' results,
    a control token (bos = eos) and a user-defined token; split by `pre`."""
    tokens = sorted(ByteLevel.alphabet())
    tokens += [merge.replace(" ", "") for merge in BYTE_LEVEL_MERGES]
    types = [TokenType.NORMAL] * len(tokens) + [TokenType.CONTROL, TokenType.USER_DEFINED]
    tokens += [BYTE_LEVEL_CONTROL_TOKEN, BYTE_LEVEL_USER_TOKEN]
    writer = _start(path, chat_template)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(BYTE_LEVEL_MERGES)
    control_id = tokens.index(BYTE_LEVEL_CONTROL_TOKEN)
    writer.add_bos_token_id(control_id)
    writer.add_eos_token_id(control_id)
    writer.add_add_bos_token(False)
    _finish(writer)
    return path
