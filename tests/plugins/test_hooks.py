import logging

import pluggy

from core.plugins import hookimpl, hookspecs
from core.plugins.hooks import call_each


class _Broken:
    @hookimpl
    def core_add_commands(self, cli):
        raise RuntimeError("broken plugin")


class _Working:
    def __init__(self) -> None:
        self.seen = []

    @hookimpl
    def core_add_commands(self, cli):
        self.seen.append(cli)


def _manager(*plugins: tuple[str, object]) -> pluggy.PluginManager:
    manager = pluggy.PluginManager("core")
    manager.add_hookspecs(hookspecs)
    for name, plugin in plugins:
        manager.register(plugin, name=name)
    return manager


def test_a_raising_implementation_does_not_stop_the_others(caplog):
    working = _Working()
    # Registered last, so pluggy calls the broken one first.
    manager = _manager(("acme-working", working), ("acme-broken", _Broken()))
    with caplog.at_level(logging.ERROR):
        call_each(manager, "core_add_commands", cli="the-cli")
    assert working.seen == ["the-cli"]
    assert "hook core_add_commands of plugin acme-broken failed" in caplog.text


def test_implementations_receive_only_the_arguments_they_name():
    class _Lifecycle:
        def __init__(self) -> None:
            self.configs = []

        @hookimpl
        def core_engine_started(self, config):
            self.configs.append(config)

    plugin = _Lifecycle()
    call_each(_manager(("acme", plugin)), "core_engine_started", config={"k": 1})
    assert plugin.configs == [{"k": 1}]
