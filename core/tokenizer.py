"""The engine's tokenizer: text <-> token ids and chat templates; generation defaults.

A `Tokenizer` wraps a `tokenizers.Tokenizer`, built either from a Hugging Face directory
(tokenizer.json, read here) or from the vocabulary a GGUF file stores in its metadata
(core.tokenizer_gguf). Templates render in core.chat_template's sandbox. The model
directory's generation_config.json is read here too, with the same JSON reading.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tokenizers

from core.chat_template import render_chat_template
from core.input_checks import check_text
from core.isolated_render import isolated_renderer
from core.model_loader.gguf_metadata import read_gguf_metadata
from core.tokenizer_gguf import gguf_backend_tokenizer, gguf_chat_templates

if TYPE_CHECKING:
    from core.model_loader.checkpoint import Checkpoint

__all__ = ["Tokenizer", "load_generation_defaults", "load_tokenizer"]

_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")

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
        # Sources rendered in this process; any other renders isolated (core.isolated_render).
        self._trusted_templates = set(self._chat_templates.values())

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
        metadata = read_gguf_metadata(gguf_path)
        backend, special_tokens = gguf_backend_tokenizer(metadata, gguf_path)
        return cls(backend, special_tokens, gguf_chat_templates(metadata))

    def save(self, directory: str | Path, **config: Any) -> None:
        """Write tokenizer.json and tokenizer_config.json into `directory`, so that
        `Tokenizer.from_dir(directory)` gives back the same tokenizer: every named special
        token and every chat template (one string when there is only the default, else
        a list of named templates, as transformers writes them). `config` adds keys to
        tokenizer_config.json (e.g. model_max_length)."""
        directory = Path(directory)
        self._backend.save(str(directory / "tokenizer.json"))
        text = json.dumps({**self.config(), **config}, indent=2, ensure_ascii=False) + "\n"
        (directory / "tokenizer_config.json").write_text(text, encoding="utf-8")

    def config(self) -> dict[str, Any]:
        """What transformers' tokenizer_config.json says of this tokenizer: its class (a fast
        tokenizer over tokenizer.json), the named special tokens and the chat templates (one
        string when there is only the default, else a list of named templates)."""
        templates = self._chat_templates
        if set(templates) <= {"default"}:
            chat_template: Any = templates.get("default")
        else:
            chat_template = [{"name": n, "template": t} for n, t in templates.items()]
        content = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **self._special_tokens,
            "chat_template": chat_template,
        }
        return {key: value for key, value in content.items() if value is not None}

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
        """Token ids of `text`; `add_special_tokens` adds the model's bos/eos, if any.
        ValueError when `text` is not valid Unicode (a lone surrogate, which the tokenizers
        library refuses with a TypeError about its argument's type)."""
        check_text(text, "text")
        # The batch calls release the GIL while they work (`encode` holds it: a 2 MB prompt
        # tokenized on the server's worker thread stalled its event loop for a second), and
        # the _fast one skips the character offsets nobody reads here.
        return self._backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_pair(self, text: str, text_pair: str) -> tuple[list[int], list[int]]:
        """Token ids and token type ids of a text pair, joined as the tokenizer's
        post-processor joins pairs (BERT: [CLS] a [SEP] b [SEP], b of type 1), as a
        cross-encoder reads them. ValueError as `encode`."""
        check_text(text, "text")
        check_text(text_pair, "text_pair")
        encoding = self._backend.encode_batch_fast([(text, text_pair)])[0]
        return encoding.ids, encoding.type_ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids`; raises ValueError for an id outside the vocabulary."""
        self._check_ids(ids)
        # The batch call releases the GIL, as in `encode`.
        return self._backend.decode_batch([list(ids)], skip_special_tokens=skip_special_tokens)[0]

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
        (see `core.chat_template.load_chat_template`); by default the model's "tool_use"
        template when tools are given and it has one, else its "default". bos_token,
        eos_token, unk_token and pad_token are template variables; `template_kwargs` are too
        (e.g. enable_thinking). Raises ValueError when there is no template or rendering
        fails (raise_exception, sandbox). A source that is neither the model's nor trusted
        (`trust_chat_template`) renders in an isolated process (core.isolated_render)."""
        source = self.select_chat_template(chat_template, tools)
        render = (
            render_chat_template
            if source in self._trusted_templates
            else isolated_renderer().render
        )
        return render(
            source=source,
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            special_tokens=self._special_tokens,
            template_kwargs=template_kwargs,
        )

    def trust_chat_template(self, source: str) -> None:
        """Render `source` in this process, as the model's own templates: a template the
        deployment chose (--chat-template). Any other source passed to `apply_chat_template`
        comes from a request or a caller and renders in an isolated process."""
        self._trusted_templates.add(source)

    def select_chat_template(self, chat_template: str | None, tools: object) -> str:
        """The source of the template `apply_chat_template` renders with these arguments
        (see there); ValueError when the model has none."""
        if chat_template is not None:
            return self._chat_templates.get(chat_template, chat_template)
        if tools and "tool_use" in self._chat_templates:
            return self._chat_templates["tool_use"]
        if "default" in self._chat_templates:
            return self._chat_templates["default"]
        raise ValueError(
            "this model has no chat template; pass chat_template (a template or a file path)"
        )


def load_tokenizer(checkpoint: Checkpoint, override: str | None = None) -> Tokenizer:
    """The tokenizer of `override` (a directory or .gguf) or of the checkpoint itself."""
    path = Path(override) if override else checkpoint.path
    if path.suffix == ".gguf":
        return Tokenizer.from_gguf(path)
    return Tokenizer.from_dir(path)
