"""ServeArgs: the flags of `core serve` that are neither the engine's (EngineArgs) nor the
HTTP frontend's behaviour (FrontendArgs), named as vLLM's: where the server listens, its
API key, the LoRA adapters served from the start, how tool calls are read, and the
headless mode. Each field is its flag (flag_fields), declared once with its default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from core.entrypoints.openai.flag_fields import click_options, flag, from_options

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from core.entrypoints.openai.serving_models import LoRAModulePath

__all__ = ["ServeArgs", "serve_options"]


def _lora_modules(_: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple:
    # Imported here: the server's modules are heavy, and `core --help` needs none of them.
    from core.entrypoints.openai.serving_models import LoRAModulePath

    try:
        return tuple(LoRAModulePath.parse(value) for value in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


@dataclass(frozen=True)
class ServeArgs:
    host: str | None = flag(None, "interface to bind (unset: all)")
    port: int = flag(8000, "port to listen on", type=int)
    api_key: str | None = flag(
        None, "require 'Authorization: Bearer KEY' on every route but /health and /version"
    )
    lora_modules: tuple[LoRAModulePath, ...] = flag(
        (),
        'LoRA adapters to serve (needs --enable-lora), each name=path or JSON {"name": ..., '
        '"path": ..., "base_model_name": ...}; one flag takes several',
        multiple=True,
        callback=_lora_modules,
        metavar="NAME=PATH...",
    )
    headless: bool = flag(
        False,
        "only this node's data-parallel engine cores (from --data-parallel-start-rank), "
        "connecting to the API server's node at --data-parallel-address",
        is_flag=True,
    )
    enable_auto_tool_choice: bool = flag(
        False,
        'let the model decide to call tools (tool_choice "auto"); needs --tool-call-parser',
        is_flag=True,
    )
    tool_call_parser: str | None = flag(
        None,
        "how tool calls are read from the output: hermes, llama3_json, mistral, pythonic, "
        "or a plugin's (entry-point group core.tool_parsers)",
        metavar="NAME",
    )

    @classmethod
    def from_cli(cls, options: Mapping[str, Any]) -> ServeArgs:
        """ServeArgs from click's parsed options (see flag_fields.from_options)."""
        return from_options(cls, options)


def serve_options(command: Callable) -> Callable:
    """Decorate a click command with one option per ServeArgs field."""
    return click_options(ServeArgs)(command)
