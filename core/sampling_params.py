"""SamplingParams: the per-request knobs of token sampling, validated on construction.

A msgspec Struct because it crosses the frontend -> engine-core ZMQ socket inside an
EngineCoreRequest; msgspec runs ``__post_init__`` on decode too, so a malformed message
fails with the same ValueError (msgspec.ValidationError subclasses it) as a bad Python call.
Checks that need engine facts (the logprobs cap, the vocabulary size) live in ``verify``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Any

import msgspec

from core.input_checks import check_json_data, first_few, parse_json_text

__all__ = ["SAMPLING_EPS", "SamplingParams", "SamplingType", "StructuredOutputsParams"]

# Below this temperature a request is greedy: dividing by it would overflow the logits.
SAMPLING_EPS = 1e-5

# OpenAI clamps logit_bias values to this range; so do we, rather than reject them.
_MAX_ABS_LOGIT_BIAS = 100.0

# torch.Generator.manual_seed accepts any value representable as int64 or uint64.
_MIN_SEED = -(2**63)
_MAX_SEED = 2**64 - 1

# The engine's tensors hold counts and token ids as int64 (and msgspec cannot send ints past
# 2**64 - 1 to the engine core at all), so a larger value is an error here, not later.
_MAX_INT64 = 2**63 - 1
_COUNT_FIELDS = ("n", "top_k", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs")


class SamplingType(enum.IntEnum):
    """How the sampler picks a request's next token."""

    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class StructuredOutputsParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A constraint on the output's shape: exactly one of the fields is set.

    json: a JSON schema (dict or its JSON text); json_object: any JSON object; regex: a
    regular expression; choice: one of these strings; grammar: an EBNF grammar.
    """

    json: str | dict | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [
            name
            for name in ("json", "regex", "choice", "grammar")
            if getattr(self, name) is not None
        ] + (["json_object"] if self.json_object else [])
        if len(given) != 1:
            raise ValueError(
                "structured_outputs needs exactly one of json, json_object, regex, choice, "
                f"grammar; got {given or 'none'}"
            )
        if self.choice is not None and (not self.choice or not all(self.choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of strings")
        for name in ("regex", "choice", "grammar"):
            check_json_data(getattr(self, name), f"structured_outputs.{name}")
        if isinstance(self.json, str):  # checked as the data it holds: depth, text
            parse_json_text(self.json, "structured_outputs.json")
        else:
            check_json_data(self.json, "structured_outputs.json")


class SamplingParams(msgspec.Struct, kw_only=True):
    """Sampling parameters of one request (vLLM-compatible names and defaults).

    ``stop`` and ``stop_token_ids`` are normalized to lists, ``logit_bias`` values are
    clamped to [-100, 100]. Every invalid value raises ValueError naming the field and
    the reason. ``bad_words`` are strings; the frontend turns them into
    ``bad_words_token_ids`` with ``resolve_bad_words`` (the sampler reads only the ids).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16  # None: up to the model's max_model_len
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # -1: every token of the vocabulary (vLLM's)
    prompt_logprobs: int | None = None  # -1: every token of the vocabulary (vLLM's)
    seed: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    bad_words_token_ids: list[list[int]] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True
    # vLLM's free-form extras for plugins; "kv_transfer_params" reaches the KV connector
    # (Request.kv_transfer_params).
    extra_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self._normalize()
        self._check_sampling()
        self._check_penalties()
        self._check_lengths()
        self._check_token_lists()
        self._check_logprobs()
        self._check_seed()
        self._check_int64()
        self._check_text()

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < SAMPLING_EPS:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    def all_stop_token_ids(self, eos_token_id: int | None) -> set[int]:
        """Token ids that end this request: ``stop_token_ids`` plus EOS unless ``ignore_eos``."""
        ids = set(self.stop_token_ids or ())
        if eos_token_id is not None and not self.ignore_eos:
            ids.add(eos_token_id)
        return ids

    def verify(self, max_logprobs: int, vocab_size: int) -> None:
        """Check what depends on the engine: the logprobs cap (-1: none) and the token-id
        range.

        The frontend calls this before the request reaches the engine core, so the
        sampler may index tensors with every token id found here without further checks.
        """
        cap = vocab_size if max_logprobs == -1 else max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (vocab_size if value == -1 else value) > cap:
                asked = f"-1 (the whole vocabulary, {vocab_size})" if value == -1 else value
                raise ValueError(f"{name} must be <= max_logprobs ({max_logprobs}), got {asked}")
        for name, ids in self._token_id_fields():
            bad = [i for i in ids if i >= vocab_size]
            if bad:
                raise ValueError(_out_of_vocabulary(name, bad, vocab_size))

    def resolve_whole_vocabulary(self, vocab_size: int) -> None:
        """Turn -1 ("every token") in logprobs and prompt_logprobs into `vocab_size`, the
        count the engine computes with; after `verify`."""
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) == -1:
                setattr(self, name, vocab_size)

    def resolve_bad_words(self, encode: Callable[[str], list[int]]) -> None:
        """Fill ``bad_words_token_ids`` from ``bad_words``.

        ``encode`` tokenizes without special tokens. Each word is banned both as written
        and with a leading space, because most BPE vocabularies spell a word differently
        at the start of the text than after a space.
        """
        sequences = list(self.bad_words_token_ids or [])
        for word in self.bad_words or ():
            for text in (word, " " + word.lstrip()):
                ids = list(encode(text))
                if ids and ids not in sequences:
                    sequences.append(ids)
        self.bad_words_token_ids = sequences or None

    def _normalize(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if self.logit_bias is not None:
            # Checked before clamping: min/max would silently turn NaN into a bound.
            for token_id, bias in self.logit_bias.items():
                _require(not math.isnan(bias), "logit_bias", f"[{token_id}] must not be NaN", bias)
            self.logit_bias = {
                token_id: max(-_MAX_ABS_LOGIT_BIAS, min(_MAX_ABS_LOGIT_BIAS, float(bias)))
                for token_id, bias in self.logit_bias.items()
            }

    def _check_sampling(self) -> None:
        _require(self.n >= 1, "n", "must be >= 1", self.n)
        _require(
            0 <= self.temperature < math.inf,
            "temperature",
            "must be >= 0 and finite",
            self.temperature,
        )
        _require(0 < self.top_p <= 1, "top_p", "must be in (0, 1]", self.top_p)
        _require(
            self.top_k in (0, -1) or self.top_k >= 1,
            "top_k",
            "must be 0 or -1 (disabled) or >= 1",
            self.top_k,
        )
        _require(0 <= self.min_p <= 1, "min_p", "must be in [0, 1]", self.min_p)

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _require(-2 <= value <= 2, name, "must be in [-2, 2]", value)
        _require(
            self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty),
            "repetition_penalty",
            "must be > 0 and finite",
            self.repetition_penalty,
        )

    def _check_lengths(self) -> None:
        if self.max_tokens is not None:
            _require(self.max_tokens >= 1, "max_tokens", "must be >= 1", self.max_tokens)
        _require(self.min_tokens >= 0, "min_tokens", "must be >= 0", self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}"
            )
        if any(not s for s in self.stop):
            raise ValueError("stop must not contain empty strings")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True, got detokenize=False")

    def _check_token_lists(self) -> None:
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise ValueError("allowed_token_ids must not be empty (use None for no restriction)")
        if any(not seq for seq in self.bad_words_token_ids or ()):
            raise ValueError("bad_words_token_ids must not contain empty sequences")
        for name, ids in self._token_id_fields():
            bad = [i for i in ids if i < 0]
            if bad:
                raise ValueError(f"{name} must hold token ids >= 0, got {bad[0]}")

    def _check_logprobs(self) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _require(value >= -1, name, "must be None, -1 (every token) or >= 0", value)

    def _check_seed(self) -> None:
        if self.seed is not None:
            _require(
                _MIN_SEED <= self.seed <= _MAX_SEED,
                "seed",
                "must fit in 64 bits ([-2**63, 2**64 - 1])",
                self.seed,
            )

    def _check_int64(self) -> None:
        for name in _COUNT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                _require(value <= _MAX_INT64, name, "must be <= 2**63 - 1", value)

    def _check_text(self) -> None:
        """stop strings and bad words must be valid Unicode (no lone surrogate): they are
        tokenized and sent to the engine core as UTF-8."""
        check_json_data(self.stop, "stop")
        check_json_data(self.bad_words, "bad_words")

    def _token_id_fields(self) -> list[tuple[str, list[int]]]:
        return [
            ("stop_token_ids", list(self.stop_token_ids or ())),
            ("logit_bias", list(self.logit_bias or ())),
            ("allowed_token_ids", list(self.allowed_token_ids or ())),
            ("bad_words_token_ids", [i for seq in self.bad_words_token_ids or () for i in seq]),
        ]


def _out_of_vocabulary(field: str, bad_ids: list[int], vocab_size: int) -> str:
    """The error for token ids past the vocabulary, naming every one (up to a few): in
    vLLM's words for logit_bias, the one field whose error vLLM words so."""
    if field == "logit_bias":
        return (
            f"logit_bias: token_id(s) {first_few(bad_ids)} in logit_bias contain out-of-vocab "
            f"token ids. Vocabulary size: {vocab_size}"
        )
    return f"{field} must hold token ids < vocab_size ({vocab_size}), got {first_few(bad_ids)}"


def _require(ok: bool, field: str, reason: str, value: object) -> None:
    """Raise ValueError("<field> <reason>, got <value>") unless ``ok`` (NaN fails every check)."""
    if not ok:
        raise ValueError(f"{field} {reason}, got {value!r}")
