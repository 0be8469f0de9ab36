"""`core chat` and `core complete`: interactive clients of a running OpenAI-compatible
server (core's or any other), as `vllm chat` and `vllm complete`, through the openai client.

Both take --url (default http://localhost:8000/v1), --model-name (or --model; default: the
first model the server lists) and --api-key (default: $OPENAI_API_KEY, else "EMPTY", as
a server without --api-key ignores it). With -q/--quick MESSAGE they make one request and
exit; otherwise they read one message (chat) or prompt (complete) per line from stdin until
end of input, streaming each answer to stdout. `chat` keeps the conversation, its
--system-prompt first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    import openai

__all__ = ["chat", "complete"]

DEFAULT_URL = "http://localhost:8000/v1"


def _client_options(command: Callable) -> Callable:
    options = [
        click.option("--url", default=DEFAULT_URL, show_default=True, help="the server's /v1 URL"),
        click.option(
            "--model-name", "--model", "model_name", default=None,
            help="model to use (default: the first one the server lists)",
        ),
        click.option(
            "--api-key", default=None, help="API key (default: $OPENAI_API_KEY, else none)"
        ),
        click.option(
            "-q", "--quick", default=None, metavar="MESSAGE",
            help="send MESSAGE alone, print the answer and exit",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


@click.command()
@_client_options
@click.option("--system-prompt", default=None, help="a system message opening the chat")
def chat(
    url: str, model_name: str | None, api_key: str | None, quick: str | None,
    system_prompt: str | None,
) -> None:  # fmt: skip
    """Chat with a running server's model (one message per line of input)."""
    client, model = _connect(url, model_name, api_key)
    conversation: list[dict[str, str]] = []
    if system_prompt is not None:
        conversation.append({"role": "system", "content": system_prompt})
    for message in _messages(quick, "Please enter a message for the chat model:"):
        conversation.append({"role": "user", "content": message})
        answer = _stream(
            client.chat.completions.create, _delta_text, model=model, messages=conversation
        )
        conversation.append({"role": "assistant", "content": answer})


@click.command()
@_client_options
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="tokens per answer")
def complete(
    url: str, model_name: str | None, api_key: str | None, quick: str | None,
    max_tokens: int | None,
) -> None:  # fmt: skip
    """Complete prompts with a running server's model (one prompt per line of input)."""
    client, model = _connect(url, model_name, api_key)
    for prompt in _messages(quick, "Please enter prompt to complete:"):
        _stream(
            client.completions.create, _choice_text,
            model=model, prompt=prompt, max_tokens=max_tokens,
        )  # fmt: skip


def _connect(url: str, model_name: str | None, api_key: str | None) -> tuple[Any, str]:
    """The openai client of `url` and the model to use (announced, as vLLM's clients do)."""
    try:
        import openai
    except ImportError as exc:
        raise click.ClickException(
            "this command needs the openai package: pip install 'core[client]'"
        ) from exc
    key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    client = openai.OpenAI(base_url=url, api_key=key)
    if model_name is None:
        with _api_errors():
            models = client.models.list().data
        if not models:
            raise click.ClickException(f"the server at {url} lists no model")
        model_name = models[0].id
    click.echo(f"Using model: {model_name}")
    return client, model_name


def _messages(quick: str | None, invitation: str) -> Iterable[str]:
    """`quick` alone, or each line the user enters until end of input."""
    if quick is not None:
        yield quick
        return
    click.echo(invitation)
    while True:
        try:
            yield input("> ")
        except EOFError:
            return


def _stream(
    create: Callable[..., Iterable[Any]], text_of: Callable[[Any], str | None], **request: Any
) -> str:
    """Make the streamed `request` with `create`, print the answer as it comes; the text."""
    pieces: list[str] = []
    with _api_errors():
        for chunk in create(stream=True, **request):
            piece = text_of(chunk)
            if piece:
                click.echo(piece, nl=False)
                pieces.append(piece)
    click.echo()
    return "".join(pieces)


def _delta_text(chunk: openai.types.chat.ChatCompletionChunk) -> str | None:
    return chunk.choices[0].delta.content if chunk.choices else None


def _choice_text(chunk: openai.types.Completion) -> str | None:
    return chunk.choices[0].text if chunk.choices else None


@contextmanager
def _api_errors() -> Iterator[None]:
    """The openai client's errors (no server, a refused request) as a clean CLI error."""
    import openai

    try:
        yield
    except openai.APIConnectionError as exc:
        raise click.ClickException(f"cannot reach the server: {exc}") from exc
    except openai.APIError as exc:
        raise click.ClickException(f"the server refused the request: {exc}") from exc
