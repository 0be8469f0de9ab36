"""Tiny random-weight sequence-classification checkpoints (cross-encoders, classifiers, a
decoder reward model) saved by transformers with their tokenizers, and the transformers
models they were saved from (the references of the parity tests).

`write_bert_classifier`: BERT over a WordPiece vocabulary of numbered words ("w0" ..
"w39"); a pair is [CLS] a [SEP] b [SEP], b of token type 1. `write_xlm_roberta_classifier`:
XLM-RoBERTa over a Unigram vocabulary of the same words; a pair is <s> a </s></s> b </s>,
one token type. `write_llama_classifier`: the engine tests' tiny llama with a `score` head.
Labels are named ("label0", ...) so that id2label is visible in the outputs.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from core.testing.tiny_checkpoint import VOCAB, write_tiny_checkpoint

WORDS = [f"w{i}" for i in range(40)]
MAX_POSITIONS = 64
_SHAPES = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    hidden_act="gelu", initializer_range=0.3,
)  # fmt: skip


def labels(num_labels: int) -> dict[int, str]:
    return {i: f"label{i}" for i in range(num_labels)}


def write_bert_classifier(
    directory: Path, num_labels: int, seed: int = 0
) -> transformers.BertForSequenceClassification:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    transformers.BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}).save_pretrained(directory)
    config = transformers.BertConfig(
        vocab_size=len(vocab), max_position_embeddings=MAX_POSITIONS, id2label=labels(num_labels),
        **_SHAPES,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(directory)
    return model


def write_xlm_roberta_classifier(
    directory: Path, num_labels: int, seed: int = 0
) -> transformers.XLMRobertaForSequenceClassification:
    config = _xlm_roberta_config(directory, id2label=labels(num_labels))
    torch.manual_seed(seed)
    model = transformers.XLMRobertaForSequenceClassification(config).eval()
    model.save_pretrained(directory)
    return model


def write_xlm_roberta_encoder(directory: Path, seed: int = 0) -> transformers.XLMRobertaModel:
    """XLM-RoBERTa without a head, as an embedding model is saved."""
    config = _xlm_roberta_config(directory)
    torch.manual_seed(seed)
    model = transformers.XLMRobertaModel(config).eval()
    model.save_pretrained(directory)
    return model


def _xlm_roberta_config(directory: Path, **extra) -> transformers.XLMRobertaConfig:
    """The config of the XLM-R models, its Unigram tokenizer saved into `directory`. The
    position table has two rows more than the context: RoBERTa's positions start past
    its padding index (1)."""
    pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [(f"\u2581{word}", -1.0) for word in WORDS] + [("<mask>", 0.0)]
    transformers.XLMRobertaTokenizer(vocab=pieces).save_pretrained(directory)
    return transformers.XLMRobertaConfig(
        vocab_size=len(pieces), max_position_embeddings=MAX_POSITIONS + 2, type_vocab_size=1,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, **_SHAPES, **extra,
    )  # fmt: skip


def write_llama_classifier(
    directory: Path, num_labels: int, seed: int = 0
) -> transformers.LlamaForSequenceClassification:
    config = transformers.LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=MAX_POSITIONS, bos_token_id=VOCAB["<s>"],
        eos_token_id=VOCAB["</s>"], pad_token_id=VOCAB["<unk>"], initializer_range=0.5,
        id2label=labels(num_labels),
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.LlamaForSequenceClassification(config).eval()
    write_tiny_checkpoint(directory, model)
    return model
