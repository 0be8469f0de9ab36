"""FrontendArgs: the HTTP server's own options, named as vLLM's `serve` flags.

They shape what `core serve` does around the engine (CORS, the URL prefix behind a proxy,
TLS, uvicorn's log level, request and stats logging), never the engine itself, so they
live apart from EngineArgs. Defaults are vLLM's: CORS allows every origin, method and
header without credentials, so a browser page that talked to vLLM talks to core.
Inconsistent or unusable values are a ValueError naming the flag, at startup.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import click

__all__ = ["UVICORN_LOG_LEVELS", "FrontendArgs", "frontend_options"]

UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
_LIST_FLAGS = {
    "allowed_origins": "--allowed-origins",
    "allowed_methods": "--allowed-methods",
    "allowed_headers": "--allowed-headers",
}


@dataclass(frozen=True)
class FrontendArgs:
    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    root_path: str = ""  # the prefix a proxy strips before forwarding (ASGI root_path)
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    uvicorn_log_level: str = "info"
    enable_log_requests: bool = False
    max_log_len: int | None = None  # prompt characters and token ids per logged request
    disable_log_stats: bool = False  # no periodic engine-load lines (stats_logger)
    trust_request_chat_template: bool = False  # render a request's own chat_template
    # Parsing a body holds the event loop (about 30 ms per MiB of token ids), so bodies
    # are bounded: 2 MiB holds OpenAI's largest embedding batch or a 128k-token prompt.
    max_request_body_bytes: int = 2 * 1024 * 1024
    # Seconds open requests may drain on SIGTERM / SIGINT (vLLM's default, 0, aborts them).
    shutdown_timeout: float = 10.0
    # With --api-key, /metrics answers scrapers without the key (vLLM leaves it open).
    metrics_without_api_key: bool = False

    def __post_init__(self) -> None:
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ValueError("--ssl-keyfile and --ssl-certfile: TLS needs both")
        for flag, path in (
            ("--ssl-keyfile", self.ssl_keyfile),
            ("--ssl-certfile", self.ssl_certfile),
        ):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{flag} {path}: no such file")
        if self.uvicorn_log_level not in UVICORN_LOG_LEVELS:
            raise ValueError(
                f"--uvicorn-log-level {self.uvicorn_log_level}: use one of "
                f"{', '.join(UVICORN_LOG_LEVELS)}"
            )
        if self.max_log_len is not None:
            if self.max_log_len < 0:
                raise ValueError(f"--max-log-len {self.max_log_len}: must be >= 0")
            if not self.enable_log_requests:
                raise ValueError(
                    "--max-log-len: requests are only logged with --enable-log-requests"
                )
        if self.max_request_body_bytes <= 0:
            raise ValueError(f"--max-request-body-bytes {self.max_request_body_bytes}: must be > 0")
        if self.root_path and not self.root_path.startswith("/"):
            raise ValueError(f"--root-path {self.root_path!r}: must start with '/'")
        if not self.shutdown_timeout >= 0:  # NaN too
            raise ValueError(f"--shutdown-timeout {self.shutdown_timeout}: must be >= 0")

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"

    @classmethod
    def from_cli(cls, options: dict[str, Any]) -> FrontendArgs:
        """FrontendArgs from click's parsed options (extra keys are ignored; a flag not
        given keeps the default)."""
        given = {f.name: options[f.name] for f in fields(cls) if options.get(f.name) is not None}
        for name, flag in _LIST_FLAGS.items():
            values = given.pop(name, ())
            if values:
                given[name] = _list_values(flag, values)
        return cls(**given)


def _list_values(flag: str, values: tuple[str, ...]) -> tuple[str, ...]:
    """vLLM takes a JSON list (`'["http://a", "http://b"]'`) or, in newer releases, plain
    values after the flag; both are accepted, and flattened in order."""
    flat: list[str] = []
    for value in values:
        if not value.lstrip().startswith("["):
            flat.append(value)
            continue
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{flag} {value}: not a JSON list ({exc})") from exc
        if not all(isinstance(item, str) for item in parsed):
            raise ValueError(f"{flag} {value}: the list must hold strings")
        flat += parsed
    return tuple(flat)


def frontend_options(command: Callable) -> Callable:
    """Decorate a click command with one option per FrontendArgs field."""
    options = [
        click.option(
            "--allowed-origins", multiple=True, metavar="ORIGIN...",
            help="CORS origins allowed (default: *); a JSON list or values",
        ),
        click.option(
            "--allowed-methods", multiple=True, metavar="METHOD...",
            help="CORS methods allowed (default: *)",
        ),
        click.option(
            "--allowed-headers", multiple=True, metavar="HEADER...",
            help="CORS request headers allowed (default: *)",
        ),
        click.option(
            "--allow-credentials", is_flag=True, default=None, help="CORS: allow credentials"
        ),
        click.option("--root-path", default=None, help="URL prefix a proxy strips (ASGI)"),
        click.option("--ssl-keyfile", default=None, help="TLS private key file"),
        click.option("--ssl-certfile", default=None, help="TLS certificate file"),
        click.option(
            "--uvicorn-log-level", type=click.Choice(UVICORN_LOG_LEVELS), default=None,
            help="uvicorn's log level (default: info)",
        ),
        click.option(
            "--enable-log-requests", is_flag=True, default=None,
            help="log every request's prompt, parameters and adapter",
        ),
        click.option(
            "--max-log-len", type=int, default=None,
            help="prompt characters and token ids a logged request shows (default: all)",
        ),
        click.option(
            "--disable-log-stats", is_flag=True, default=None,
            help="no periodic log line of the engine's load",
        ),
        click.option(
            "--trust-request-chat-template", is_flag=True, default=None,
            help="render a chat_template sent with a request (default: refused with a 400)",
        ),
        click.option(
            "--max-request-body-bytes", type=int, default=None,
            help="largest request body accepted; a larger one is a 413 (default: 2 MiB)",
        ),
        click.option(
            "--metrics-without-api-key", is_flag=True, default=None,
            help="with --api-key, serve /metrics without the key (for Prometheus scrapers)",
        ),
        click.option(
            "--shutdown-timeout", type=float, default=None, metavar="SECONDS",
            help="on SIGTERM / SIGINT, how long open requests may finish before the rest "
            "are aborted (default: 10; 0 aborts them at once)",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command
