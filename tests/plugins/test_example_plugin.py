"""The example third-party plugin, installed beside core, leaves platform selection alone
until asked for (its conformance is checked by the nox `conformance` session)."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest

from core.platforms import select_platform
from core.plugins import PluginRegistry
from core.plugins.groups import ALL_GROUPS

pytest.importorskip("core_example_plugin", reason="tests/plugins/example_plugin is not installed")


def discover() -> PluginRegistry:
    points = [ep for group in ALL_GROUPS for ep in metadata.entry_points(group=group)]
    return PluginRegistry(points, None)


def test_example_platform_is_unavailable_unless_asked_for(monkeypatch):
    monkeypatch.delenv("CORE_EXAMPLE_PLATFORM", raising=False)
    choice = select_platform(discover(), requested="cpu")
    assert choice.rejected["example"] == (
        "unavailable: set CORE_EXAMPLE_PLATFORM=1 to use the example platform"
    )


def test_example_platform_is_chosen_when_asked_for(monkeypatch):
    monkeypatch.setenv("CORE_EXAMPLE_PLATFORM", "1")
    choice = select_platform(discover(), requested="example")
    assert type(choice.platform).__name__ == "ExamplePlatform"
    assert choice.platform.preferred_attention_backends[0] == "example_paged"
