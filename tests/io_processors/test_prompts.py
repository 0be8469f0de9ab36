"""What `pre_process` may return (core.io_processors.prompts): text, token ids or a prompt
dict, alone or in a non-empty sequence; anything else is the processor's bug, a TypeError
naming pre_process."""

from __future__ import annotations

import pytest

from core.io_processors import PromptParts, prompt_parts

IMAGE = object()  # the multimodal items pass through untouched


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        ("w1 w2", [PromptParts("w1 w2")]),
        ([5, 6], [PromptParts([5, 6])]),
        ({"prompt": "w1"}, [PromptParts("w1")]),
        ({"prompt_token_ids": [5]}, [PromptParts([5])]),
        (
            {"prompt": "<image> w1", "multi_modal_data": {"image": IMAGE}},
            [PromptParts("<image> w1", {"image": IMAGE})],
        ),
        (["w1", [5], {"prompt": "w2"}], [PromptParts("w1"), PromptParts([5]), PromptParts("w2")]),
        (("w1", "w2"), [PromptParts("w1"), PromptParts("w2")]),
        ([[]], [PromptParts([])]),  # empty, but a prompt: the engine refuses it, naming prompt
    ],
)
def test_each_prompt_becomes_the_arguments_of_one_engine_request(returned, expected):
    assert prompt_parts(returned) == expected


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ([], "pre_process must return a prompt or a non-empty sequence of prompts, got list []"),
        (None, "got NoneType None"),
        (b"w1", "got bytes b'w1'"),
        ([3.5], "not text, token ids or a dict: float 3.5"),
        ([True, 1], "not text, token ids or a dict: bool True"),  # bools are no token ids
        ({"text": "w1"}, "unknown keys ['text']"),
        ({"prompt": "w1", "prompt_token_ids": [5]}, "exactly one of 'prompt' (text)"),
        ({"multi_modal_data": {}}, "exactly one of 'prompt' (text)"),
        ({"prompt": [5]}, "a 'prompt' that is not text: list [5]"),
        ({"prompt_token_ids": "w1"}, "'prompt_token_ids' that are not a list of ints: str 'w1'"),
        ({"prompt": "w1", "multi_modal_data": [IMAGE]}, "multi_modal_data that is not a dict"),
    ],
)
def test_another_shape_is_a_type_error_naming_pre_process(returned, message):
    with pytest.raises(TypeError, match="pre_process") as error:
        prompt_parts(returned)
    assert message in str(error.value)
