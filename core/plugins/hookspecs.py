"""Behaviour hooks plugins may implement (pluggy project "core"), grouped by lifecycle.

A plugin distribution exposes a module of `@hookimpl` functions through a `core.hooks`
entry point. Every hook is called on all implementations unless it says otherwise; an
implementation may accept a subset of the arguments, as pluggy allows.
"""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("core")
hookimpl = pluggy.HookimplMarker("core")


# -- CLI process -----------------------------------------------------------------------------


@hookspec
def core_add_commands(cli: Any) -> None:
    """Add commands to the `core` click group `cli` (`cli.add_command(...)`).

    Runs once in the CLI process while the group is built, before arguments are parsed.
    Returns nothing; a command whose name already exists is replaced, so choose a prefix.
    """


# -- frontend process ------------------------------------------------------------------------


@hookspec
def core_adjust_config(config: Any) -> None:
    """Adjust the EngineConfig `config` in place before it is frozen.

    Runs once per engine in the frontend process (API server or the process that builds
    `LLM`), after user flags and the platform's defaults (its -O level) are applied; what
    derives from them (token budgets, the executor, what the level turns on) is filled
    afterwards from what the hook leaves, and the result is validated as flags are.
    Explicit user flags should be respected. Returns nothing; raise ValueError to reject
    the configuration.
    """


# -- engine-core process ---------------------------------------------------------------------


@hookspec
def core_engine_started(config: Any) -> None:
    """Called when the engine core has loaded the model and is ready to schedule.

    Runs in the engine-core process with the frozen EngineConfig; returns nothing.
    Exceptions are logged and ignored: a hook cannot stop the engine from serving.
    """


@hookspec
def core_engine_stopped(config: Any) -> None:
    """Called once when the engine core shuts down (normally or after an error).

    Runs in the engine-core process with the frozen EngineConfig; returns nothing.
    Exceptions are logged and ignored.
    """
