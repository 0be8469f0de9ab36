"""-O1: the model's forward compiled with torch.compile, its artifacts cached on disk.

Dynamo traces the forward once with the token dimension dynamic, so one graph serves
every batch size (a batch of one token may add a second, specialised graph). Attention is
the opaque `core::unified_attention` op (core.attention.layer), like core's other kernel
ops, so the backend's Python and KV-cache writes stay outside the graph and inductor
fuses the tensor code between them.

Inductor keeps what it compiled in its on-disk caches (the FX-graph and AOT caches), which
live under `compilation_config.cache_dir` (default: core's cache directory), so a second
start re-traces with Dynamo but generates no code: `CompileCounters` tells which happened.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core import envs
from core.attention.layer import UNIFIED_ATTENTION
from core.compilation.piecewise import CompilePiece, compile_pieces
from core.config import CompilationConfig
from core.platforms.device_graph import CaptureGraph

__all__ = ["CompileCounters", "compile_cache_dir", "compile_counters", "compile_model"]

logger = logging.getLogger(__name__)

_INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


@dataclass(frozen=True)
class CompileCounters:
    """What this process compiled so far (torch.compile's own counters)."""

    graphs: int  # graphs Dynamo traced and handed to the backend
    cache_hits: int  # inductor graphs loaded from the on-disk cache
    cache_misses: int  # inductor graphs generated (no cached artifact fitted)


def compile_counters() -> CompileCounters:
    counters = torch._dynamo.utils.counters
    return CompileCounters(
        graphs=_graphs_traced,
        cache_hits=int(counters["inductor"]["fxgraph_cache_hit"]),
        cache_misses=int(counters["inductor"]["fxgraph_cache_miss"]),
    )


_graphs_traced = 0


def compile_cache_dir(config: CompilationConfig) -> Path:
    """The directory inductor caches into: the configured one, else core's cache dir."""
    if config.cache_dir is not None:
        return Path(config.cache_dir).expanduser()
    return envs.cache_dir() / "torch_compile"


def compile_model(
    model: nn.Module, config: CompilationConfig, capture: CaptureGraph | None = None
) -> Callable[..., Any]:
    """`model`'s forward compiled per `config` (backend, cache dir); same signature.

    With `capture` (a platform's `capture_graph`) the traced graph is cut at attention and
    each piece between compiled and captured per batch size (core.compilation.piecewise).
    """
    cache = compile_cache_dir(config)
    cache.mkdir(parents=True, exist_ok=True)
    # Inductor reads the variable each time it looks for its cache: set for this process.
    os.environ[_INDUCTOR_CACHE_ENV] = str(cache)
    backend = _counting_backend(_piece_compiler(config.backend), capture)
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=None)
    return _DynamicTokens(compiled)


class _DynamicTokens:
    """Calls the compiled module with the token dimension of its inputs marked dynamic,
    so the first trace is general instead of specialised to its batch size."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self._compiled = compiled

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, **kwargs: Any) -> Any:
        torch._dynamo.maybe_mark_dynamic(input_ids, 0)
        torch._dynamo.maybe_mark_dynamic(positions, 0)
        # Size-oblivious: a one-token batch takes the general graph instead of a second
        # trace specialised to size 1 (a second compile at every start).
        with torch.fx.experimental._config.patch(backed_size_oblivious=True):
            return self._compiled(input_ids, positions, **kwargs)


def _counting_backend(compile_graph: CompilePiece, capture: CaptureGraph | None) -> Any:
    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        global _graphs_traced
        _graphs_traced += 1
        start = time.perf_counter()
        if capture is None:
            compiled = compile_graph(gm, example_inputs)
        else:
            op = UNIFIED_ATTENTION.overload
            compiled = compile_pieces(gm, example_inputs, op, compile_graph, capture)
        logger.info("compiled a graph in %.1f s", time.perf_counter() - start)
        return compiled

    return backend


def _piece_compiler(name: str) -> CompilePiece:
    """How one graph is compiled: inductor, or run as traced ("eager")."""
    if name == "eager":
        return lambda gm, example_inputs: gm.forward

    def inductor(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    return inductor
