"""A tiny random-weight model directory the whole engine loads in about a second.

A 2-layer llama (hidden 32, one KV head) saved by transformers as safetensors, with a
word-level tokenizer.json whose ids a test can write down by hand (`VOCAB`) and a chat
template in tokenizer_config.json. `reference_model` is the same model, for greedy parity;
`engine_kwargs` what the engine tests start it with (float32, a short context, a small cache).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers
from tokenizers import models, pre_tokenizers

from core.engine_args import EngineArgs

SPECIAL = ["<unk>", "<s>", "</s>"]
WORDS = ["user", "assistant", ":", *(f"w{i}" for i in range(45))]
VOCAB = {token: i for i, token in enumerate([*SPECIAL, *WORDS])}
EOS_TOKEN_ID = VOCAB["</s>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
MAX_POSITIONS = 64
MAX_MODEL_LEN = 32


def reference_model() -> transformers.LlamaForCausalLM:
    """The random model (seeded, so every call gives the same weights)."""
    config = transformers.LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=VOCAB["<s>"],
        eos_token_id=EOS_TOKEN_ID,
        tie_word_embeddings=False,
        initializer_range=0.5,  # far from uniform logits, so greedy choices are clear
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def engine_kwargs(model_dir: Path, **overrides: Any) -> dict[str, Any]:
    """The EngineArgs keywords (as LLM takes them) the engine tests start the model with."""
    settings = dict(dtype="float32", max_model_len=MAX_MODEL_LEN, kv_cache_memory="1MiB")
    return {"model": str(model_dir), **settings, **overrides}


def engine_args(model_dir: Path, **overrides: Any) -> EngineArgs:
    return EngineArgs(**engine_kwargs(model_dir, **overrides))


def write_tiny_checkpoint(directory: Path) -> Path:
    """The model, its tokenizer.json and tokenizer_config.json, written into `directory`."""
    reference_model().save_pretrained(directory)
    backend = tokenizers.Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(SPECIAL)
    backend.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def next_token_logits(model: transformers.LlamaForCausalLM, tokens: list[int]) -> torch.Tensor:
    """The reference's logits [V] for the token after `tokens`."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1]


def greedy_reference(model: transformers.LlamaForCausalLM, prompt: list[int], n: int) -> list[int]:
    """The reference's greedy continuation of `prompt`: `n` argmax tokens, eos or not."""
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(next_token_logits(model, tokens).argmax()))
    return tokens[len(prompt) :]
