"""Prefill/decode disaggregation (issue 36): 16 concurrent streams with long prompts, served
by one `core serve` against a prefill engine, a decode engine (p2p) and `core disagg-proxy`
in front, all on this machine.

    python -m benchmarks.disagg [--quick] [--threads N]   # needs core-kv-connectors

The figure that matters is the decode side's smoothness, ITL p99 / median (target <= 1.3):
one engine interleaves each arrival's prefill with its streams' decode steps, the decode
engine of a pair never computes a prompt. The pair gets the machine one engine gets:
`--threads` split between its two engines (at least one each). Output throughput says what
the split costs.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.workloads import free_port, serve_load, server_process, thread_env
from core.entrypoints.bench.datasets import synthetic_prompts
from core.model_loader.resolve import default_model_path
from core.tokenizer import Tokenizer

TARGET = 1.3
ENTRY = [sys.executable, "-c", "from core.entrypoints.cli import main; main()"]


def serve_command(port: int, *flags: str) -> list[str]:
    return [*ENTRY, "serve", str(default_model_path()), "--host", "127.0.0.1",
            "--port", str(port), *flags]  # fmt: skip


def p2p_flags(role: str, kv_port: int | None = None) -> list[str]:
    config = {"kv_connector": "p2p", "kv_role": role}
    if kv_port is not None:
        config["kv_connector_extra_config"] = {"kv_port": kv_port}
    return ["--kv-transfer-config", json.dumps(config)]


def figures(url: str, prompts: list[list[int]], output_len: int, streams: int) -> dict:
    result = serve_load(url, prompts, output_len, streams)
    return {
        "output tok/s": result.output_throughput,
        "ITL median ms": result.itl_ms.median,
        "ITL p99 ms": result.itl_ms.p99,
        "ITL p99 / median": result.itl_ms.p99 / result.itl_ms.median,
        "TTFT median ms": result.ttft_ms.median,
    }


def one_engine(prompts, output_len: int, streams: int, threads: int) -> dict:
    port = free_port()
    with server_process(serve_command(port), f"http://127.0.0.1:{port}", thread_env(threads)):
        return figures(f"http://127.0.0.1:{port}", prompts, output_len, streams)


def disaggregated(prompts, output_len: int, streams: int, threads: int) -> dict:
    prefill_port, decode_port, proxy_port, kv_port = (free_port() for _ in range(4))
    env = thread_env(max(threads // 2, 1))
    prefill = serve_command(prefill_port, *p2p_flags("kv_producer", kv_port))
    decode = serve_command(decode_port, *p2p_flags("kv_consumer"))
    proxy = [*ENTRY, "disagg-proxy", "--prefill", f"http://127.0.0.1:{prefill_port}",
             "--decode", f"http://127.0.0.1:{decode_port}", "--port", str(proxy_port)]  # fmt: skip
    with (
        server_process(prefill, f"http://127.0.0.1:{prefill_port}", env),
        server_process(decode, f"http://127.0.0.1:{decode_port}", env),
        server_process(proxy, f"http://127.0.0.1:{proxy_port}", env) as url,
    ):
        return figures(url, prompts, output_len, streams)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.disagg")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    num, input_len, output_len, streams = (16, 256, 16, 8) if args.quick else (64, 1024, 64, 16)
    tokenizer = Tokenizer.from_gguf(default_model_path())
    prompts = synthetic_prompts(tokenizer, num, input_len, seed=36)
    runs = {
        "one engine": one_engine(prompts, output_len, streams, args.threads),
        "prefill + decode + proxy": disaggregated(prompts, output_len, streams, args.threads),
    }
    names = list(next(iter(runs.values())))
    print("| serving | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for how, found in runs.items():
        print(f"| {how} | " + " | ".join(f"{found[n]:.3g}" for n in names) + " |")
    ratio = runs["prefill + decode + proxy"]["ITL p99 / median"]
    print(f"\ndecode side ITL p99 / median: {ratio:.2f} (target <= {TARGET})")


if __name__ == "__main__":
    main()
