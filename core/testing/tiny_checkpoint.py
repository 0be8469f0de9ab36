"""A tiny random-weight llama checkpoint that the whole engine loads in about a second.

Saved by transformers as safetensors, with a word-level tokenizer.json whose ids a test can
write down by hand (`VOCAB`) and a chat template in tokenizer_config.json. Used by the
conformance kit (components that need a real engine around them) and by core's own tests.
Needs `transformers` (core's test extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import tokenizers
import torch
from tokenizers import models, pre_tokenizers

if TYPE_CHECKING:
    import transformers

__all__ = ["EOS_TOKEN_ID", "VOCAB", "random_llama", "reference_model", "write_tiny_checkpoint"]

SPECIAL = ["<unk>", "<s>", "</s>"]
WORDS = ["user", "assistant", ":", *(f"w{i}" for i in range(45))]
VOCAB = {token: i for i, token in enumerate([*SPECIAL, *WORDS])}
EOS_TOKEN_ID = VOCAB["</s>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
MAX_POSITIONS = 64


def reference_model(
    num_hidden_layers: int = 2, max_position_embeddings: int = MAX_POSITIONS, seed: int = 0
) -> transformers.LlamaForCausalLM:
    """The random model (seeded, so every call with the same arguments gives the same
    weights): hidden 32, two heads of 16, one KV head."""
    return random_llama(
        VOCAB, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1,
        num_layers=num_hidden_layers, max_positions=max_position_embeddings, seed=seed,
    )  # fmt: skip


def random_llama(
    vocab: dict[str, int],
    hidden_size: int,
    intermediate_size: int,
    num_heads: int,
    num_kv_heads: int,
    num_layers: int,
    max_positions: int,
    seed: int,
) -> transformers.LlamaForCausalLM:
    """A seeded random transformers llama over `vocab` (its "<s>" and "</s>" the special
    ids), untied, with weights far from uniform logits so greedy choices are clear."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_positions,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        tie_word_embeddings=False,
        initializer_range=0.5,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def write_tiny_checkpoint(
    directory: Path,
    model: transformers.LlamaForCausalLM | None = None,
    vocab: dict[str, int] = VOCAB,
) -> Path:
    """`model` (default: `reference_model()`), its tokenizer.json (word-level over `vocab`,
    which starts with the SPECIAL tokens) and tokenizer_config.json, written into
    `directory`."""
    (model or reference_model()).save_pretrained(directory)
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(SPECIAL)
    backend.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory
