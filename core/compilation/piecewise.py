"""PIECEWISE graphs: the traced forward cut at its attention ops.

Attention cannot always be captured in a device graph (a backend whose metadata lives in
Python, or that synchronizes with the host), but everything between two attention layers
can. So the graph Dynamo traced is split so each `core::unified_attention` call is a
piece of its own; the pieces between them are compiled one by one and wrapped in a
`CapturedPiece`, which, while the forward context names a batch size
(`ForwardContext.piecewise_size`), captures a device graph of the piece at that size the
first time and replays it afterwards. Attention runs eagerly between the replays: it
reads its q/k/v from one piece's graph output and writes into an output the piece
allocated, so every address a replay reads stays the one captured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.split_module import split_module

from core.forward_context import get_forward_context
from core.platforms.device_graph import CaptureGraph, DeviceGraph

__all__ = ["CapturedPiece", "compile_pieces", "split_at_attention"]

CompilePiece = Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]


def split_at_attention(gm: fx.GraphModule, attention_op: Any) -> tuple[fx.GraphModule, list[str]]:
    """`gm` cut into submodules, each `attention_op` call alone in one: (the split module,
    the names of the other submodules, in order)."""
    partition, assignment, attention = 0, {}, set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is attention_op:
            partition += 1
            attention.add(partition)
            assignment[node] = partition
            partition += 1
        else:
            assignment[node] = partition
    split = split_module(gm, None, lambda node: assignment[node], keep_original_order=True)
    names = [name for name, _ in split.named_children()]
    return split, [n for n in names if int(n.removeprefix("submod_")) not in attention]


class CapturedPiece(nn.Module):
    """One compiled piece; under a piecewise size, a device graph per size."""

    def __init__(self, compiled: Callable[..., Any], capture: CaptureGraph | None) -> None:
        super().__init__()
        self.compiled = compiled
        self.capture = capture
        self.graphs: dict[int, DeviceGraph] = {}

    def forward(self, *args: Any) -> Any:
        size = get_forward_context().piecewise_size
        if size is None or self.capture is None:
            return self.compiled(*args)
        graph = self.graphs.get(size)
        if graph is None:
            graph = self.graphs[size] = self.capture(lambda: self.compiled(*args))
        else:
            graph.replay()
        return graph.output


def compile_pieces(
    gm: fx.GraphModule,
    example_inputs: list[Any],
    attention_op: Any,
    compile_piece: CompilePiece,
    capture: CaptureGraph | None,
) -> fx.GraphModule:
    """`gm` split at attention, each other piece compiled by `compile_piece` with its own
    example inputs (propagated through the split graph in Dynamo's fake mode) and wrapped
    in a CapturedPiece."""
    split, pieces = split_at_attention(gm, attention_op)
    _PieceCompiler(split, set(pieces), compile_piece, capture).run(*example_inputs)
    return split


class _PieceCompiler(fx.Interpreter):
    """Runs the split module on fake inputs, compiling each piece with the inputs it gets."""

    def __init__(
        self,
        split: fx.GraphModule,
        pieces: set[str],
        compile_piece: CompilePiece,
        capture: CaptureGraph | None,
    ) -> None:
        super().__init__(split)
        self._pieces = pieces
        self._compile_piece = compile_piece
        self._capture = capture

    def run(self, *args: Any) -> Any:
        # Dynamo hands real tensors; its fake mode remembers their fakes (symbolic sizes
        # included), so the pieces see the shapes the whole graph was traced with.
        fake_mode = torch._guards.detect_fake_mode()
        fakes = [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with fake_mode:
            return super().run(*fakes)

    def call_module(self, target: str, args: Any, kwargs: Any) -> Any:
        output = super().call_module(target, args, kwargs)
        if target in self._pieces:
            piece = self.fetch_attr(target)
            compiled = self._compile_piece(piece, list(args))
            setattr(self.module, target, CapturedPiece(compiled, self._capture))
        return output
