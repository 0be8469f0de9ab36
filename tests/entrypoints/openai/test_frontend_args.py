"""FrontendArgs: the server's own flags are checked at startup and reach uvicorn."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from fastapi import FastAPI

from core.entrypoints.cli import cli
from core.entrypoints.openai.api_server import uvicorn_config
from core.entrypoints.openai.frontend_args import FrontendArgs


def test_tls_needs_both_files_and_each_must_exist(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    key.write_text("k")
    with pytest.raises(ValueError, match="--ssl-keyfile and --ssl-certfile: TLS needs both"):
        FrontendArgs(ssl_keyfile=str(key))
    with pytest.raises(ValueError, match=f"--ssl-certfile {cert}: no such file"):
        FrontendArgs(ssl_keyfile=str(key), ssl_certfile=str(cert))


def test_root_path_must_be_absolute_and_log_len_non_negative():
    with pytest.raises(ValueError, match="--root-path 'llm': must start with '/'"):
        FrontendArgs(root_path="llm")
    with pytest.raises(ValueError, match="--max-log-len -1: must be >= 0"):
        FrontendArgs(enable_log_requests=True, max_log_len=-1)


@pytest.mark.parametrize("size", [0, -5])
def test_the_body_limit_must_be_positive(size):
    with pytest.raises(ValueError, match=f"--max-request-body-bytes {size}: must be > 0"):
        FrontendArgs(max_request_body_bytes=size)


@pytest.mark.parametrize("limit", [0, -5])
def test_the_sequence_limit_must_be_positive(limit):
    with pytest.raises(ValueError, match=f"--max-sequences-per-request {limit}: must be >= 1"):
        FrontendArgs(max_sequences_per_request=limit)


def test_cli_lists_flatten_json_lists_and_plain_values_in_order():
    args = FrontendArgs.from_cli(
        {"allowed_origins": ('["https://a", "https://b"]', "https://c"), "allowed_headers": ()}
    )
    assert args.allowed_origins == ("https://a", "https://b", "https://c")
    assert args.allowed_headers == ("*",)  # not given: vLLM's default
    with pytest.raises(ValueError, match="--allowed-methods \\[1\\]: the list must hold strings"):
        FrontendArgs.from_cli({"allowed_methods": ("[1]",)})


def test_uvicorn_gets_tls_and_log_level_and_the_app_the_root_path(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    key.write_text("k")
    cert.write_text("c")
    frontend = FrontendArgs(
        root_path="/llm",
        ssl_keyfile=str(key),
        ssl_certfile=str(cert),
        uvicorn_log_level="warning",
    )
    config = uvicorn_config(FastAPI(), "127.0.0.1", 8123, frontend)
    # uvicorn would prefix root_path to every request's path; the app takes it instead.
    assert (config.host, config.port, config.root_path) == ("127.0.0.1", 8123, "")
    assert (config.ssl_keyfile, config.ssl_certfile) == (str(key), str(cert))
    assert config.log_level == "warning"
    assert frontend.scheme == "https" and FrontendArgs().scheme == "http"


def test_shutdown_timeout_is_non_negative_and_bounds_uvicorns_wait_with_the_abort_grace():
    refused = CliRunner().invoke(cli, ["serve", "--shutdown-timeout", "-1"])
    assert refused.exit_code == 1
    assert "--shutdown-timeout -1.0: must be >= 0" in refused.output
    assert FrontendArgs().shutdown_timeout == 10
    assert FrontendArgs.from_cli({"shutdown_timeout": 0.0}).shutdown_timeout == 0
    config = uvicorn_config(FastAPI(), None, 8000, FrontendArgs(shutdown_timeout=2.5))
    # uvicorn cuts what is still open after the abort at 2.5 s (never before: the aborted
    # streams get their last chunk), within the bound a stop promises: 2.5 + 2 s.
    assert 2.5 < config.timeout_graceful_shutdown < 2.5 + 2


def test_the_content_format_is_one_of_vllms():
    assert FrontendArgs().chat_template_content_format == "auto"
    with pytest.raises(ValueError, match="--chat-template-content-format xml: use one of auto, "):
        FrontendArgs(chat_template_content_format="xml")
    refused = CliRunner().invoke(cli, ["serve", "--chat-template-content-format", "xml"])
    assert refused.exit_code != 0 and "'xml' is not one of" in refused.output
