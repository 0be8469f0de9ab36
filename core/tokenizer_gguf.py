"""A GGUF file's vocabulary -> a `tokenizers.Tokenizer`, as llama.cpp would tokenize.

`tokenizer.ggml.model` "gpt2" is byte-level BPE split by the `tokenizer.ggml.pre` rules;
"llama" is SentencePiece-style BPE (merges ranked by piece score) with byte fallback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers
from gguf import TokenType
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

__all__ = ["gguf_backend_tokenizer", "gguf_chat_templates"]

# The metadata key of each named special token, as `tokenizer.ggml.<key>`.
_SPECIAL_TOKEN_KEYS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def gguf_backend_tokenizer(
    metadata: Mapping[str, Any], path: Path
) -> tuple[tokenizers.Tokenizer, dict[str, str | None]]:
    """The tokenizer the GGUF `metadata` of the file `path` describes, and its special tokens
    (bos_token, eos_token, unk_token, pad_token -> token string or None).

    Control and user-defined tokens match whole in text; bos/eos are added as the file's
    `add_bos_token` / `add_eos_token` say (by default bos for "llama" only, as llama.cpp).
    Raises ValueError naming `path` and the key for a missing, unsupported or bad vocabulary.
    """
    kind = metadata.get("tokenizer.ggml.model")
    if kind is None or "tokenizer.ggml.tokens" not in metadata:
        raise ValueError(f"{path} has no tokenizer.ggml.model / tokenizer.ggml.tokens")
    if kind == "gpt2":
        backend = _byte_level_bpe(metadata, path)
    elif kind == "llama":
        backend = _sentencepiece_bpe(metadata, path)
    else:
        raise ValueError(f"{path}: tokenizer.ggml.model {kind!r} is not supported")
    special_tokens = _gguf_special_tokens(metadata, backend, path)
    named = [t for t in special_tokens.values() if t is not None]
    _add_gguf_added_tokens(backend, metadata, named)
    # llama.cpp adds bos by default for SentencePiece vocabularies only.
    add_bos = metadata.get("tokenizer.ggml.add_bos_token", kind == "llama")
    add_eos = metadata.get("tokenizer.ggml.add_eos_token", False)
    backend.post_processor = _bos_eos_processor(
        backend,
        special_tokens["bos_token"] if add_bos else None,
        special_tokens["eos_token"] if add_eos else None,
    )
    return backend, special_tokens


def gguf_chat_templates(metadata: Mapping[str, Any]) -> dict[str, str]:
    """`tokenizer.chat_template` as "default", plus `tokenizer.chat_template.<name>` ones."""
    prefix = "tokenizer.chat_template."
    templates = {k.removeprefix(prefix): v for k, v in metadata.items() if k.startswith(prefix)}
    if "tokenizer.chat_template" in metadata:
        templates["default"] = metadata["tokenizer.chat_template"]
    return templates


# Byte-level pre-tokenizers by `tokenizer.ggml.pre`, as llama.cpp splits text for each.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_split() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2_split() -> pre_tokenizers.PreTokenizer:
    # Every digit is its own word, then GPT-2's regex: llama.cpp's rule for these vocabularies
    # and the pre-tokenizer of SmolLM2's own tokenizer.json.
    digits = pre_tokenizers.Digits(individual_digits=True)
    return pre_tokenizers.Sequence([digits, _gpt2_split()])


def _regex_split(pattern: str) -> pre_tokenizers.PreTokenizer:
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return pre_tokenizers.Sequence([split, byte_level])


_BYTE_LEVEL_PRE_TOKENIZERS = {
    "gpt2": _gpt2_split,
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell"), _digits_then_gpt2_split),
    **dict.fromkeys(("llama-bpe", "llama3", "smaug-bpe"), lambda: _regex_split(_LLAMA3_SPLIT)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), lambda: _regex_split(_QWEN2_SPLIT)),
}


def _byte_level_bpe(metadata: Mapping[str, Any], path: Path) -> tokenizers.Tokenizer:
    pre = metadata.get("tokenizer.ggml.pre")
    if pre not in _BYTE_LEVEL_PRE_TOKENIZERS:
        supported = sorted(_BYTE_LEVEL_PRE_TOKENIZERS)
        raise ValueError(f"{path}: tokenizer.ggml.pre {pre!r} is not supported ({supported})")
    tokens, _ = _gguf_tokens(metadata)
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = [_split_merge(merge, path) for merge in metadata.get("tokenizer.ggml.merges", [])]
    backend = tokenizers.Tokenizer(models.BPE(vocab, merges))
    backend.pre_tokenizer = _BYTE_LEVEL_PRE_TOKENIZERS[pre]()
    backend.decoder = decoders.ByteLevel()
    return backend


def _split_merge(merge: str, path: Path) -> tuple[str, str]:
    parts = merge.split(" ")
    if len(parts) != 2:
        raise ValueError(f"{path}: tokenizer.ggml.merges entry {merge!r} is not 'left right'")
    return parts[0], parts[1]


def _sentencepiece_bpe(metadata: Mapping[str, Any], path: Path) -> tokenizers.Tokenizer:
    """SentencePiece-style BPE: merges ranked by piece score, unknown bytes as <0xXX> tokens."""
    tokens, token_types = _gguf_tokens(metadata)
    scores = metadata.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise ValueError(f"{path}: tokenizer.ggml.scores is missing or not one score per token")
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    if unk_id is not None and not 0 <= unk_id < len(tokens):
        raise ValueError(
            f"{path}: tokenizer.ggml.unknown_token_id {unk_id} is outside the vocabulary"
        )
    model = models.BPE(
        {token: i for i, token in enumerate(tokens)},
        _merges_from_scores(tokens, token_types, scores),
        unk_token=None if unk_id is None else tokens[unk_id],
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = tokenizers.Tokenizer(model)
    add_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    prepend = "first" if add_prefix else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme=prepend, split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _merges_from_scores(
    tokens: Sequence[str], token_types: Sequence[int], scores: Sequence[float]
) -> list[tuple[str, str]]:
    """Merges equivalent to SentencePiece BPE, which joins the adjacent pair whose union is the
    best-scoring piece. A tokenizers BPE applies the best-ranked merge first, so every split
    (left, right) of a piece ranks by that piece's score, best first (ties: lower id first).
    Control, byte and unknown tokens are never formed by merging."""
    mergeable = {
        token: i
        for i, (token, kind) in enumerate(zip(tokens, token_types, strict=True))
        if kind in (TokenType.NORMAL, TokenType.USER_DEFINED)
    }
    ranked = [
        (-scores[i], i, piece[:cut], piece[cut:])
        for piece, i in mergeable.items()
        for cut in range(1, len(piece))
        if piece[:cut] in mergeable and piece[cut:] in mergeable
    ]
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


def _gguf_tokens(metadata: Mapping[str, Any]) -> tuple[list[str], list[int]]:
    """The vocabulary and each token's gguf.TokenType (all NORMAL when the file has none)."""
    tokens = metadata["tokenizer.ggml.tokens"]
    token_types = metadata.get("tokenizer.ggml.token_type") or [TokenType.NORMAL] * len(tokens)
    if len(token_types) != len(tokens):
        raise ValueError("GGUF tokenizer.ggml.token_type does not have one type per token")
    return tokens, token_types


def _gguf_special_tokens(
    metadata: Mapping[str, Any], backend: tokenizers.Tokenizer, path: Path
) -> dict[str, str | None]:
    """bos/eos/unk/pad token strings from their `tokenizer.ggml.*_token_id` keys."""
    specials: dict[str, str | None] = {}
    for name, key in _SPECIAL_TOKEN_KEYS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        token = None if token_id is None else backend.id_to_token(token_id)
        if token_id is not None and token is None:
            raise ValueError(f"{path}: tokenizer.ggml.{key} {token_id} is outside the vocabulary")
        specials[name] = token
    return specials


def _add_gguf_added_tokens(
    backend: tokenizers.Tokenizer, metadata: Mapping[str, Any], named: Sequence[str]
) -> None:
    """Control and unknown tokens (and the named bos/eos/unk/pad) become special tokens,
    user-defined ones plain added tokens: either way text containing them maps to them whole."""
    tokens, token_types = _gguf_tokens(metadata)
    special_kinds = (TokenType.CONTROL, TokenType.UNKNOWN)
    special = [t for t, kind in zip(tokens, token_types, strict=True) if kind in special_kinds]
    special += [t for t in named if t not in special]
    user = [t for t, k in zip(tokens, token_types, strict=True) if k == TokenType.USER_DEFINED]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])


def _bos_eos_processor(
    backend: tokenizers.Tokenizer, bos: str | None, eos: str | None
) -> processors.PostProcessor | None:
    """Adds bos before / eos after each sequence; None when neither is added."""
    prefix, suffix = [bos] if bos else [], [eos] if eos else []
    if not prefix and not suffix:
        return None
    return processors.TemplateProcessing(
        single=[*prefix, "$A", *suffix],
        pair=[*prefix, "$A", *suffix, *prefix, "$B:1", *suffix],
        special_tokens=[(t, backend.token_to_id(t)) for t in {*prefix, *suffix}],
    )
