"""The plugin registry against throw-away distributions discovered by importlib.metadata."""

from __future__ import annotations

import importlib.metadata as metadata
import sys

import pytest
from plugin_sources import API, available_platform, platform_plugin

from core.plugins import PLUGIN_API_VERSION, EntryState, PluginLookupError, PluginRegistry
from core.plugins.groups import ALL_GROUPS, ENDPOINTS, GENERAL, NOUNS, PLATFORMS, SAMPLERS
from core.plugins.registry import plugin_distributions_without_entries


def discover(allowlist: list[str] | None = None) -> PluginRegistry:
    points = [ep for group in ALL_GROUPS for ep in metadata.entry_points(group=group)]
    return PluginRegistry(points, allowlist)


ENDPOINT_PLUGIN = {
    "acme_routes/__init__.py": API,
    "acme_routes/routes.py": """
        from fastapi import APIRouter

        def router():
            r = APIRouter()

            @r.get("/acme")
            def acme():
                return {"acme": True}

            return r
    """,
}


def registry_of(*distributions: str, allowlist: list[str] | None = None) -> PluginRegistry:
    """A registry of only these distributions' entry points (other installed plugins aside)."""
    points = [
        ep
        for name in distributions
        for ep in metadata.distribution(name).entry_points
        if ep.group in ALL_GROUPS
    ]
    return PluginRegistry(points, allowlist)


SAMPLER_PLUGIN = {
    "acme_samplers/__init__.py": API,
    "acme_samplers/samplers.py": """
        from core.sample.sampler import DefaultSampler

        class Fast(DefaultSampler):
            pass

        class Odd:
            pass

        probe = "a string where a callable belongs"
    """,
}
SAMPLER_ENTRIES = {
    SAMPLERS: {"fast": "acme_samplers.samplers:Fast", "odd": "acme_samplers.samplers:Odd"},
    PLATFORMS: {"stringly": "acme_samplers.samplers:probe"},
}
BROKEN_SAMPLER = {
    "broken_samplers/__init__.py": API,
    "broken_samplers/samplers.py": "raise ImportError('libfast.so not found')\n",
}


def add_samplers(site) -> None:
    site.add("acme-samplers", SAMPLER_ENTRIES, SAMPLER_PLUGIN)
    site.add("broken-samplers", {SAMPLERS: {"broken": "broken_samplers.samplers:X"}},
             BROKEN_SAMPLER)  # fmt: skip


def test_every_group_has_a_noun():
    assert set(NOUNS) == set(ALL_GROUPS)
    assert {"core.spec_proposers", "core.tool_parsers", "core.lora"} <= set(ALL_GROUPS)


def test_require_returns_the_loaded_subclass(site):
    from core.sample.interface import Sampler

    add_samplers(site)
    cls = registry_of("acme-samplers").require(SAMPLERS, "fast", Sampler)
    assert cls.__name__ == "Fast" and issubclass(cls, Sampler)


def test_require_of_a_missing_name_lists_what_is_installed_and_why_not_usable(site):
    add_samplers(site)
    registry = registry_of(
        "core", "acme-samplers", "broken-samplers", allowlist=["broken-samplers"]
    )
    with pytest.raises(PluginLookupError):
        registry.require(SAMPLERS, "broken")
    with pytest.raises(PluginLookupError) as error:
        registry.require(SAMPLERS, "greedy")
    assert str(error.value) == (
        "sampler 'greedy' is not installed; installed: "
        "broken (failed: import failed: ImportError: libfast.so not found), default, "
        "fast (filtered: acme-samplers is not in CORE_PLUGINS), "
        "odd (filtered: acme-samplers is not in CORE_PLUGINS)"
    )
    assert (error.value.reason, error.value.entry) == ("not installed", None)


def test_require_of_the_wrong_type_marks_the_entry_failed(site):
    from core.sample.interface import Sampler

    add_samplers(site)
    registry = registry_of("acme-samplers")
    expected = "sampler 'odd' cannot be used: failed: Odd is not a subclass of Sampler"
    for _ in range(2):  # the second lookup reports the recorded failure
        with pytest.raises(PluginLookupError) as error:
            registry.require(SAMPLERS, "odd", Sampler)
        assert str(error.value) == expected
    entry = registry.get(SAMPLERS, "odd")
    assert entry.state is EntryState.FAILED and error.value.entry is entry


def test_require_without_a_base_wants_a_callable(site):
    add_samplers(site)
    registry = registry_of("core", "acme-samplers")
    assert registry.require(PLATFORMS, "cpu")() == "core.platforms.cpu.CpuPlatform"
    with pytest.raises(PluginLookupError) as error:
        registry.require(PLATFORMS, "stringly")
    assert str(error.value) == (
        "platform 'stringly' cannot be used: failed: a value of type str is not callable"
    )


def test_require_of_a_filtered_entry_names_core_plugins(site):
    add_samplers(site)
    registry = registry_of("acme-samplers", allowlist=[])
    with pytest.raises(PluginLookupError) as error:
        registry.require(SAMPLERS, "fast")
    assert str(error.value) == (
        "sampler 'fast' cannot be used: filtered: acme-samplers is not in CORE_PLUGINS"
    )
    assert "acme_samplers.samplers" not in sys.modules


def test_require_of_a_refused_entry_names_both_versions(site):
    modules = {**SAMPLER_PLUGIN, "acme_samplers/__init__.py": 'CORE_PLUGIN_API = ">=2.0"\n'}
    site.add("acme-samplers", SAMPLER_ENTRIES, modules)
    with pytest.raises(PluginLookupError) as error:
        registry_of("acme-samplers").require(SAMPLERS, "fast")
    assert str(error.value) == (
        "sampler 'fast' cannot be used: refused: requires core plugin API >=2.0, "
        f"core provides {PLUGIN_API_VERSION}"
    )
    assert error.value.reason.startswith("refused: ")


def test_core_defaults_come_through_the_same_groups(site):
    registry = discover()
    cpu = registry.get(PLATFORMS, "cpu")
    assert cpu is not None and cpu.distribution == "core"
    assert registry.load(cpu)() == "core.platforms.cpu.CpuPlatform"


def test_third_party_platform_is_discovered_with_its_distribution(site):
    site.add("acme-platform", {PLATFORMS: {"acme": "acme_platform.probe:probe"}},
             available_platform("acme_platform", "AcmePlatform"), version="2.3")  # fmt: skip
    entry = discover().get(PLATFORMS, "acme")
    assert (entry.distribution, entry.version, entry.state) == (
        "acme-platform",
        "2.3",
        EntryState.AVAILABLE,
    )


def test_loading_is_lazy_until_asked(site):
    site.add("acme-platform", {PLATFORMS: {"acme": "acme_platform.probe:probe"}},
             available_platform("acme_platform", "AcmePlatform"))  # fmt: skip
    registry = discover()
    assert "acme_platform.probe" not in sys.modules
    registry.load(registry.get(PLATFORMS, "acme"))
    assert "acme_platform.probe" in sys.modules
    assert "acme_platform.platform" not in sys.modules  # only the probe, not the class


def test_import_failure_is_recorded_not_raised(site):
    modules = {"broken_plugin/__init__.py": API,
               "broken_plugin/probe.py": "raise ImportError('libacme.so not found')\n"}  # fmt: skip
    site.add("broken-plugin", {PLATFORMS: {"broken": "broken_plugin.probe:probe"}}, modules)
    registry = discover()
    entry = registry.get(PLATFORMS, "broken")
    assert registry.load(entry) is None
    assert entry.state is EntryState.FAILED
    assert "ImportError: libacme.so not found" in entry.reason


def test_allowlist_filters_by_distribution_name(site):
    site.add("acme-platform", {PLATFORMS: {"acme": "acme_platform.probe:probe"}},
             available_platform("acme_platform", "AcmePlatform"))  # fmt: skip
    registry = discover(allowlist=["core-cuda"])
    entry = registry.get(PLATFORMS, "acme")
    assert entry.state is EntryState.FILTERED
    assert "not in CORE_PLUGINS" in entry.reason
    assert registry.load(entry) is None
    assert registry.get(PLATFORMS, "cpu").state is EntryState.AVAILABLE  # core always on
    assert discover(allowlist=["Acme_Platform"]).get(PLATFORMS, "acme").state is (
        EntryState.AVAILABLE
    )


def test_empty_allowlist_admits_only_core(site):
    site.add("acme-platform", {PLATFORMS: {"acme": "acme_platform.probe:probe"}},
             available_platform("acme_platform", "AcmePlatform"))  # fmt: skip
    registry = discover(allowlist=[])
    assert [e.name for e in registry.admitted(PLATFORMS)] == ["cpu"] or all(
        e.is_core for e in registry.admitted(PLATFORMS)
    )
    assert registry.get(PLATFORMS, "acme").state is EntryState.FILTERED


def test_endpoint_plugin_is_denied_unless_allowlisted(site):
    site.add("acme-routes", {ENDPOINTS: {"acme": "acme_routes.routes:router"}}, ENDPOINT_PLUGIN)
    denied = discover(allowlist=None)
    entry = denied.get(ENDPOINTS, "acme")
    assert entry.state is EntryState.FILTERED
    assert denied.load(entry) is None
    assert "acme_routes.routes" not in sys.modules
    allowed = discover(allowlist=["acme-routes"])
    router = allowed.load(allowed.get(ENDPOINTS, "acme"))()
    assert [route.path for route in router.routes] == ["/acme"]


def test_incompatible_api_is_refused_with_both_versions(site):
    modules = available_platform("future_platform", "FuturePlatform")
    modules["future_platform/__init__.py"] = 'CORE_PLUGIN_API = ">=2.0"\n'
    site.add("future-platform", {PLATFORMS: {"future": "future_platform.probe:probe"}}, modules)
    registry = discover()
    entry = registry.get(PLATFORMS, "future")
    assert registry.load(entry) is None
    assert entry.state is EntryState.REFUSED
    assert ">=2.0" in entry.reason and PLUGIN_API_VERSION in entry.reason
    assert "future_platform.probe" not in sys.modules


def test_undeclared_api_loads_with_a_warning(site):
    modules = available_platform("old_platform", "OldPlatform")
    modules["old_platform/__init__.py"] = ""
    site.add("old-platform", {PLATFORMS: {"old": "old_platform.probe:probe"}}, modules)
    registry = discover()
    entry = registry.get(PLATFORMS, "old")
    assert registry.load(entry) is not None
    assert entry.state is EntryState.LOADED
    assert "no CORE_PLUGIN_API" in entry.warning


def test_duplicate_entry_name_is_skipped_naming_the_first(site):
    site.add("acme-platform", {PLATFORMS: {"acme": "acme_platform.probe:probe"}},
             available_platform("acme_platform", "AcmePlatform"))  # fmt: skip
    site.add("copycat", {PLATFORMS: {"acme": "copycat.probe:probe"}},
             available_platform("copycat", "Copycat"))  # fmt: skip
    registry = discover()
    kept = registry.get(PLATFORMS, "acme")
    skipped = [e for e in registry.all_entries() if e.name == "acme" and e is not kept]
    assert len(skipped) == 1
    assert skipped[0].state is EntryState.FAILED
    assert kept.distribution in skipped[0].reason


def test_general_plugins_run_once_per_process(site, tmp_path):
    counter = tmp_path / "calls"
    modules = {
        "counting/__init__.py": API,
        "counting/setup.py": f"""
            def setup():
                with open({str(counter)!r}, "a") as f:
                    f.write("x")
        """,
        "failing/__init__.py": API,
        "failing/setup.py": "def setup():\n    raise RuntimeError('boom')\n",
    }
    site.add("counting", {GENERAL: {"count": "counting.setup:setup"}}, modules)
    site.add("failing", {GENERAL: {"fail": "failing.setup:setup"}}, {})
    registry = discover()
    registry.run_general_plugins()
    registry.run_general_plugins()
    assert counter.read_text() == "x"
    failed = registry.get(GENERAL, "fail")
    assert failed.state is EntryState.FAILED and "RuntimeError: boom" in failed.reason


def test_a_general_plugin_that_fails_to_import_is_logged_and_the_others_still_run(
    site, tmp_path, caplog
):
    counter = tmp_path / "calls"
    modules = {
        "unbuilt/__init__.py": API,
        "unbuilt/ops.py": "raise ImportError('unbuilt._C: undefined symbol')\n",
        "counting/__init__.py": API,
        "counting/setup.py": f"""
            def setup():
                with open({str(counter)!r}, "a") as f:
                    f.write("x")
        """,
    }
    site.add("unbuilt", {GENERAL: {"kernels": "unbuilt.ops:register"}}, modules)
    site.add("counting", {GENERAL: {"count": "counting.setup:setup"}}, {})
    registry = registry_of("unbuilt", "counting")
    with caplog.at_level("WARNING", logger="core.plugins.registry"):
        registry.run_general_plugins()
    assert counter.read_text() == "x"
    failed = registry.get(GENERAL, "kernels")
    reason = "import failed: ImportError: unbuilt._C: undefined symbol"
    assert (failed.state, failed.reason) == (EntryState.FAILED, reason)
    assert f"plugin kernels from distribution unbuilt (group core.general) failed: {reason}" in (
        caplog.text
    )


def test_probe_that_raises_is_not_fatal(site):
    site.add("flaky", {PLATFORMS: {"flaky": "flaky.probe:probe"}},
             platform_plugin("flaky", "Flaky", "raise OSError('driver crashed')"))  # fmt: skip
    from core.platforms import select_platform

    choice = select_platform(discover())
    assert choice.name == "cpu"
    assert "OSError: driver crashed" in choice.rejected["flaky"]


def test_installed_plugin_without_entries_is_listed(site):
    site.add("idle-plugin", {}, {"idle_plugin/__init__.py": API})
    names = [name for name, _ in plugin_distributions_without_entries(discover())]
    assert "idle-plugin" in names


@pytest.mark.parametrize(("kwargs", "ok"), [({"threshold": 2}, True), ({"treshold": 2}, False)])
def test_component_config_must_fit_the_constructor(kwargs, ok):
    from core.plugins import build_component

    class Component:
        def __init__(self, threshold: int = 1) -> None:
            self.threshold = threshold

    if ok:
        assert build_component(Component, kwargs, "--sampler-config").threshold == 2
    else:
        with pytest.raises(ValueError, match="--sampler-config"):
            build_component(Component, kwargs, "--sampler-config")


def test_component_config_is_refused_for_a_module_without_its_own_init():
    from torch import nn

    from core.plugins import build_component

    class Component(nn.Module):  # inherits nn.Module's permissive (*args, **kwargs)
        pass

    with pytest.raises(ValueError, match="--sampler-config does not fit Component"):
        build_component(Component, {"x": 1}, "--sampler-config")
