"""The engine's tokenizer: text <-> token ids, chat templates and generation defaults.

A `Tokenizer` wraps a `tokenizers.Tokenizer`, built either from a Hugging Face directory
(tokenizer.json) or from the vocabulary a GGUF file stores in its metadata. Chat templates
come from model files, so they are untrusted code: they render in jinja2's immutable
sandbox, with the few helpers Hugging Face templates expect.
"""

from __future__ import annotations

import functools
import json
import mmap
import struct
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import numpy as np
import tokenizers
from gguf import GGUF_MAGIC, GGUFReader, GGUFValueType, TokenType
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

__all__ = ["Tokenizer", "load_chat_template", "load_generation_defaults"]

_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")

# --- GGUF metadata -------------------------------------------------------------------------
# gguf.GGUFReader builds numpy views for every array element and every tensor: about 6 s for
# SmolLM2's 49k-token vocabulary. The tokenizer needs only the key/value header, read here
# sequentially in well under a second.

_GGUF_VERSIONS = (2, 3)


def _read_gguf_metadata(path: Path) -> dict[str, Any]:
    """Every metadata key of a little-endian GGUF v2/v3 file; arrays come back as lists.

    Raises ValueError naming the file when it is missing, not GGUF, or truncated.
    """
    if not path.is_file():
        raise ValueError(f"GGUF file {path} does not exist")
    with open(path, "rb") as file:
        if file.read(4) != struct.pack("<I", GGUF_MAGIC):
            raise ValueError(f"{path} is not a GGUF file (bad magic bytes)")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return _read_gguf_header(buf, path)
            except (struct.error, UnicodeDecodeError) as e:
                raise ValueError(f"{path} has a truncated or corrupt GGUF header: {e}") from e


def _read_gguf_header(buf: mmap.mmap, path: Path) -> dict[str, Any]:
    version, _num_tensors, num_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in _GGUF_VERSIONS:
        raise ValueError(f"{path} is GGUF version {version}; supported: {_GGUF_VERSIONS}")
    metadata: dict[str, Any] = {}
    pos = 24
    for _ in range(num_kv):
        key, pos = _read_gguf_string(buf, pos)
        (value_type,) = struct.unpack_from("<I", buf, pos)
        metadata[key], pos = _read_gguf_value(buf, pos + 4, value_type, key)
    return metadata


def _read_gguf_string(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, pos)
    end = pos + 8 + length
    if end > len(buf):
        raise struct.error("string runs past the end of the file")
    return buf[pos + 8 : end].decode("utf-8"), end


def _read_gguf_value(buf: mmap.mmap, pos: int, value_type: int, key: str) -> tuple[Any, int]:
    if value_type == GGUFValueType.STRING:
        return _read_gguf_string(buf, pos)
    if value_type == GGUFValueType.ARRAY:
        item_type, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item_type == GGUFValueType.STRING:
            items = []
            for _ in range(count):
                item, pos = _read_gguf_string(buf, pos)
                items.append(item)
            return items, pos
        return _read_gguf_numbers(buf, pos, item_type, count, key)
    (value,), pos = _read_gguf_numbers(buf, pos, value_type, 1, key)
    return value, pos


def _read_gguf_numbers(
    buf: mmap.mmap, pos: int, value_type: int, count: int, key: str
) -> tuple[list[Any], int]:
    if value_type not in GGUFReader.gguf_scalar_to_np:
        raise ValueError(f"GGUF metadata {key!r} has unsupported value type {value_type}")
    dtype = np.dtype(GGUFReader.gguf_scalar_to_np[value_type]).newbyteorder("<")
    end = pos + count * dtype.itemsize
    if end > len(buf):
        raise struct.error(f"{key} runs past the end of the file")
    return np.frombuffer(buf, dtype, count, pos).tolist(), end


# --- GGUF vocabulary -> tokenizers ---------------------------------------------------------

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
    keys = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")
    specials: dict[str, str | None] = {}
    for name, key in zip(_SPECIAL_TOKEN_NAMES, keys, strict=True):
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


def _gguf_chat_templates(metadata: Mapping[str, Any]) -> dict[str, str]:
    """`tokenizer.chat_template` as "default", plus `tokenizer.chat_template.<name>` ones."""
    prefix = "tokenizer.chat_template."
    templates = {k.removeprefix(prefix): v for k, v in metadata.items() if k.startswith(prefix)}
    if "tokenizer.chat_template" in metadata:
        templates["default"] = metadata["tokenizer.chat_template"]
    return templates


# --- Hugging Face directory ----------------------------------------------------------------


def _read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} when there is no such file."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read JSON file {path}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _token_content(value: Any, field: str) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"tokenizer config field {field!r} is not a token string: {value!r}")


def _named_templates(value: Any, source: Path) -> dict[str, str]:
    """A chat_template value: one template string, or a list of {"name", "template"} dicts."""
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list) and all(
        isinstance(t, Mapping)
        and isinstance(t.get("name"), str)
        and isinstance(t.get("template"), str)
        for t in value
    ):
        return {t["name"]: t["template"] for t in value}
    raise ValueError(f"{source}: chat_template is neither a string nor a list of named templates")


def _dir_chat_templates(directory: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """chat_template.jinja, else chat_template.json, else tokenizer_config.json's template."""
    jinja_file, json_file = directory / "chat_template.jinja", directory / "chat_template.json"
    if jinja_file.is_file():
        return {"default": jinja_file.read_text(encoding="utf-8")}
    if json_file.is_file():
        return _named_templates(_read_json_object(json_file).get("chat_template"), json_file)
    if config.get("chat_template") is not None:
        return _named_templates(config["chat_template"], directory / "tokenizer_config.json")
    return {}


# --- chat templates ------------------------------------------------------------------------


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant turns for training masks in
    Hugging Face templates; serving needs only the text, so the block renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes and sorts keys; templates are written for json.dumps.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(date_format: str) -> str:
    return datetime.now().strftime(date_format)


@functools.lru_cache(maxsize=1)
def _template_environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=32)
def _compile_chat_template(source: str) -> jinja2.Template:
    try:
        return _template_environment().from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat template has a syntax error at line {e.lineno}: {e}") from e


def _plain_data(value: Any, where: str) -> Any:
    """A copy made of JSON types only, so a template cannot reach methods of richer objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain_data(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_data(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ValueError(f"{where} is a {type(value).__name__}; template inputs must be JSON data")


def _template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    # Keys set to None are dropped, as Hugging Face does: templates test `'key' in message`
    # and would otherwise render a literal "None" (e.g. OpenAI's content=None with tool_calls).
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{i}] is a {type(message).__name__}, not a dict")
    return [
        {k: _plain_data(v, f"messages[{i}].{k}") for k, v in m.items() if v is not None}
        for i, m in enumerate(messages)
    ]


def load_chat_template(path_or_string: str | Path) -> str:
    """A chat template from a file path, or the string itself when it is a template.

    A template always contains '{', '}' or a newline, so a string without any is a path; a
    path that names no file raises ValueError naming it.
    """
    text = str(path_or_string)
    if any(c in text for c in "{}\n"):
        return text
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"chat template file {text!r} does not exist")
    return path.read_text(encoding="utf-8")


# --- generation defaults -------------------------------------------------------------------

_GENERATION_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty")
_GENERATION_INTS = ("top_k", "max_new_tokens")


def load_generation_defaults(model_dir: str | Path) -> dict[str, Any]:
    """Sampling defaults from `<model_dir>/generation_config.json`: only the keys it sets among
    temperature, top_p, min_p, repetition_penalty (float), top_k, max_new_tokens (int) and
    eos_token_id (always a list of ints). No file -> {}; a bad value -> ValueError naming it."""
    directory = Path(model_dir)
    if not directory.is_dir():
        raise ValueError(f"model directory {directory} does not exist")
    path = directory / "generation_config.json"
    config = _read_json_object(path)
    defaults: dict[str, Any] = {}
    for key in (*_GENERATION_FLOATS, *_GENERATION_INTS, "eos_token_id"):
        if config.get(key) is not None:
            defaults[key] = _generation_value(key, config[key], path)
    return defaults


def _generation_value(key: str, value: Any, path: Path) -> Any:
    if key == "eos_token_id":
        ids = value if isinstance(value, list) else [value]
        if not all(type(i) is int for i in ids):
            raise ValueError(
                f"{path}: eos_token_id must be an int or a list of ints, got {value!r}"
            )
        return ids
    if key in _GENERATION_INTS and type(value) is int:
        return value
    if key in _GENERATION_FLOATS and type(value) in (int, float):
        return float(value)
    raise ValueError(f"{path}: {key} has the wrong type: {value!r}")


# --- the tokenizer -------------------------------------------------------------------------


class Tokenizer:
    """Text <-> ids over a `tokenizers.Tokenizer`, with named special tokens and chat templates.

    Special tokens written in the text (e.g. "<|im_start|>") always encode to their single id.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        special_tokens: Mapping[str, str | None],
        chat_templates: Mapping[str, str],
    ) -> None:
        """`special_tokens` maps bos_token/eos_token/unk_token/pad_token to token strings (or
        None); `chat_templates` maps template names to sources, "default" being the plain one."""
        for name, token in special_tokens.items():
            if name not in _SPECIAL_TOKEN_NAMES:
                raise ValueError(f"unknown special token name {name!r}")
            if token is not None and backend.token_to_id(token) is None:
                raise ValueError(f"{name} {token!r} is not in the vocabulary")
        self._backend = backend
        self._special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        self._chat_templates = dict(chat_templates)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """From a Hugging Face directory: tokenizer.json, and if present tokenizer_config.json,
        special_tokens_map.json, chat_template.jinja / chat_template.json. Whether bos/eos are
        added is tokenizer.json's post-processor's call, as in transformers' fast tokenizers."""
        directory = Path(path)
        if not directory.is_dir():
            raise ValueError(f"tokenizer directory {directory} does not exist")
        tokenizer_file = directory / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ValueError(f"tokenizer directory {directory} has no tokenizer.json")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # the tokenizers library raises bare Exception on bad files
            raise ValueError(f"{tokenizer_file} is not a valid tokenizer.json: {e}") from e
        config = _read_json_object(directory / "tokenizer_config.json")
        special_map = _read_json_object(directory / "special_tokens_map.json")
        special_tokens = {
            name: _token_content(config.get(name, special_map.get(name)), name)
            for name in _SPECIAL_TOKEN_NAMES
        }
        return cls(backend, special_tokens, _dir_chat_templates(directory, config))

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """From the vocabulary in a GGUF file's metadata: `tokenizer.ggml.model` "gpt2"
        (byte-level BPE, split by `tokenizer.ggml.pre`) or "llama" (SentencePiece-style BPE
        with byte fallback). Reads only the metadata header, never the tensors."""
        gguf_path = Path(path)
        metadata = _read_gguf_metadata(gguf_path)
        kind = metadata.get("tokenizer.ggml.model")
        if kind is None or "tokenizer.ggml.tokens" not in metadata:
            raise ValueError(f"{gguf_path} has no tokenizer.ggml.model / tokenizer.ggml.tokens")
        if kind == "gpt2":
            backend = _byte_level_bpe(metadata, gguf_path)
        elif kind == "llama":
            backend = _sentencepiece_bpe(metadata, gguf_path)
        else:
            raise ValueError(f"{gguf_path}: tokenizer.ggml.model {kind!r} is not supported")
        special_tokens = _gguf_special_tokens(metadata, backend, gguf_path)
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
        return cls(backend, special_tokens, _gguf_chat_templates(metadata))

    @property
    def backend_tokenizer(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer` (e.g. for `tokenizers.decoders.DecodeStream`)."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token(self) -> str | None:
        return self._special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self._special_tokens.get("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._token_id("pad_token")

    def _token_id(self, name: str) -> int | None:
        token = self._special_tokens.get(name)
        return None if token is None else self._backend.token_to_id(token)

    @property
    def all_special_ids(self) -> list[int]:
        """Sorted ids of every special added token (what `decode(skip_special_tokens=True)`
        drops) and of the named bos/eos/unk/pad tokens."""
        added = self._backend.get_added_tokens_decoder()
        ids = {i for i, token in added.items() if token.special}
        ids |= {self._backend.token_to_id(t) for t in self._special_tokens.values()}
        return sorted(ids)

    @property
    def chat_template(self) -> str | None:
        """The model's default chat template, if it has one."""
        return self._chat_templates.get("default")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` adds the model's bos/eos, if any."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids`; raises ValueError for an id outside the vocabulary."""
        self._check_ids(ids)
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary strings of `ids` (byte-level or ▁-spelled, not decoded text)."""
        self._check_ids(ids)
        return [self._backend.id_to_token(i) for i in ids]

    def _check_ids(self, ids: Sequence[int]) -> None:
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(
                f"token ids {bad[:5]} are outside the vocabulary (size {self.vocab_size})"
            )

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render `messages` (and `tools`, OpenAI-style JSON schemas) to a prompt string.

        `chat_template` is the name of one of the model's templates or a template source
        (see `load_chat_template`); by default the model's "tool_use" template when tools are
        given and it has one, else its "default". bos_token, eos_token, unk_token and pad_token
        are template variables; `template_kwargs` are too (e.g. enable_thinking). Raises
        ValueError when there is no template or rendering fails (raise_exception, sandbox).
        """
        template = _compile_chat_template(self._select_chat_template(chat_template, tools))
        context = {
            **self._special_tokens,
            "documents": None,
            **_plain_data(template_kwargs, "template_kwargs"),
            "messages": _template_messages(messages),
            "tools": _plain_data(tools, "tools"),
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return template.render(context)
        except (jinja2.TemplateError, TypeError) as e:
            raise ValueError(f"chat template failed to render: {type(e).__name__}: {e}") from e

    def _select_chat_template(self, chat_template: str | None, tools: object) -> str:
        if chat_template is not None:
            return self._chat_templates.get(chat_template, chat_template)
        if tools and "tool_use" in self._chat_templates:
            return self._chat_templates["tool_use"]
        if "default" in self._chat_templates:
            return self._chat_templates["default"]
        raise ValueError(
            "this model has no chat template; pass chat_template (a template or a file path)"
        )
