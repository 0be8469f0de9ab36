"""LLM.score, .classify, .reward and .encode(pooling_task=...) against transformers'
sequence-classification models on tiny random checkpoints (a BERT and an XLM-RoBERTa
cross-encoder, a BERT classifier with three labels, a llama with a score head), and the
refusals of models without the task."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from tiny_cross_encoders import (
    write_bert_classifier,
    write_llama_classifier,
    write_xlm_roberta_classifier,
)
from tiny_engine_checkpoint import write_tiny_checkpoint

from core import LLM, PoolingParams
from core.outputs import ClassificationRequestOutput

SETTINGS = dict(dtype="float32", kv_cache_memory="1MiB")
QUERY = "w1 w2 w3"
DOCUMENTS = ["w4 w5", "w1 w2", "w6 w7 w8 w9", "w3"]


def logits(model, tokenizer, text: str, text_pair: str | None = None) -> torch.Tensor:
    """The reference's logits [num_labels] (a pair as its tokenizer joins it, with its
    token types where the tokenizer gives them)."""
    encoded = tokenizer(text, text_pair, return_tensors="pt")
    with torch.no_grad():
        return model(**encoded).logits[0]


def scores(llm: LLM, text_1, text_2, params: PoolingParams | None = None) -> list[float]:
    return [o.outputs.score for o in llm.score(text_1, text_2, params, use_tqdm=False)]


@pytest.fixture(scope="module", params=["bert", "xlm-roberta"])
def cross_encoder(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    writer = write_bert_classifier if request.param == "bert" else write_xlm_roberta_classifier
    model = writer(directory, num_labels=1, seed=3)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    return LLM(str(directory), **SETTINGS), model, tokenizer


@pytest.fixture(scope="module")
def bert_classifier(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert-3")
    model = write_bert_classifier(directory, num_labels=3, seed=4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    return LLM(str(directory), **SETTINGS), model, tokenizer


def test_one_to_many_scores_are_the_sigmoid_of_the_cross_encoders_logit(cross_encoder):
    llm, model, tokenizer = cross_encoder
    expected = [torch.sigmoid(logits(model, tokenizer, QUERY, d)).item() for d in DOCUMENTS]
    assert scores(llm, QUERY, DOCUMENTS) == pytest.approx(expected, abs=1e-4)
    raw = scores(llm, QUERY, DOCUMENTS[:2], PoolingParams(use_activation=False))
    expected_raw = [logits(model, tokenizer, QUERY, d).item() for d in DOCUMENTS[:2]]
    assert raw == pytest.approx(expected_raw, abs=1e-4)


def test_pairs_go_one_to_one_element_wise_and_keep_their_order(cross_encoder):
    llm, model, tokenizer = cross_encoder
    queries = ["w9", "w8 w7", QUERY]
    expected = [
        torch.sigmoid(logits(model, tokenizer, q, d)).item()
        for q, d in zip(queries, DOCUMENTS[:3], strict=True)
    ]
    assert scores(llm, queries, DOCUMENTS[:3]) == pytest.approx(expected, abs=1e-4)
    one_to_one = torch.sigmoid(logits(model, tokenizer, QUERY, DOCUMENTS[0])).item()
    assert scores(llm, [QUERY], DOCUMENTS[0]) == pytest.approx([one_to_one], abs=1e-4)


@pytest.mark.parametrize(
    ("text_1", "text_2", "message"),
    [
        ([], DOCUMENTS, "text_1: at least one text element must be given"),
        (QUERY, [], "text_2: at least one text_pair element must be given"),
        (["w1", "w2"], DOCUMENTS, "input lengths must be either 1:1, 1:N or N:N, got 2:4"),
    ],
)
def test_pairs_that_are_not_one_to_one_one_to_many_or_many_to_many_are_refused(
    cross_encoder, text_1, text_2, message
):
    llm, _, _ = cross_encoder
    with pytest.raises(ValueError, match=message):
        llm.score(text_1, text_2, use_tqdm=False)


def test_classify_gives_the_softmax_over_the_labels(bert_classifier):
    llm, model, tokenizer = bert_classifier
    outputs = llm.classify([QUERY, DOCUMENTS[2]], use_tqdm=False)
    for text, output in zip([QUERY, DOCUMENTS[2]], outputs, strict=True):
        expected = logits(model, tokenizer, text).softmax(-1)
        assert output.outputs.probs == pytest.approx(expected.tolist(), abs=1e-4)
    (raw,) = llm.classify(QUERY, PoolingParams(use_activation=False), use_tqdm=False)
    assert raw.outputs.probs == pytest.approx(logits(model, tokenizer, QUERY).tolist(), abs=1e-4)
    (encoded,) = llm.encode([QUERY], pooling_task="classify", use_tqdm=False)
    assert isinstance(encoded, ClassificationRequestOutput)
    assert encoded.outputs.probs == pytest.approx(outputs[0].outputs.probs, abs=1e-6)


def test_a_classifier_with_several_labels_refuses_to_score_and_to_embed(bert_classifier):
    llm, _, _ = bert_classifier
    with pytest.raises(ValueError, match=r"Scoring API is only enabled for num_labels == 1"):
        llm.score(QUERY, DOCUMENTS, use_tqdm=False)
    with pytest.raises(
        ValueError, match=r"Unsupported task: 'embed'. Supported tasks: \['classify'\]"
    ):
        llm.embed(QUERY, use_tqdm=False)
    with pytest.raises(ValueError, match=r"Unsupported task: 'token_classify'"):
        llm.reward(QUERY, use_tqdm=False)
    with pytest.raises(ValueError, match="pooling_task is required for LLM.encode"):
        llm.encode(QUERY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_a_decoder_classifier_classifies_its_last_token_and_rewards_every_token(tmp_path):
    model = write_llama_classifier(tmp_path, num_labels=2, seed=5)
    llm = LLM(str(tmp_path), **SETTINGS)
    (classified,) = llm.classify(QUERY, use_tqdm=False)
    ids = classified.prompt_token_ids
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].softmax(-1)
        hidden = model.model(torch.tensor([ids])).last_hidden_state[0]
        per_token = model.score(hidden).softmax(-1)  # [T, 2]
    assert classified.outputs.probs == pytest.approx(expected.tolist(), abs=1e-4)
    (rewarded,) = llm.reward(QUERY, use_tqdm=False)
    torch.testing.assert_close(rewarded.outputs.data, per_token, rtol=0, atol=1e-4)


def test_an_embedding_model_scores_the_cosine_of_its_embeddings(tmp_path):
    write_tiny_checkpoint(tmp_path)
    llm = LLM(str(tmp_path), runner="pooling", **SETTINGS)
    texts = ["w1 w2", "w3", "w4 w5 w6"]
    vectors = torch.tensor([o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)])
    expected = [F.cosine_similarity(vectors[0], v, dim=0).item() for v in vectors[1:]]
    assert scores(llm, texts[0], texts[1:]) == pytest.approx(expected, abs=1e-5)
    with pytest.raises(ValueError, match="task 'score': an embedding model scores a text pair"):
        llm.encode(texts[0], pooling_task="score", use_tqdm=False)


def test_a_generating_model_refuses_to_score_classify_and_reward(tmp_path):
    write_tiny_checkpoint(tmp_path)
    llm = LLM(str(tmp_path), **SETTINGS)
    with pytest.raises(
        ValueError, match=r"--runner generate: it cannot score \(Unsupported task: 'score'"
    ):
        llm.score(QUERY, DOCUMENTS, use_tqdm=False)
    with pytest.raises(ValueError, match="--runner generate: it cannot classify"):
        llm.classify(QUERY, use_tqdm=False)
    with pytest.raises(ValueError, match="--runner generate: it cannot token_classify"):
        llm.reward(QUERY, use_tqdm=False)
