"""The `core` command line (click). Plugins add commands through `core_add_commands`."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

import core
from core import envs
from core.engine_args import EngineArgs, engine_options
from core.entrypoints.bench.cli import bench
from core.entrypoints.chat_client import chat, complete
from core.entrypoints.openai.frontend_args import FrontendArgs, frontend_options
from core.entrypoints.openai.serve_args import ServeArgs, serve_options
from core.entrypoints.run_batch import run_batch


@click.group()
@click.version_option(core.__version__, prog_name="core")
def cli() -> None:
    """core: an LLM inference and serving engine."""


@cli.command()
@click.option("--hooks", is_flag=True, help="list the hook specs and who implements each")
def plugins(hooks: bool) -> None:
    """List every discovered plugin entry point and what was selected (or, with --hooks,
    every hook spec and the plugins implementing it)."""
    from core.entrypoints.reports import hooks_report, plugins_report

    click.echo(hooks_report() if hooks else plugins_report())


@cli.command()
@click.option("--tensor-parallel-size", "tp", type=click.IntRange(min=1), default=1)
@click.option("--pipeline-parallel-size", "pp", type=click.IntRange(min=1), default=1)
@click.option("--data-parallel-size", "dp", type=click.IntRange(min=1), default=1)
def info(tp: int, pp: int, dp: int) -> None:
    """Show the platform chosen and why, rejected platforms, torch and memory, and the
    rank layout of the parallel sizes given."""
    from core.entrypoints.reports import info_report, rank_layout_lines

    click.echo(info_report())
    click.echo("\n".join(rank_layout_lines(tp, pp, dp)))


cli.add_command(bench)
cli.add_command(chat)
cli.add_command(complete)
cli.add_command(run_batch)


@cli.command(name="disagg-proxy")
@click.option(
    "--prefill",
    "prefill_urls",
    metavar="URL",
    multiple=True,
    required=True,
    help="a prefill engine's base URL (repeatable; taken in turn)",
)
@click.option(
    "--decode",
    "decode_urls",
    metavar="URL",
    multiple=True,
    required=True,
    help="a decode engine's base URL (repeatable; taken in turn)",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
def disagg_proxy(
    prefill_urls: tuple[str, ...], decode_urls: tuple[str, ...], host: str, port: int
) -> None:
    """Serve an OpenAI-compatible API over prefill and decode engines (`core serve` with a
    KV connector): each request is prefilled on one engine, then decoded on another that
    pulls its KV."""
    # FastAPI, uvicorn and httpx load only for this command: `core --help` stays quick.
    from core.entrypoints.disagg_proxy import serve_proxy

    serve_proxy(prefill_urls, decode_urls, host, port)


class _ServeCommand(click.Command):
    """`core serve`, whose options that take several values (--lora-modules, the CORS
    lists) take them after one flag as vLLM's do (`--lora-modules a=/x b=/y`), besides
    being repeatable."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for param in self.params:
            if isinstance(param, click.Option) and param.multiple:
                for flag in param.opts:
                    args = _spread_values(args, flag)
        return super().parse_args(ctx, args)


def _spread_values(args: list[str], flag: str) -> list[str]:
    """`FLAG a b --x c` -> `FLAG a FLAG b --x c`: each further value up to the next option
    gets its own FLAG (so a MODEL argument goes before FLAG, as with vLLM's nargs="+")."""
    spread: list[str] = []
    taking = False
    for i, arg in enumerate(args):
        if arg.startswith("-"):
            taking = arg == flag or arg.startswith(f"{flag}=")
            spread.append(arg)
        elif taking and args[i - 1] != flag:
            spread += [flag, arg]
        else:
            spread.append(arg)
    return spread


@cli.command(cls=_ServeCommand)
@click.argument("model_tag", metavar="[MODEL]", required=False)
@serve_options
@frontend_options
@engine_options
def serve(model_tag: str | None, **options):
    """Serve MODEL (default: SmolLM2-135M-Instruct) over an OpenAI-compatible API.

    SIGTERM or SIGINT drains open requests for --shutdown-timeout seconds, aborts the rest
    and exits 0. If the engine core dies, in-flight requests fail and the server exits 1
    (CORE_KEEP_ALIVE_ON_ENGINE_DEATH=1: it stays up answering 503)."""
    import asyncio

    from core.entrypoints.openai.api_server import serve as run_server
    from core.entrypoints.openai.tool_calls import ToolCalling
    from core.process_lifetime import skip_exit_collection

    logging.getLogger("core").setLevel(logging.INFO)
    if model_tag:
        options["model"] = model_tag
    try:
        engine_args = EngineArgs.from_cli(options)
        frontend = FrontendArgs.from_cli(options)
        args = ServeArgs.from_cli(options)
        tool_calling = ToolCalling.from_flags(args.enable_auto_tool_choice, args.tool_call_parser)
        if args.headless:
            from core.entrypoints.headless import run_headless

            sys.exit(run_headless(engine_args))
        exit_code = asyncio.run(
            run_server(
                engine_args,
                args.host,
                args.port,
                args.api_key,
                args.lora_modules,
                frontend,
                tool_calling,
            )
        )
        skip_exit_collection()  # the engine core is stopped: nothing is left to clean
        sys.exit(exit_code)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        pass


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


@cli.command()
@click.argument("method")
@click.argument("paths", nargs=-1, required=True, metavar="[MODEL] OUT_DIR")
@click.option("--group-size", type=int, default=None, help="inputs per quantization group")
@click.option(
    "--option",
    "raw_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="a setting of the method; VALUE is JSON, else taken as a string (repeatable)",
)
def quantize(
    method: str, paths: tuple[str, ...], group_size: int | None, raw_options: tuple[str, ...]
) -> None:
    """Write MODEL (default: SmolLM2-135M-Instruct) quantized with METHOD (e.g. awq) to
    OUT_DIR, a Hugging Face directory that `core serve OUT_DIR` loads."""
    from core.model_loader import resolve_model
    from core.quantization.selector import quantization_config_class

    if len(paths) > 2:
        raise click.UsageError(f"expected [MODEL] OUT_DIR, got {len(paths)} paths")
    options = dict(_key_value(raw) for raw in raw_options)
    if group_size is not None:
        options["group_size"] = group_size
    try:
        config_class = quantization_config_class(method, asked_by="core quantize")
        checkpoint = resolve_model(paths[0] if len(paths) == 2 else None)
        config_class.quantize_checkpoint(checkpoint, Path(paths[-1]), options)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {paths[-1]}")


def _key_value(raw: str) -> tuple[str, object]:
    """`--option KEY=VALUE`: VALUE parsed as JSON, kept as a plain string when it is not."""
    key, sep, value = raw.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{raw!r} is not KEY=VALUE", param_hint="--option")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main() -> None:
    logging.basicConfig(
        level=logging.INFO if envs.trace_plugins() else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from core.plugins.hooks import call_each, get_hook_manager

    call_each(get_hook_manager(), "core_add_commands", cli=cli)
    cli(prog_name="core")


__all__ = ["cli", "main"]
