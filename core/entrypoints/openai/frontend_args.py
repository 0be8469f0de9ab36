"""FrontendArgs: the HTTP server's own options, named as vLLM's `serve` flags.

They shape what `core serve` does around the engine (CORS, the URL prefix behind a proxy,
TLS, uvicorn's log level, request and stats logging), never the engine itself, so they
live apart from EngineArgs. Each field is its flag (flag_fields), declared once with its
default. Defaults are vLLM's: CORS allows every origin, method and header without
credentials, so a browser page that talked to vLLM talks to core.
Inconsistent or unusable values are a ValueError naming the flag, at startup.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import Field, dataclass, fields
from pathlib import Path
from typing import Any

import click

from core.entrypoints.chat_content import CONTENT_FORMATS, ContentFormat
from core.entrypoints.openai.flag_fields import click_options, flag, flag_name, from_options

__all__ = ["UVICORN_LOG_LEVELS", "FrontendArgs", "frontend_options"]

UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass(frozen=True)
class FrontendArgs:
    allowed_origins: tuple[str, ...] = flag(
        ("*",), "CORS origins allowed; a JSON list or values", multiple=True, metavar="ORIGIN..."
    )
    allowed_methods: tuple[str, ...] = flag(
        ("*",), "CORS methods allowed", multiple=True, metavar="METHOD..."
    )
    allowed_headers: tuple[str, ...] = flag(
        ("*",), "CORS request headers allowed", multiple=True, metavar="HEADER..."
    )
    allow_credentials: bool = flag(False, "CORS: allow credentials", is_flag=True)
    root_path: str = flag("", "URL prefix a proxy strips (ASGI)")
    ssl_keyfile: str | None = flag(None, "TLS private key file")
    ssl_certfile: str | None = flag(None, "TLS certificate file")
    uvicorn_log_level: str = flag(
        "info", "uvicorn's log level", type=click.Choice(UVICORN_LOG_LEVELS)
    )
    enable_log_requests: bool = flag(
        False, "log every request's prompt, parameters and adapter", is_flag=True
    )
    max_log_len: int | None = flag(
        None, "prompt characters and token ids a logged request shows (unset: all)", type=int
    )
    disable_log_stats: bool = flag(False, "no periodic log line of the engine's load", is_flag=True)
    enable_tokenizer_info_endpoint: bool = flag(
        False,
        "serve GET /tokenizer_info (the tokenizer's configuration, chat template included)",
        is_flag=True,
    )
    enable_server_load_tracking: bool = flag(
        False, "count the requests being served, for GET /load (0 without it)", is_flag=True
    )
    enable_force_include_usage: bool = flag(
        False,
        "send the usage chunk at the end of every stream, asked for (stream_options."
        "include_usage) or not",
        is_flag=True,
    )
    enable_prompt_tokens_details: bool = flag(
        False,
        "usage.prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache served",
        is_flag=True,
    )
    trust_request_chat_template: bool = flag(
        False,
        "render a chat_template sent with a request (without it: refused with a 400)",
        is_flag=True,
    )
    chat_template_content_format: ContentFormat = flag(
        "auto",
        "how the chat template sees message content: string (text, image placeholders "
        "first), openai (a list of parts), auto (openai when the template loops over it)",
        type=click.Choice(CONTENT_FORMATS),
    )
    # Parsing a body holds the event loop (about 30 ms per MiB of token ids), so bodies
    # are bounded: 2 MiB holds OpenAI's largest embedding batch or a 128k-token prompt.
    max_request_body_bytes: int = flag(
        2 * 1024 * 1024, "largest request body accepted, in bytes; a larger one is a 413", type=int
    )
    # Generous for any client (OpenAI's largest n is 128: eight times that in one batch),
    # finite for a hostile one (core.entrypoints.openai.sequence_limit).
    max_sequences_per_request: int = flag(
        1024,
        "most sequences one generation request may create (its prompts x n); more is a 400",
        type=int,
    )
    # vLLM's default, 0, aborts open requests at once.
    shutdown_timeout: float = flag(
        10.0,
        "on SIGTERM / SIGINT, how long open requests may finish before the rest are aborted "
        "(0 aborts them at once)",
        type=float,
        metavar="SECONDS",
    )
    # vLLM leaves /metrics open; core's key guards it unless this is set.
    metrics_without_api_key: bool = flag(
        False,
        "with --api-key, serve /metrics without the key (for Prometheus scrapers)",
        is_flag=True,
    )

    def __post_init__(self) -> None:
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ValueError("--ssl-keyfile and --ssl-certfile: TLS needs both")
        for flag_text, path in (
            ("--ssl-keyfile", self.ssl_keyfile),
            ("--ssl-certfile", self.ssl_certfile),
        ):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{flag_text} {path}: no such file")
        if self.chat_template_content_format not in CONTENT_FORMATS:
            raise ValueError(
                f"--chat-template-content-format {self.chat_template_content_format}: use one "
                f"of {', '.join(CONTENT_FORMATS)}"
            )
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
        if self.max_sequences_per_request < 1:
            raise ValueError(
                f"--max-sequences-per-request {self.max_sequences_per_request}: must be >= 1"
            )
        if self.root_path and not self.root_path.startswith("/"):
            raise ValueError(f"--root-path {self.root_path!r}: must start with '/'")
        if not self.shutdown_timeout >= 0:  # NaN too
            raise ValueError(f"--shutdown-timeout {self.shutdown_timeout}: must be >= 0")

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"

    @classmethod
    def from_cli(cls, options: dict[str, Any]) -> FrontendArgs:
        """FrontendArgs from click's parsed options (see flag_fields.from_options); each
        CORS list is flattened (see _list_values), and an empty one keeps the default."""
        given = dict(options)
        for f in _list_fields():
            values = given.pop(f.name, ())
            if values:
                given[f.name] = _list_values(flag_name(f), values)
        return from_options(cls, given)


def _list_fields() -> list[Field]:
    """The fields whose flag takes several values (the CORS lists)."""
    return [f for f in fields(FrontendArgs) if f.metadata["click"].get("multiple")]


def _list_values(flag_text: str, values: tuple[str, ...]) -> tuple[str, ...]:
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
            raise ValueError(f"{flag_text} {value}: not a JSON list ({exc})") from exc
        if not all(isinstance(item, str) for item in parsed):
            raise ValueError(f"{flag_text} {value}: the list must hold strings")
        flat += parsed
    return tuple(flat)


def frontend_options(command: Callable) -> Callable:
    """Decorate a click command with one option per FrontendArgs field."""
    return click_options(FrontendArgs)(command)
