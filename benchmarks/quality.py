"""Q, quality: what 4-bit weights cost in perplexity and save in memory.

The default model runs a fixed held-out text (tests/data/heldout.txt, an original English
text of varied prose, over 2,000 tokens; none of it is AWQ's calibration text) three
ways, each outside the engine through `core.models.calibration` (float32 activations,
one window at a time from an empty context): weights dequantized to float32
(core-fp32's), kept as the GGUF's blocks (core-gguf's) and AWQ 4-bit (core-awq's
checkpoint). Beside each perplexity, the model's resident weight memory: the bytes of
its parameters and buffers, each storage counted once (a tied LM head shares the
embedding's), taken right after loading, against the GGUF file's size.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.workloads import Metrics, Sizes

HELDOUT_TEXT = Path(__file__).resolve().parents[1] / "tests" / "data" / "heldout.txt"


@dataclass(frozen=True)
class Variant:
    """One way of holding the model's weights, named for the engine that runs it."""

    engine: str
    model: Path  # what `resolve_model` opens
    quantization: str | None  # the method the weights are held in; None: float32
    how: str


def variants(gguf_path: Path, awq_dir: Path) -> list[Variant]:
    return [
        Variant("core-fp32", gguf_path, None, "GGUF dequantized to float32 (--quantization none)"),
        Variant("core-gguf", gguf_path, "gguf", "GGUF blocks kept packed (--quantization gguf)"),
        Variant("core-awq", awq_dir, "awq", f"AWQ 4-bit checkpoint ({awq_dir.name})"),
    ]


def heldout_ids(tokenizer: Any, num_tokens: int | None) -> list[int]:
    """The held-out text's token ids (no special tokens), its first `num_tokens` when set."""
    ids = tokenizer.encode(HELDOUT_TEXT.read_text(encoding="utf-8"), add_special_tokens=False)
    return ids if num_tokens is None else ids[:num_tokens]


def resident_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind `tensors`, each storage counted once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def model_bytes(model: nn.Module) -> int:
    return resident_bytes([*model.parameters(), *model.buffers()])


def measure(gguf_path: Path, awq_dir: Path, sizes: Sizes) -> dict[str, Metrics]:
    """{engine: {"perplexity", "resident_bytes", "file_bytes", "num_tokens", "window",
    "how"}} for every `variants` entry, one model in memory at a time."""
    from core.model_loader import resolve_model
    from core.models import build_model
    from core.models.calibration import perplexity
    from core.plugins.registry import get_registry
    from core.quantization.selector import build_quantization_config
    from core.tokenizer import Tokenizer

    get_registry().run_general_plugins()  # kernels (core::quant_linear's) register here
    ids = heldout_ids(Tokenizer.from_gguf(gguf_path), sizes.q_num_tokens)
    file_bytes = gguf_path.stat().st_size
    found = {}
    for variant in variants(gguf_path, awq_dir):
        checkpoint = resolve_model(str(variant.model))
        quant_config = None
        if variant.quantization is not None:
            quant_config = build_quantization_config(variant.quantization, checkpoint.hf_config)
        model = build_model(checkpoint, quant_config)
        resident = model_bytes(model)  # before perplexity binds a KV cache to every layer
        found[variant.engine] = {
            "perplexity": perplexity(model, ids, sizes.q_window),
            "resident_bytes": resident,
            "file_bytes": file_bytes,
            "num_tokens": len(ids),
            "window": sizes.q_window,
            "how": f"{variant.how}, float32 activations",
        }
        del model
    return found


__all__ = ["HELDOUT_TEXT", "Variant", "heldout_ids", "measure", "model_bytes", "resident_bytes"]
