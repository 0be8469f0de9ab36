"""`core bench throughput | latency | serve`: run a benchmark, print a table, write JSON."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from core.engine_args import EngineArgs, engine_options
from core.entrypoints.bench.datasets import draw_lengths, load_prompts_file, synthetic_prompts
from core.entrypoints.bench.results import LatencyResult, ServeResult, ThroughputResult, json_safe

if TYPE_CHECKING:
    from core.entrypoints.llm import LLM

_Result = TypeVar("_Result", ThroughputResult, LatencyResult)


class _LengthType(click.ParamType):
    """A token count N, or a range MIN:MAX drawn from uniformly per prompt."""

    name = "N|MIN:MAX"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | tuple[int, int]:
        if isinstance(value, int | tuple):
            return value
        try:
            parts = [int(part) for part in str(value).split(":")]
        except ValueError:
            parts = []
        if len(parts) == 1 and parts[0] >= 1:
            return parts[0]
        if len(parts) == 2 and 1 <= parts[0] <= parts[1]:
            return (parts[0], parts[1])
        self.fail(f"{value!r} is not a length N or a range MIN:MAX with 1 <= MIN <= MAX")


LENGTH = _LengthType()


def _workload_options(command):
    """Prompt and output options shared by `throughput` and `serve`."""
    options = [
        click.option("--input-len", type=LENGTH, default="128", show_default=True,
                     help="prompt tokens: N, or MIN:MAX drawn uniformly per prompt"),
        click.option("--output-len", type=LENGTH, default="128", show_default=True,
                     help="output tokens: N, or MIN:MAX drawn uniformly per prompt"),
        click.option("--num-prompts", type=click.IntRange(min=1), default=None,
                     help="number of prompts (default: 64, or all of --dataset)"),
        click.option("--dataset", type=click.Path(exists=True, dir_okay=False), default=None,
                     help='JSON list of prompts: strings, token-id lists or {"prompt": ...}'),
        click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
                     help="generate exactly the output length"),
        click.option("--output-json", type=click.Path(dir_okay=False), default=None,
                     help="also write the result here as JSON"),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


@click.group()
def bench() -> None:
    """Benchmark offline throughput and latency, or any OpenAI-compatible server."""


@bench.command()
@_workload_options
@engine_options
def throughput(**options: Any) -> None:
    """Offline throughput: all prompts at once through the LLM API (--seed seeds the data)."""
    from core.entrypoints.bench.throughput import benchmark_throughput

    seed = options["seed"] or 0
    with _click_errors():
        dataset = _dataset_prompts(options)  # read before the model loads: fail fast

    def run(llm: LLM) -> ThroughputResult:
        tokenizer = llm.get_tokenizer()
        prompts = dataset or synthetic_prompts(
            tokenizer, options["num_prompts"] or 64, options["input_len"], seed
        )
        token_prompts = [p if isinstance(p, list) else tokenizer.encode(p) for p in prompts]
        output_lens = draw_lengths(len(prompts), options["output_len"], seed + 1)
        return benchmark_throughput(llm, token_prompts, output_lens, options["ignore_eos"])

    _report(_with_llm(options, run), options["output_json"])


@bench.command()
@click.option("--input-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--num-iters", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--num-warmup", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--output-json", type=click.Path(dir_okay=False), default=None)
@engine_options
def latency(**options: Any) -> None:
    """Latency of one batch at a time: TTFT, time per output token, end to end."""
    from core.entrypoints.bench.latency import benchmark_latency

    def run(llm: LLM) -> LatencyResult:
        return benchmark_latency(
            llm, options["input_len"], options["output_len"], options["batch_size"],
            options["num_iters"], options["num_warmup"],
        )  # fmt: skip

    _report(_with_llm(options, run), options["output_json"])


@bench.command()
@click.option("--base-url", default="http://127.0.0.1:8000", show_default=True)
@click.option("--endpoint", default="/v1/completions", show_default=True)
@click.option("--model", default=None, help="model name to send (default: the first listed)")
@click.option("--tokenizer", default=None,
              help="tokenizer (.gguf or directory) for synthetic prompts (default: core's "
                   "default model's)")  # fmt: skip
@click.option("--max-concurrency", type=click.IntRange(min=1), default=None,
              help="most requests in flight (default: unlimited)")  # fmt: skip
@click.option("--request-rate", type=float, default=float("inf"),
              help="Poisson arrivals per second (default: all at once)")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--measure-client-overhead", is_flag=True,
              help="also measure this client's CPU per token on an instant server")  # fmt: skip
@_workload_options
def serve(**options: Any) -> None:
    """Load-test an OpenAI-compatible server (ours or another) with streaming requests."""
    import asyncio

    import httpx

    with _click_errors(httpx.HTTPError):
        model = options["model"] or _first_served_model(options["base_url"])
        prompts = _serve_prompts(options)
        output_lens = draw_lengths(len(prompts), options["output_len"], options["seed"] + 1)
        result = asyncio.run(_serve(options, model, prompts, output_lens))
    _report(result, options["output_json"])


async def _serve(
    options: dict[str, Any], model: str, prompts: list, output_lens: list[int]
) -> ServeResult:
    from core.entrypoints.bench.serve_client import benchmark_serving, measure_client_overhead

    result = await benchmark_serving(
        options["base_url"], model, prompts, output_lens,
        max_concurrency=options["max_concurrency"], request_rate=options["request_rate"],
        seed=options["seed"], ignore_eos=options["ignore_eos"], endpoint=options["endpoint"],
    )  # fmt: skip
    if options["measure_client_overhead"]:
        result.client_overhead_ms = await measure_client_overhead()
    return result


def _with_llm(options: dict[str, Any], run: Callable[[LLM], _Result]) -> _Result:
    """`run(llm)` with an LLM built from the engine options; always shut down after."""
    from core.entrypoints.llm import LLM

    with _click_errors():
        given = asdict(EngineArgs.from_cli(options))
        llm = LLM(**{name: value for name, value in given.items() if value is not None})
        try:
            return run(llm)
        finally:
            llm.engine.shutdown()


@contextlib.contextmanager
def _click_errors(*also: type[Exception]) -> Iterator[None]:
    """Bad input (ValueError, and `also`) ends the command with its message, not a trace."""
    try:
        yield
    except (ValueError, *also) as exc:
        raise click.ClickException(str(exc)) from exc


def _dataset_prompts(options: dict[str, Any]) -> list[str | list[int]] | None:
    """The first --num-prompts prompts of --dataset (None without one)."""
    if options["dataset"] is None:
        return None
    prompts = load_prompts_file(options["dataset"])
    num_prompts = options["num_prompts"]
    if num_prompts is not None and num_prompts > len(prompts):
        raise ValueError(f"--num-prompts {num_prompts}: the dataset holds {len(prompts)}")
    return prompts[:num_prompts]


def _serve_prompts(options: dict[str, Any]) -> list[str | list[int]]:
    """Token prompts are sent as ids, except to a chat endpoint, which gets their text."""
    chat = options["endpoint"].rstrip("/").endswith("chat/completions")
    prompts = _dataset_prompts(options)
    tokenizer = None
    if prompts is None or chat:
        tokenizer = _load_tokenizer(options["tokenizer"])
    if prompts is None:
        prompts = synthetic_prompts(
            tokenizer, options["num_prompts"] or 64, options["input_len"], options["seed"]
        )
    if chat:
        return [p if isinstance(p, str) else tokenizer.decode(p) for p in prompts]
    return prompts


def _load_tokenizer(path: str | None) -> Any:
    from core.model_loader import resolve_model
    from core.tokenizer import Tokenizer, load_tokenizer

    if path is None:
        return load_tokenizer(resolve_model(None))
    if Path(path).suffix == ".gguf":
        return Tokenizer.from_gguf(path)
    return Tokenizer.from_dir(path)


def _first_served_model(base_url: str) -> str:
    import httpx

    response = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30.0)
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise ValueError(f"{base_url}/v1/models lists no model: pass --model")
    return models[0]["id"]


def _report(
    result: ThroughputResult | LatencyResult | ServeResult, output_json: str | None
) -> None:
    click.echo(result.table())
    if output_json is None:
        return
    settings = {k: v for k, v in click.get_current_context().params.items() if v is not None}
    data = {**result.to_dict(), "settings": settings}
    Path(output_json).write_text(json.dumps(json_safe(data), indent=2) + "\n")
    click.echo(f"wrote {output_json}")


__all__ = ["bench"]
