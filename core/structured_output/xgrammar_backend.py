"""The xgrammar backend: the vocabulary as xgrammar reads it, compilation, per-request Grammar.

xgrammar matches a grammar against the bytes each token id decodes to. It learns them from
a TokenizerInfo: every token spelled as the vocabulary stores it, plus the rule that turns
that spelling into bytes (the vocab type: GPT-2 byte-to-unicode for byte-level BPE, "▁" and
"<0xNN>" pieces for SentencePiece-style byte fallback). We build it from the
`tokenizers.Tokenizer` directly rather than through transformers (though xgrammar 0.2
imports transformers itself).

Compiling a grammar precomputes token masks against the whole vocabulary (milliseconds to
a second for large schemas); the compiler caches compiled grammars by their content, so a
schema seen before costs nothing. Compilation releases the GIL, which is what lets the
manager run it on threads beside the step loop.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import tokenizers
import torch
import xgrammar as xgr

from core.sampling_params import StructuredOutputsParams
from core.structured_output.bitmask import bitmask_words
from core.tokenizer import Tokenizer

__all__ = [
    "Grammar",
    "XgrammarBackend",
    "build_grammar",
    "build_tokenizer_info",
    "grammar_kind",
]

# Bounds the whitespace between JSON tokens: a small model can otherwise emit whitespace
# forever, which any_whitespace allows. 20 still fits pretty-printed JSON four levels deep
# at four spaces per level.
_MAX_JSON_WHITESPACE = 20

# Memory the compiler may keep for compiled grammars (its cache evicts beyond this).
_CACHE_LIMIT_BYTES = 512 * 2**20

# xgrammar's C++ errors start with "[hh:mm:ss] file.cc:line: " and maybe a failed check.
_XGRAMMAR_ERROR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


# --- the vocabulary ------------------------------------------------------------------------


def _gpt2_byte_to_char() -> list[str]:
    """GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves, the other
    bytes to code points from 256 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return [table[byte] for byte in range(256)]


_BYTE_TO_CHAR = _gpt2_byte_to_char()


def _decoder_types(node: Any) -> Iterator[str]:
    """The `type` of a decoder and of every decoder nested in it (Sequence decoders)."""
    if isinstance(node, dict):
        if isinstance(node.get("type"), str):
            yield node["type"]
        for value in node.values():
            yield from _decoder_types(value)
    elif isinstance(node, list):
        for item in node:
            yield from _decoder_types(item)


def _vocab_type(backend: tokenizers.Tokenizer) -> xgr.VocabType:
    """How pieces become bytes, read from the decoder that turns ids back into text."""
    types = set(_decoder_types(json.loads(backend.to_str()).get("decoder")))
    if "ByteLevel" in types:
        return xgr.VocabType.BYTE_LEVEL
    if types & {"ByteFallback", "Metaspace"}:
        return xgr.VocabType.BYTE_FALLBACK
    return xgr.VocabType.RAW


def _adds_prefix_space(backend: tokenizers.Tokenizer, vocab_type: xgr.VocabType) -> bool:
    """Whether encoding prepends a space: the first piece of "a" carries the space marker."""
    marker = {xgr.VocabType.BYTE_LEVEL: "Ġ", xgr.VocabType.BYTE_FALLBACK: "▁"}.get(vocab_type)
    tokens = backend.encode("a", add_special_tokens=False).tokens
    return marker is not None and bool(tokens) and tokens[0].startswith(marker)


def _encoded_vocab(
    backend: tokenizers.Tokenizer, vocab_size: int, vocab_type: xgr.VocabType
) -> list[str]:
    """Each id's piece, spelled in the vocabulary's encoding; "" for ids no grammar may emit.

    Special added tokens get "" (xgrammar never allows an empty piece): decoding skips
    them, so they cannot spell grammar text. Other added tokens stand for their content as
    plain text, which a byte-level vocabulary must spell in its byte alphabet.
    """
    encoded = [""] * vocab_size  # ids past the tokenizer's (model padding) stay ""
    for piece, token_id in backend.get_vocab(with_added_tokens=False).items():
        if token_id < vocab_size:
            encoded[token_id] = piece
    for token_id, added in backend.get_added_tokens_decoder().items():
        if token_id >= vocab_size:
            continue
        if added.special:
            encoded[token_id] = ""
        elif vocab_type == xgr.VocabType.BYTE_LEVEL:
            encoded[token_id] = "".join(_BYTE_TO_CHAR[b] for b in added.content.encode())
        else:
            encoded[token_id] = added.content
    return encoded


def build_tokenizer_info(
    tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Sequence[int]
) -> xgr.TokenizerInfo:
    """xgrammar's view of `tokenizer` for a model whose logits have `vocab_size` columns.

    Ids at or past the tokenizer's vocabulary (padding of the model's vocabulary) and
    special tokens are never allowed, except `stop_token_ids`, which a grammar allows once
    it is complete.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if not stop_token_ids:
        raise ValueError("stop_token_ids must not be empty: a grammar needs a token to end on")
    bad = [i for i in stop_token_ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"stop_token_ids must be in [0, vocab_size={vocab_size}), got {bad}")
    backend = tokenizer.backend_tokenizer
    vocab_type = _vocab_type(backend)
    return xgr.TokenizerInfo(
        _encoded_vocab(backend, vocab_size, vocab_type),
        vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=list(stop_token_ids),
        add_prefix_space=_adds_prefix_space(backend, vocab_type),
    )


# --- grammars ------------------------------------------------------------------------------


def _choice_ebnf(choices: Sequence[str]) -> str:
    """An EBNF grammar matching exactly one of `choices`. JSON string escapes are also
    EBNF string-literal escapes, so json.dumps quotes any text safely."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _json_schema_grammar(schema: str | dict) -> xgr.Grammar:
    return xgr.Grammar.from_json_schema(
        schema if isinstance(schema, str) else json.dumps(schema),
        max_whitespace_cnt=_MAX_JSON_WHITESPACE,
    )


def grammar_kind(params: StructuredOutputsParams) -> str:
    """The one field of `params` that is set (its __post_init__ guarantees exactly one)."""
    if params.json_object:
        return "json_object"
    return next(k for k in ("json", "regex", "choice", "grammar") if getattr(params, k) is not None)


def _grammar_of(params: StructuredOutputsParams, kind: str) -> xgr.Grammar:
    if kind == "json":
        return _json_schema_grammar(params.json)
    if kind == "json_object":
        return _json_schema_grammar('{"type": "object"}')
    if kind == "regex":
        return xgr.Grammar.from_regex(params.regex)
    if kind == "choice":
        return xgr.Grammar.from_ebnf(_choice_ebnf(params.choice))
    return xgr.Grammar.from_ebnf(params.grammar)


def build_grammar(params: StructuredOutputsParams) -> xgr.Grammar:
    """The grammar `params` asks for, not yet compiled against a vocabulary.

    json: a JSON schema (strict: no properties the schema does not name); json_object:
    any JSON object; regex: text the regex matches in full; choice: exactly one of the
    strings; grammar: EBNF (GBNF) whose start rule is `root`. Cheap (no vocabulary), so
    the frontend can call it to reject bad input early. Raises ValueError with the reason.
    """
    kind = grammar_kind(params)
    try:
        return _grammar_of(params, kind)
    except RuntimeError as e:  # xgrammar reports every parse error as a RuntimeError
        reason = _XGRAMMAR_ERROR_PREFIX.sub("", str(e).strip())
        raise ValueError(f"invalid structured_outputs.{kind}: {reason}") from e


class Grammar:
    """One request's position in its grammar: which tokens may come next.

    Used from one thread at a time (the engine core's step loop).
    """

    def __init__(self, compiled: xgr.CompiledGrammar, stop_token_ids: Sequence[int]) -> None:
        # Unlimited rollback: speculative drafts are accepted tentatively, then undone.
        self._matcher = xgr.GrammarMatcher(compiled, max_rollback_tokens=-1)
        self._stop_token_ids = frozenset(stop_token_ids)

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """Advance over `token_ids`; False at the first token the grammar does not allow
        (the tokens before it stay accepted). After termination only stop tokens are."""
        return self._advance(token_ids)[0] == len(token_ids)

    def validate_tokens(self, token_ids: Sequence[int]) -> list[int]:
        """The longest prefix of `token_ids` allowed from here; the state does not change."""
        num_valid, num_moved = self._advance(token_ids)
        self._rollback(num_moved)
        return list(token_ids[:num_valid])

    def fill_bitmasks(self, bitmask: torch.Tensor, row: int, drafts: Sequence[int]) -> int:
        """Fill rows row..row + len(drafts) with the allowed tokens before each draft and
        after the last; the state does not change. Returns the next free row. A draft the
        grammar refuses leaves the rows after it masked as at the refusal."""
        num_moved, refused = 0, False
        for i in range(len(drafts) + 1):
            self.fill_bitmask(bitmask, row + i)
            if i < len(drafts) and not refused:
                num_valid, moved = self._advance(drafts[i : i + 1])
                num_moved += moved
                refused = num_valid == 0
        self._rollback(num_moved)
        return row + len(drafts) + 1

    def _advance(self, token_ids: Sequence[int]) -> tuple[int, int]:
        """Accept tokens up to the first refused one: (how many were accepted, how many of
        them moved the matcher). A stop token after termination is accepted in place."""
        num_moved = 0
        for count, token_id in enumerate(token_ids):
            if self._matcher.is_terminated():
                if token_id not in self._stop_token_ids:
                    return count, num_moved
            elif self._matcher.accept_token(token_id):
                num_moved += 1
            else:
                return count, num_moved
        return len(token_ids), num_moved

    def _rollback(self, num_moved: int) -> None:
        if num_moved:
            self._matcher.rollback(num_moved)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (int32 [R, W] on the CPU).
        Once terminated, the grammar allows its stop tokens only."""
        if self._matcher.is_terminated():
            bitmask[row] = 0
            for token_id in self._stop_token_ids:
                word, bit = divmod(token_id, 32)
                bitmask[row, word] |= _int32_bit(bit)
        else:
            self._matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        """True once the grammar is complete and a stop token has been accepted."""
        return self._matcher.is_terminated()


def _int32_bit(bit: int) -> int:
    """The int32 value with only `bit` set (bit 31 is the sign bit)."""
    return -(2**31) if bit == 31 else 1 << bit


class XgrammarBackend:
    """Compiles structured-output params into Grammars for one tokenizer and model.

    `vocab_size` is the model's (the logits' width), which may exceed the tokenizer's;
    `stop_token_ids` defaults to the tokenizer's EOS. Thread-safe: `compile` may run on
    several threads at once.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        stop_token_ids: Sequence[int] | None = None,
        max_threads: int | None = None,
    ) -> None:
        if stop_token_ids is None:
            if tokenizer.eos_token_id is None:
                raise ValueError("the tokenizer has no EOS token; pass stop_token_ids")
            stop_token_ids = [tokenizer.eos_token_id]
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.tokenizer_info = build_tokenizer_info(tokenizer, vocab_size, self.stop_token_ids)
        self.compiler = xgr.GrammarCompiler(
            self.tokenizer_info,
            max_threads=max_threads or max(1, (os.cpu_count() or 2) // 2),
            cache_enabled=True,
            cache_limit_bytes=_CACHE_LIMIT_BYTES,
        )

    @property
    def words_per_row(self) -> int:
        """Int32 words in one bitmask row."""
        return bitmask_words(self.vocab_size)

    def compile(self, params: StructuredOutputsParams) -> Grammar:
        """A fresh Grammar at the start of what `params` describes; ValueError if invalid."""
        compiled = self.compiler.compile_grammar(build_grammar(params))
        return Grammar(compiled, self.stop_token_ids)

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """An int32 [num_rows, words_per_row] CPU tensor for `Grammar.fill_bitmask`."""
        return torch.zeros((num_rows, self.words_per_row), dtype=torch.int32)
