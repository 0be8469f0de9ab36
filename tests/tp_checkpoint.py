"""The tiny random llama of the tensor-parallel (and LoRA server) tests: hidden 64, 4
heads, 2 KV heads, a vocabulary of 256 (a word-level tokenizer of 256 words)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from core.testing.tiny_checkpoint import SPECIAL, write_tiny_checkpoint

VOCAB = {token: i for i, token in enumerate([*SPECIAL, *(f"w{i}" for i in range(253))])}


def tp_model(seed: int = 0, vocab: dict[str, int] = VOCAB) -> transformers.LlamaForCausalLM:
    """The random llama: hidden 64, 4 heads, 2 KV heads, MLP 128, two layers; `vocab`'s
    size and special tokens (default: this module's 256 words)."""
    config = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        tie_word_embeddings=False,
        initializer_range=0.5,  # far from uniform logits, so greedy choices are clear
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def write_tp_checkpoint(
    directory: Path, model: transformers.LlamaForCausalLM | None = None
) -> Path:
    return write_tiny_checkpoint(directory, model or tp_model(), VOCAB)
