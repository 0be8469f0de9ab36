"""XLM-RoBERTa as an embedding model against transformers' XLMRobertaModel: positions start
past the padding index, so the context is two tokens shorter than the position table."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from tiny_cross_encoders import MAX_POSITIONS, write_xlm_roberta_encoder

from core import LLM


def test_xlm_roberta_embeds_its_normalized_first_token_state_up_to_its_context(tmp_path):
    model = write_xlm_roberta_encoder(tmp_path, seed=6)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory="1MiB")
    assert llm.engine.config.model.max_model_len == MAX_POSITIONS
    texts = ["w1 w2 w3", "w4"]
    outputs = llm.embed(texts, use_tqdm=False)
    for text, output in zip(texts, outputs, strict=True):
        with torch.no_grad():
            state = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, 0]
        expected = F.normalize(state, dim=-1)
        torch.testing.assert_close(
            torch.tensor(output.outputs.embedding), expected, rtol=0, atol=1e-5
        )
    (full,) = llm.embed([[5] * MAX_POSITIONS], use_tqdm=False)  # the table's last row
    assert len(full.outputs.embedding) == 32
    with pytest.raises(ValueError, match=f"more than max_model_len {MAX_POSITIONS}"):
        llm.embed([[5] * (MAX_POSITIONS + 1)], use_tqdm=False)
