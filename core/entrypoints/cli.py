"""The `core` command line (click). Plugins add commands through `core_add_commands`."""

from __future__ import annotations

import logging
import sys

import click

import core
from core import envs
from core.engine_args import engine_options


@click.group()
@click.version_option(core.__version__, prog_name="core")
def cli() -> None:
    """core: an LLM inference and serving engine."""


@cli.command()
def plugins() -> None:
    """List every discovered plugin entry point and what was selected."""
    from core.entrypoints.reports import plugins_report

    click.echo(plugins_report())


@cli.command()
def info() -> None:
    """Show the platform chosen and why, rejected platforms, torch and memory."""
    from core.entrypoints.reports import info_report

    click.echo(info_report())


def _not_available(name: str, issue: str) -> click.Command:
    @click.command(
        name=name,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        help=f"(not available yet: {issue})",
    )
    def command() -> None:
        raise click.ClickException(f"`core {name}` is not available yet ({issue})")

    return command


for _name, _issue in (
    ("serve", "the OpenAI-compatible server comes with the server work"),
    ("bench", "benchmarks come with the benchmark work"),
):
    cli.add_command(_not_available(_name, _issue))


@cli.command()
@click.argument("prompt")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=None, help="0 for greedy")
@click.option("--top-p", type=float, default=None)
@click.option("--top-k", type=int, default=None)
@click.option("--min-p", type=float, default=None)
@click.option("--repetition-penalty", type=float, default=None)
@click.option("--stop", multiple=True, help="a stop string (repeatable)")
@click.option("--sampling-seed", type=int, default=None, help="the request's own seed")
@click.option("--chat/--no-chat", default=True, show_default=True, help="apply the chat template")
@engine_options
def generate(prompt: str, **options) -> None:
    """Stream a completion of PROMPT to stdout."""
    from core.entrypoints.generate import stream_completion

    try:
        stream_completion(prompt, options)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc


def main() -> None:
    logging.basicConfig(
        level=logging.INFO if envs.trace_plugins() else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from core.plugins.hooks import get_hook_manager

    get_hook_manager().hook.core_add_commands(cli=cli)
    cli(prog_name="core")


__all__ = ["cli", "main"]
