"""Platform selection over real entry points: one accelerator wins, CPU otherwise."""

from __future__ import annotations

import importlib.metadata as metadata
import sys

import pytest
from plugin_sources import available_platform, platform_plugin

from core.platforms import select_platform
from core.platforms.cpu import CpuPlatform
from core.plugins import PluginRegistry
from core.plugins.groups import ALL_GROUPS, PLATFORMS


def discover(allowlist: list[str] | None = None) -> PluginRegistry:
    points = [ep for group in ALL_GROUPS for ep in metadata.entry_points(group=group)]
    return PluginRegistry(points, allowlist)


def add_acme(site) -> None:
    site.add("acme-platform", {PLATFORMS: {"acme": "acme_platform.probe:probe"}},
             available_platform("acme_platform", "AcmePlatform"))  # fmt: skip


def test_cpu_is_chosen_when_no_accelerator_is_available(site):
    choice = select_platform(discover())
    assert choice.name == "cpu" and isinstance(choice.platform, CpuPlatform)
    assert "no accelerator" in choice.reason


def test_an_available_third_party_platform_wins_over_cpu(site):
    add_acme(site)
    choice = select_platform(discover())
    assert choice.name == "acme"
    assert type(choice.platform).__name__ == "AcmePlatform"


def test_unavailable_reason_is_reported(site):
    site.add("sleepy", {PLATFORMS: {"sleepy": "sleepy.probe:probe"}},
             platform_plugin("sleepy", "Sleepy", 'raise Unavailable("no device")'))  # fmt: skip
    choice = select_platform(discover())
    assert choice.name == "cpu"
    assert choice.rejected["sleepy"] == "unavailable: no device"
    assert "sleepy.platform" not in sys.modules  # an unchosen platform class is never imported


def test_two_available_platforms_need_a_choice(site, monkeypatch):
    add_acme(site)
    site.add("zeta-platform", {PLATFORMS: {"zeta": "zeta_platform.probe:probe"}},
             available_platform("zeta_platform", "ZetaPlatform"))  # fmt: skip
    monkeypatch.delenv("CORE_PLATFORM", raising=False)
    with pytest.raises(ValueError, match="acme, zeta") as error:
        select_platform(discover())
    assert "CORE_PLATFORM" in str(error.value)
    monkeypatch.setenv("CORE_PLATFORM", "zeta")
    assert select_platform(discover()).name == "zeta"
    assert select_platform(discover(), requested="cpu").name == "cpu"


def test_requesting_an_unavailable_platform_says_why(site):
    site.add("sleepy", {PLATFORMS: {"sleepy": "sleepy.probe:probe"}},
             platform_plugin("sleepy", "Sleepy", 'raise Unavailable("no device")'))  # fmt: skip
    with pytest.raises(ValueError, match="no device"):
        select_platform(discover(), requested="sleepy")
    with pytest.raises(ValueError, match="platform 'nonesuch' is not installed; installed: .*cpu"):
        select_platform(discover(), requested="nonesuch")


def test_filtered_platform_is_not_chosen(site):
    add_acme(site)
    choice = select_platform(discover(allowlist=[]))
    assert choice.name == "cpu"
    assert "not in CORE_PLUGINS" in choice.rejected["acme"]
    with pytest.raises(ValueError, match="'acme' cannot be used: filtered: .*CORE_PLUGINS"):
        select_platform(discover(allowlist=[]), requested="acme")
