"""The names apps import from `core` (the mission's `from core import LLM, SamplingParams`
offline and `AsyncLLM` for asyncio apps) resolve to the classes that serve them."""

from __future__ import annotations

import importlib

import pytest

import core


@pytest.mark.parametrize("name", sorted(set(core.__all__) - {"__version__"}))
def test_every_public_name_resolves_to_its_class(name):
    value = getattr(core, name)
    assert value.__name__ == name
    assert importlib.import_module(value.__module__) is not None


def test_async_llm_is_public():
    from core.engine.async_llm import AsyncLLM

    assert core.AsyncLLM is AsyncLLM and "AsyncLLM" in core.__all__


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        core.Nope  # noqa: B018
