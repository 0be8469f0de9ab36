"""Dataclass fields that are `core serve` flags, each declared once.

A field made with `flag` is the flag `--<field-name>` (underscores as dashes): its default
is the flag's, and `click_options` generates the click option, whose help shows that
default, so no help text repeats it. `from_options` reads the parsed flags back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import Field, field, fields
from typing import Any, TypeVar

import click

__all__ = ["click_options", "flag", "flag_name", "from_options"]

_T = TypeVar("_T")


def flag(default: Any, help: str, **click_kwargs: Any) -> Any:
    """A dataclass field defaulting to `default`, declared as a flag with `help` and
    click's option settings (`type`, `is_flag`, `multiple`, `metavar`, `callback`...)."""
    return field(default=default, metadata={"help": help, "click": click_kwargs})


def flag_name(f: Field) -> str:
    return "--" + f.name.replace("_", "-")


def click_options(cls: type) -> Callable[[Callable], Callable]:
    """A decorator giving a click command one option per field of the dataclass `cls`, in
    field order, each with the field's default (shown in --help)."""

    def decorate(command: Callable) -> Callable:
        for f in reversed(fields(cls)):
            option = click.option(
                flag_name(f),
                f.name,
                default=f.default,
                show_default=True,
                help=f.metadata["help"],
                **f.metadata["click"],
            )
            command = option(command)
        return command

    return decorate


def from_options(cls: type[_T], options: Mapping[str, Any]) -> _T:
    """An instance of the dataclass `cls` from click's parsed options: keys of other flags
    are ignored; a field missing from `options` keeps its default."""
    return cls(**{f.name: options[f.name] for f in fields(cls) if f.name in options})
