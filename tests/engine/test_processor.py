"""The InputProcessor's rules, each written once: the prompt-fit rule and max_tokens
resolution (`fit_max_tokens`, shared with the engine core's Request and the OpenAI
server) and chat rendering, on the tiny model's hand-written vocabulary."""

from __future__ import annotations

import pytest
from tiny_engine_checkpoint import MAX_MODEL_LEN, VOCAB, engine_args

from core.engine.processor import EngineSetup, InputProcessor
from core.request import Request, fit_max_tokens
from core.sampling_params import SamplingParams

USER = [{"role": "user", "content": "w1 w2"}]


@pytest.fixture(scope="module")
def processor(tiny_checkpoint) -> InputProcessor:
    return InputProcessor(EngineSetup.from_engine_args(engine_args(tiny_checkpoint)))


def ids(*tokens: str) -> list[int]:
    return [VOCAB[token] for token in tokens]


# --- the fit rule ----------------------------------------------------------------------------


def test_a_prompt_one_token_short_of_max_model_len_fits_exactly_one_new_token():
    assert fit_max_tokens(None, 99, 100) == 1
    assert fit_max_tokens(16, 99, 100) == 1
    assert fit_max_tokens(1, 99, 100, exact=True) == 1


@pytest.mark.parametrize("num_prompt_tokens", [100, 101])
def test_a_prompt_of_max_model_len_tokens_does_not_fit(num_prompt_tokens):
    with pytest.raises(ValueError, match=f"^prompt is {num_prompt_tokens} tokens long, which "):
        fit_max_tokens(None, num_prompt_tokens, 100)


def test_max_tokens_none_takes_all_the_room_and_a_smaller_value_is_kept():
    assert fit_max_tokens(None, 30, 100) == 70
    assert fit_max_tokens(5, 30, 100) == 5


def test_more_than_the_room_is_capped_unless_asked_for_exactly():
    assert fit_max_tokens(500, 30, 100) == 70
    assert fit_max_tokens(70, 30, 100, exact=True) == 70
    with pytest.raises(ValueError) as error:
        fit_max_tokens(71, 30, 100, exact=True)
    assert str(error.value) == (
        "max_tokens is 71, but the prompt is 30 tokens and max_model_len is 100: "
        "at most 70 tokens can be generated"
    )


# --- prepare: the rule at the frontend, the cap in the engine core -----------------------------


def test_prepare_accepts_max_model_len_minus_one_tokens_and_the_engine_gives_one_new_token(
    processor,
):
    prompt = [VOCAB["w1"]] * (MAX_MODEL_LEN - 1)
    prepared = processor.prepare(prompt, SamplingParams(max_tokens=None))
    request = processor.engine_core_request("r", prepared)
    assert Request.from_engine_core_request(request, max_model_len=MAX_MODEL_LEN).max_tokens == 1
    with pytest.raises(ValueError, match=f"^prompt is {MAX_MODEL_LEN} tokens long"):
        processor.prepare([VOCAB["w1"]] * MAX_MODEL_LEN, SamplingParams())


def test_prepare_leaves_an_offline_max_tokens_for_the_engine_core_to_cap(processor):
    # Offline, a max_tokens beyond the room is capped, not refused, and SamplingParams is
    # not re-validated against the cap (min_tokens above it is the caller's own business).
    params = SamplingParams(max_tokens=100, min_tokens=50)
    prepared = processor.prepare([VOCAB["w1"]] * 10, params)
    assert prepared.params.max_tokens == 100
    request = processor.engine_core_request("r", prepared)
    room = MAX_MODEL_LEN - 10
    assert Request.from_engine_core_request(request, max_model_len=MAX_MODEL_LEN).max_tokens == room


def test_prepare_errors_name_the_prompt(processor):
    with pytest.raises(ValueError, match="^prompt: The decoder prompt cannot be empty$"):
        processor.prepare("", SamplingParams())
    with pytest.raises(
        ValueError, match=r"^prompt contains a lone surrogate \(U\+D800 at character 3"
    ):
        processor.prepare("w1 \ud800", SamplingParams())
    with pytest.raises(ValueError, match=f"^prompt: Token id {len(VOCAB)} is out of vocabulary$"):
        processor.prepare([len(VOCAB)], SamplingParams())


# --- chat rendering --------------------------------------------------------------------------


def test_render_chat_uses_the_model_template_and_adds_the_generation_prompt(processor):
    assert processor.render_chat(USER) == ids("user", ":", "w1", "w2", "</s>", "assistant", ":")
    without = processor.render_chat(USER, add_generation_prompt=False)
    assert without == ids("user", ":", "w1", "w2", "</s>")


def test_continue_final_message_ends_right_after_its_content(processor):
    messages = [*USER, {"role": "assistant", "content": "w3 w4"}]
    rendered = processor.render_chat(
        messages, add_generation_prompt=False, continue_final_message=True
    )
    assert rendered == ids("user", ":", "w1", "w2", "</s>", "assistant", ":", "w3", "w4")


def test_chat_template_and_its_kwargs_come_from_the_call(processor):
    template = "{{ greeting }} {% for m in messages %}{{ m['content'] }}{% endfor %}"
    rendered = processor.render_chat(
        USER, chat_template=template, chat_template_kwargs={"greeting": "w9"}
    )
    assert rendered == ids("w9", "w1", "w2")


def test_the_configured_chat_template_replaces_the_model_one(tiny_checkpoint):
    args = engine_args(tiny_checkpoint, chat_template="w7 {{ messages[0]['content'] }}")
    configured = InputProcessor(EngineSetup.from_engine_args(args))
    assert configured.render_chat(USER) == ids("w7", "w1", "w2")
    assert configured.render_chat(USER, chat_template="w8") == ids("w8")


def test_a_template_that_cannot_render_is_an_error_naming_messages(processor):
    with pytest.raises(ValueError, match="^messages cannot be rendered with the chat template"):
        processor.render_chat(USER, chat_template="{% for m in messages %}")


@pytest.mark.parametrize("name", ["self", "messages", "tools", "add_generation_prompt"])
def test_chat_template_kwargs_named_as_a_render_argument_are_an_error_naming_them(processor, name):
    with pytest.raises(ValueError, match=f"^chat_template_kwargs cannot set {name}: "):
        processor.render_chat(USER, chat_template_kwargs={name: 1})


def test_bad_chat_inputs_are_errors_naming_them_not_type_or_recursion_errors(processor):
    deep: list = []
    for _ in range(500):
        deep = [deep]
    with pytest.raises(ValueError, match="^chat_template_kwargs is nested deeper than 64"):
        processor.render_chat(USER, chat_template_kwargs={"x": deep})
    surrogate = [{"role": "user", "content": "w1 \ud800"}]
    with pytest.raises(ValueError, match=r"^messages .*: messages\[0\]\.content contains a lone"):
        processor.render_chat(surrogate)
    # A template can write one itself: the rendered prompt is checked before tokenizing.
    with pytest.raises(ValueError, match="^messages .*: the rendered prompt contains a lone"):
        processor.render_chat(USER, chat_template="{{ '\\ud800' }}")
