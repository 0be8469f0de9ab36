"""SamplingParams: validation names the bad field, normalization, msgspec round trips."""

import math
import re

import msgspec
import pytest

from core.sampling_params import SamplingParams, SamplingType, StructuredOutputsParams


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("n", 0, "must be >= 1"),
        ("temperature", -1.0, "must be >= 0"),
        ("temperature", math.nan, "must be >= 0"),
        ("temperature", math.inf, "finite"),
        ("top_p", 0.0, "must be in (0, 1]"),
        ("top_p", 1.5, "must be in (0, 1]"),
        ("top_k", -2, "must be 0 or -1 (disabled) or >= 1"),
        ("min_p", -0.1, "must be in [0, 1]"),
        ("min_p", 1.1, "must be in [0, 1]"),
        ("presence_penalty", 2.5, "must be in [-2, 2]"),
        ("frequency_penalty", -2.5, "must be in [-2, 2]"),
        ("repetition_penalty", 0.0, "must be > 0"),
        ("max_tokens", 0, "must be >= 1"),
        ("min_tokens", -1, "must be >= 0"),
        ("logprobs", -2, "must be None, -1 (every token) or >= 0"),
        ("prompt_logprobs", -2, "must be None, -1 (every token) or >= 0"),
        ("seed", 2**64, "must fit in 64 bits"),
        ("stop_token_ids", [3, -1], "must hold token ids >= 0"),
        ("allowed_token_ids", [], "must not be empty"),
        ("allowed_token_ids", [-5], "must hold token ids >= 0"),
        ("logit_bias", {-1: 1.0}, "must hold token ids >= 0"),
        ("logit_bias", {3: math.nan}, "must not be NaN"),
        ("bad_words_token_ids", [[]], "must not contain empty sequences"),
        ("stop", ["ok", ""], "must not contain empty strings"),
        ("stop", ["ok", "\ud800"], "[1] contains a lone surrogate (U+D800 at character 0)"),
        ("stop", "x\udfff", "[0] contains a lone surrogate (U+DFFF at character 1)"),
        ("bad_words", ["\udc80"], "[0] contains a lone surrogate (U+DC80 at character 0)"),
        # Past int64 the engine's tensors, and past 2**64 - 1 msgspec, cannot carry them.
        ("top_k", 2**63, "must be <= 2**63 - 1"),
        ("logprobs", 2**64 + 5, "must be <= 2**63 - 1"),
        ("max_tokens", 2**63, "must be <= 2**63 - 1"),
        ("n", 2**63, "must be <= 2**63 - 1"),
    ],
)
def test_bad_field_raises_value_error_naming_field_and_reason(field, value, reason):
    with pytest.raises(ValueError) as error:
        SamplingParams(**{field: value})
    message = str(error.value)
    assert message.startswith(field)
    assert reason in message


def test_error_message_shows_the_bad_value():
    with pytest.raises(ValueError, match=r"^temperature must be >= 0 and finite, got -1$"):
        SamplingParams(temperature=-1)


def test_min_tokens_above_max_tokens_is_rejected():
    with pytest.raises(ValueError, match=r"^min_tokens must be <= max_tokens \(4\), got 5$"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_stop_strings_need_detokenize():
    with pytest.raises(ValueError, match="^stop strings need detokenize=True"):
        SamplingParams(stop="x", detokenize=False)


def test_boundary_values_are_accepted():
    params = SamplingParams(
        temperature=0.0,
        top_p=1.0,
        top_k=-1,
        min_p=1.0,
        presence_penalty=-2.0,
        frequency_penalty=2.0,
        max_tokens=None,
        min_tokens=0,
        logprobs=0,
        seed=-(2**63),
    )
    assert params.max_tokens is None


def test_stop_is_normalized_to_a_list():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams().stop == []
    assert SamplingParams().stop_token_ids == []


def test_logit_bias_values_are_clamped_like_openai():
    params = SamplingParams(logit_bias={1: 500.0, 2: -250.0, 3: 7.5})
    assert params.logit_bias == {1: 100.0, 2: -100.0, 3: 7.5}


def test_sampling_type_follows_temperature_and_seed():
    assert SamplingParams(temperature=0.0).sampling_type == SamplingType.GREEDY
    assert SamplingParams(temperature=5e-6, seed=1).sampling_type == SamplingType.GREEDY
    assert SamplingParams(temperature=0.7).sampling_type == SamplingType.RANDOM
    assert SamplingParams(temperature=0.7, seed=3).sampling_type == SamplingType.RANDOM_SEED


def test_all_stop_token_ids_adds_eos_unless_ignored():
    assert SamplingParams(stop_token_ids=[5]).all_stop_token_ids(eos_token_id=2) == {2, 5}
    ignoring = SamplingParams(stop_token_ids=[5], ignore_eos=True)
    assert ignoring.all_stop_token_ids(eos_token_id=2) == {5}
    assert SamplingParams().all_stop_token_ids(eos_token_id=None) == set()


def test_verify_caps_logprobs_at_max_logprobs():
    SamplingParams(logprobs=20, prompt_logprobs=20).verify(max_logprobs=20, vocab_size=100)
    with pytest.raises(ValueError, match=r"^logprobs must be <= max_logprobs \(20\), got 21$"):
        SamplingParams(logprobs=21).verify(max_logprobs=20, vocab_size=100)
    with pytest.raises(ValueError, match=r"^prompt_logprobs must be <= max_logprobs"):
        SamplingParams(prompt_logprobs=21).verify(max_logprobs=20, vocab_size=100)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stop_token_ids", [100]),
        ("allowed_token_ids", [3, 100]),
        ("bad_words_token_ids", [[1, 100]]),
    ],
)
def test_verify_rejects_token_ids_outside_the_vocabulary(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must hold token ids < vocab_size \(100\)"):
        SamplingParams(**{field: value}).verify(max_logprobs=20, vocab_size=100)


def test_verify_names_every_out_of_vocabulary_id_up_to_five():
    params = SamplingParams(allowed_token_ids=[3, *range(100, 107)])
    with pytest.raises(ValueError, match=r"got \[100, 101, 102, 103, 104\] and 2 more$"):
        params.verify(max_logprobs=20, vocab_size=100)
    # vLLM's words for logit_bias, after the field
    message = (
        "logit_bias: token_id(s) [100, 250] in logit_bias contain out-of-vocab token ids. "
        "Vocabulary size: 100"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        SamplingParams(logit_bias={5: 1.0, 100: 1.0, 250: 1.0}).verify(20, vocab_size=100)


def test_resolve_bad_words_encodes_with_and_without_leading_space():
    vocab = {"bad": [7], " bad": [8], "very bad": [9, 7], " very bad": [10, 7]}
    params = SamplingParams(bad_words=["bad", "very bad"])
    params.resolve_bad_words(lambda text: vocab[text])
    assert params.bad_words_token_ids == [[7], [8], [9, 7], [10, 7]]


def test_resolve_bad_words_keeps_one_copy_of_equal_encodings():
    params = SamplingParams(bad_words=["x"])
    params.resolve_bad_words(lambda text: [4])
    assert params.bad_words_token_ids == [[4]]


def test_msgpack_round_trip_preserves_every_field():
    params = SamplingParams(
        n=2,
        temperature=0.3,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        max_tokens=None,
        min_tokens=3,
        stop=["\n\n"],
        stop_token_ids=[2],
        ignore_eos=True,
        logprobs=5,
        prompt_logprobs=1,
        seed=1234,
        logit_bias={17: -3.0},
        allowed_token_ids=[1, 2, 17],
        bad_words=["no"],
        bad_words_token_ids=[[9]],
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        include_stop_str_in_output=True,
        detokenize=True,
    )
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams)
    assert decoded == params
    assert msgspec.structs.asdict(decoded) == msgspec.structs.asdict(params)


def test_decoding_invalid_params_raises_value_error():
    payload = msgspec.msgpack.encode({"top_p": 0.0})
    with pytest.raises(ValueError, match="^top_p must be in"):
        msgspec.msgpack.decode(payload, type=SamplingParams)


def test_int64_bounds_are_accepted_and_cross_to_the_engine_core():
    params = SamplingParams(top_k=2**63 - 1, min_tokens=2**63 - 1, max_tokens=None)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams) == params
    with pytest.raises(
        ValueError, match=r"^min_tokens must be <= 2\*\*63 - 1, got 18446744073709551621$"
    ):
        SamplingParams(min_tokens=2**64 + 5, max_tokens=None)  # no max_tokens to bound it


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"regex": "a\ud800"}, r"^structured_outputs\.regex contains a lone surrogate"),
        ({"grammar": "\udc00"}, r"^structured_outputs\.grammar contains a lone surrogate"),
        ({"choice": ["a", "\ud800"]}, r"^structured_outputs\.choice\[1\] contains a lone"),
        ({"json": {"enum": ["\ud800"]}}, r"^structured_outputs\.json\.enum\[0\] contains a lone"),
        ({"json": '{"enum": ["\\ud800"]}'}, r"^structured_outputs\.json\.enum\[0\] contains"),
        ({"json": "{not json"}, r"^structured_outputs\.json is not valid JSON: "),
        ({"json": "[" * 65 + "]" * 65}, r"^structured_outputs\.json is nested deeper than 64"),
        ({"json": "[" * 5000 + "]" * 5000}, r"^structured_outputs\.json is nested deeper than 64"),
    ],
)
def test_structured_outputs_refuse_invalid_text_and_deep_or_broken_schemas(fields, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**fields)
