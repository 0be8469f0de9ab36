"""The tiny random llama of the tensor-parallel (and LoRA server) tests: hidden 64, 4
heads, 2 KV heads, a vocabulary of 256 (a word-level tokenizer of 256 words)."""

from __future__ import annotations

from pathlib import Path

import transformers

from core.testing.tiny_checkpoint import SPECIAL, random_llama, write_tiny_checkpoint

VOCAB = {token: i for i, token in enumerate([*SPECIAL, *(f"w{i}" for i in range(253))])}


def tp_model(seed: int = 0, vocab: dict[str, int] = VOCAB) -> transformers.LlamaForCausalLM:
    """The random llama: hidden 64, 4 heads, 2 KV heads, MLP 128, two layers, over `vocab`
    (default: this module's 256 words)."""
    return random_llama(
        vocab, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
        num_layers=2, max_positions=128, seed=seed,
    )  # fmt: skip


def write_tp_checkpoint(
    directory: Path, model: transformers.LlamaForCausalLM | None = None
) -> Path:
    return write_tiny_checkpoint(directory, model or tp_model(), VOCAB)
