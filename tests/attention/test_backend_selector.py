"""The attention selector walks the platform's preferences and says why it skipped each."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest
import torch
from plugin_sources import API

from core.attention.interface import (
    AttentionCapabilities,
    AttentionRequirements,
    AttentionType,
)
from core.attention.selector import select_attention_backend
from core.platforms.cpu import CpuPlatform
from core.plugins import PluginLookupError, PluginRegistry
from core.plugins.groups import ALL_GROUPS, ATTENTION_BACKENDS

BACKENDS = {
    "toy_backends/__init__.py": API,
    "toy_backends/backends.py": """
        import torch
        from core.attention.interface import AttentionBackend, AttentionCapabilities

        class _Toy(AttentionBackend):
            get_impl_cls = get_builder_cls = staticmethod(lambda: None)
            get_kv_cache_shape = staticmethod(lambda n, b, h, d: (n, 2, b, h, d))

        class Half(_Toy):
            name = "half"
            capabilities = AttentionCapabilities(dtypes=frozenset({torch.float16}))

        class Small(_Toy):
            name = "small"
            capabilities = AttentionCapabilities(
                dtypes=frozenset({torch.float32}), head_sizes=frozenset({64, 128}),
                block_sizes=frozenset({16}))

        class Anything(_Toy):
            name = "anything"
            capabilities = AttentionCapabilities(dtypes=frozenset({torch.float32}))
    """,
}


class ToyPlatform(CpuPlatform):
    preferred_attention_backends = ("missing", "half", "small", "anything")


@pytest.fixture
def registry(site) -> PluginRegistry:
    names = ("half", "small", "anything")
    site.add("toy-backends", {ATTENTION_BACKENDS: {n: f"toy_backends.backends:{n.title()}"
                                                   for n in names}}, BACKENDS)  # fmt: skip
    points = [ep for group in ALL_GROUPS for ep in metadata.entry_points(group=group)]
    return PluginRegistry(points, None)


def req(head_size: int = 64, block_size: int = 16) -> AttentionRequirements:
    return AttentionRequirements(dtype=torch.float32, head_size=head_size, block_size=block_size)


def test_first_capable_backend_in_preference_order_wins(registry):
    choice = select_attention_backend(ToyPlatform(), req(), registry=registry)
    assert choice.name == "small"
    assert choice.rejected["missing"] == "not installed"
    assert "dtype torch.float32 not in" in choice.rejected["half"]


def test_capability_mismatch_falls_back_with_the_reason(registry):
    choice = select_attention_backend(ToyPlatform(), req(head_size=80), registry=registry)
    assert choice.name == "anything"
    assert choice.rejected["small"] == "head size 80 not in [64, 128]"
    other = select_attention_backend(ToyPlatform(), req(block_size=32), registry=registry)
    assert other.rejected["small"] == "block size 32 not in [16]"


def test_forced_backend_that_cannot_serve_is_an_error_with_the_reason(registry):
    with pytest.raises(ValueError, match="'half' cannot serve.*dtype torch.float32 not in"):
        select_attention_backend(ToyPlatform(), req(), forced="half", registry=registry)
    assert (
        select_attention_backend(ToyPlatform(), req(), forced="anything", registry=registry).name
        == "anything"
    )


def test_forced_backend_that_is_not_installed_lists_the_installed_ones(registry):
    with pytest.raises(PluginLookupError) as error:
        select_attention_backend(ToyPlatform(), req(), forced="flsh", registry=registry)
    head, installed = str(error.value).split("; installed: ")
    assert head == "attention backend 'flsh' is not installed"
    assert {"anything", "half", "small", "torch_ref"} <= set(installed.split(", "))


def test_no_capable_backend_lists_every_reason(registry):
    class PickyPlatform(CpuPlatform):
        preferred_attention_backends = ("half", "small")

    with pytest.raises(ValueError, match="half: dtype.*small: head size 80"):
        select_attention_backend(PickyPlatform(), req(head_size=80), registry=registry)


def test_capabilities_check_kv_dtype_and_attention_type():
    caps = AttentionCapabilities(dtypes=frozenset({torch.float32}))
    assert caps.check(req()) is None
    fp8 = AttentionRequirements(torch.float32, 64, 16, kv_cache_dtype="fp8")
    assert "KV-cache dtype 'fp8'" in caps.check(fp8)
    encoder = AttentionRequirements(torch.float32, 64, 16, attn_type=AttentionType.ENCODER)
    assert caps.check(encoder) == "attention type encoder not supported"
