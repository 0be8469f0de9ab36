"""Tiny random-weight embedding checkpoints, saved by sentence-transformers, and the
sentence-transformers models they were saved from (the references of the parity tests).

`write_bert_embedder`: a BERT encoder over a WordPiece vocabulary of numbered words ("w0"
.. "w39"), pooled by `pooling_mode` ("mean" or "cls"), normalized or not.
`write_llama_embedder`: the engine tests' tiny llama as a last-token embedder (saved by
sentence-transformers as a headless `LlamaModel`, as decoder embedders are).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling

from core.testing.tiny_checkpoint import VOCAB, random_llama, write_tiny_checkpoint

WORDS = [f"w{i}" for i in range(40)]
BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
MAX_POSITIONS = 64


def write_bert_embedder(
    directory: Path, pooling_mode: str, normalize: bool, seed: int = 0
) -> SentenceTransformer:
    """A seeded random BERT (hidden 32, two layers of four heads, exact GELU) and its
    WordPiece tokenizer, saved with sentence-transformers' modules into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab_file = directory / "vocab.txt"
    vocab_file.write_text("\n".join(BERT_VOCAB) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(vocab_file)).save_pretrained(directory)
    config = transformers.BertConfig(
        vocab_size=len(BERT_VOCAB), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=MAX_POSITIONS,
        hidden_act="gelu", initializer_range=0.3,
    )  # fmt: skip
    torch.manual_seed(seed)
    transformers.BertModel(config).eval().save_pretrained(directory)
    return _save_sentence_transformer(directory, pooling_mode, normalize)


def write_llama_embedder(directory: Path, seed: int = 0) -> SentenceTransformer:
    """The engine tests' tiny llama vocabulary and shapes, pooled from the last token and
    normalized (as Qwen3-Embedding is), saved by sentence-transformers into `directory`."""
    model = random_llama(
        VOCAB, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1,
        num_layers=2, max_positions=MAX_POSITIONS, seed=seed,
    )  # fmt: skip
    write_tiny_checkpoint(directory, model)
    # A pad token to batch; no chat template, which sentence-transformers 6 would wrap each
    # text in (embeddings of plain text are what is compared).
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    del config["chat_template"]
    config_file.write_text(json.dumps({**config, "pad_token": "<unk>"}))
    return _save_sentence_transformer(directory, "lasttoken", normalize=True)


def _save_sentence_transformer(
    directory: Path, pooling_mode: str, normalize: bool
) -> SentenceTransformer:
    word = Transformer(str(directory), max_seq_length=MAX_POSITIONS)
    modules = [word, Pooling(word.get_embedding_dimension(), pooling_mode)]
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu")
    model.save(str(directory))
    return model
