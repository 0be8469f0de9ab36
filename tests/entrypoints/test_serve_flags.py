"""`core serve`'s flags: each declared once, as a field of EngineArgs, FrontendArgs or
ServeArgs, and listed once in --help, with the field's default shown there (never repeated
in the help text)."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import fields

from click.testing import CliRunner

from core.entrypoints.cli import cli, serve
from core.entrypoints.openai import api_server
from core.entrypoints.openai.flag_fields import flag_name
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.entrypoints.openai.serve_args import ServeArgs
from core.entrypoints.openai.tool_calls import ToolCalling

DECLARED = [*fields(ServeArgs), *fields(FrontendArgs)]


def help_entries() -> dict[str, list[str]]:
    """`core serve --help`'s options: first flag -> the entries starting with it (each
    entry's text with its continuation lines), on a terminal wide enough for one line."""
    result = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    options = result.output.split("\nOptions:\n", 1)[1].splitlines()
    entries: dict[str, list[str]] = {}
    for line in options:
        if line.startswith("  -"):
            entries.setdefault(line.split()[0], []).append(line.strip())
        else:
            entries[next(reversed(entries))][-1] += " " + line.strip()
    return entries


def shown_default(default: object) -> str | None:
    """What --help shows as the default of a field declared with `default`."""
    if default in (None, False, ()):
        return None
    if isinstance(default, tuple):
        return ", ".join(default)
    return '""' if default == "" else str(default)


def test_serve_help_lists_every_flag_once():
    entries = help_entries()
    flags = [param.opts[0] for param in serve.params if param.param_type_name == "option"]
    assert Counter(flags) == Counter(set(flags)), "a flag declared twice"
    assert sorted(entries) == sorted([*flags, "--help"])
    assert all(len(found) == 1 for found in entries.values()), entries


def test_serve_help_shows_each_declared_default():
    entries = help_entries()
    shown = {}
    for f in DECLARED:
        (entry,) = entries[flag_name(f)]
        expected = shown_default(f.default)
        if expected is None:
            assert "[default:" not in entry, entry
        else:
            assert entry.endswith(f"[default: {expected}]"), entry
            shown[flag_name(f)] = expected
    assert shown == {
        "--port": "8000",
        "--allowed-origins": "*",
        "--allowed-methods": "*",
        "--allowed-headers": "*",
        "--root-path": '""',
        "--uvicorn-log-level": "info",
        "--chat-template-content-format": "auto",
        "--max-request-body-bytes": "2097152",
        "--max-sequences-per-request": "1024",
        "--shutdown-timeout": "10.0",
    }


def test_no_help_text_repeats_a_default():
    assert [f.name for f in DECLARED if "default" in f.metadata["help"]] == []


def test_serve_without_flags_hands_the_server_the_declared_defaults(monkeypatch):
    handed = {}

    async def fake_server(engine_args, host, port, api_key, lora_modules, frontend, tool_calling):
        handed.update(host=host, port=port, api_key=api_key, lora_modules=lora_modules)
        handed.update(frontend=frontend, tool_calling=tool_calling)
        return 0

    monkeypatch.setattr(api_server, "serve", fake_server)
    core_logger = logging.getLogger("core")
    monkeypatch.setattr(core_logger, "level", core_logger.level)  # serve raises it
    result = CliRunner().invoke(serve, [], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    defaults = ServeArgs()
    assert handed == {
        "host": defaults.host,
        "port": defaults.port,
        "api_key": defaults.api_key,
        "lora_modules": defaults.lora_modules,
        "frontend": FrontendArgs(),
        "tool_calling": ToolCalling(),
    }
    assert (defaults.host, defaults.port, defaults.lora_modules) == (None, 8000, ())
