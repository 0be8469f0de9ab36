"""Sampler selection: the platform's preference, or `--sampler NAME`, through the registry."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest

from core.platforms.cpu import CpuPlatform
from core.plugins import PluginLookupError, PluginRegistry
from core.plugins.groups import SAMPLERS
from core.sample.sampler import DefaultSampler
from core.sample.selector import select_sampler_class


def core_samplers() -> PluginRegistry:
    points = [ep for ep in metadata.distribution("core").entry_points if ep.group == SAMPLERS]
    return PluginRegistry(points, allowlist=None)


def test_platform_preference_selects_the_default_sampler():
    assert select_sampler_class(CpuPlatform(), None, core_samplers()) == (
        "default",
        DefaultSampler,
    )


def test_unknown_forced_sampler_lists_the_installed_ones():
    with pytest.raises(PluginLookupError) as error:
        select_sampler_class(CpuPlatform(), "greedy", core_samplers())
    assert str(error.value) == "sampler 'greedy' is not installed; installed: default"
