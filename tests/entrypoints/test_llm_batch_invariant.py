"""Batch-invariant mode end to end on SmolLM2 (the GGUF's blocks kept packed): each
prompt's greedy tokens and logprobs are bit-identical served alone, in a batch of 32,
in 16-token prefill chunks, after a prefix-cache hit, under n-gram speculation and with
--max-num-seqs 1; in bfloat16 and float32. Without the mode the same runs differ (the
reason for the mode, and proof that these comparisons can fail)."""

from __future__ import annotations

import pytest

from core import LLM, SamplingParams
from core.entrypoints.bench.speculation import spec_decoding_stats

pytestmark = pytest.mark.slow

# Each over two 16-token blocks, so that the prefix cache holds some of it.
PROMPTS = [
    'def merge_sorted(a, b):\n    """Merge two sorted lists a and b into one sorted list,\n'
    '    keeping equal items in their order."""\n    result = []\n',
    "The three largest cities of Italy, from north to south, are Milan, Rome and Naples. "
    "The three largest cities of Spain, from north to south, are",
    "1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610,",
]
FILLERS = [
    f"Tale {i}: once upon a time a {who} walked into the forest and"
    for i, who in enumerate(["miller", "fox", "clockmaker", "heron", "sailor", "child", "bear"] * 5)
]
BATCH = 32
MAX_TOKENS = 16
LOGPROBS = 3
PARAMS = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=LOGPROBS)
# Speculation verifies drafts only where the context repeats itself: longer answers give
# n-gram lookup more to find.
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}  # fmt: skip

Answer = tuple[list[int], list[dict[int, float]]]  # token ids, top logprobs per position


def _answers(outputs) -> list[Answer]:
    return [
        (
            list(o.outputs[0].token_ids),
            [{t: lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs],
        )
        for o in outputs
    ]


def _llm(dtype: str, invariant: bool, **kwargs) -> LLM:
    return LLM(
        dtype=dtype, batch_invariant=invariant, max_model_len=256, kv_cache_memory="96MiB",
        **kwargs,
    )  # fmt: skip


def alone(dtype: str, invariant: bool) -> list[Answer]:
    llm = _llm(dtype, invariant)
    return [_answers(llm.generate(p, PARAMS, use_tqdm=False))[0] for p in PROMPTS]


def in_a_batch(dtype: str, invariant: bool) -> list[Answer]:
    """The prompts in the middle of a batch of 32, all admitted at once."""
    llm = _llm(dtype, invariant, max_num_seqs=BATCH, max_num_batched_tokens=2048)
    half = (BATCH - len(PROMPTS)) // 2
    batch = FILLERS[:half] + PROMPTS + FILLERS[half : BATCH - len(PROMPTS)]
    outputs = llm.generate(batch, PARAMS, use_tqdm=False)
    return _answers(outputs[half : half + len(PROMPTS)])


def in_chunks(dtype: str, invariant: bool) -> list[Answer]:
    """Prompts prefilled 16 tokens a step, next to each other's decodes."""
    llm = _llm(dtype, invariant, enable_chunked_prefill=True, max_num_batched_tokens=16)
    return _answers(llm.generate(PROMPTS, PARAMS, use_tqdm=False))


def from_the_prefix_cache(dtype: str, invariant: bool) -> list[Answer]:
    """The prompts again once their blocks are cached: the second run computes only the
    tails past the cached blocks."""
    llm = _llm(dtype, invariant, enable_prefix_caching=True)
    llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert all(o.num_cached_tokens > 0 for o in outputs), "no prefix-cache hit to compare"
    return _answers(outputs)


def speculated(dtype: str, invariant: bool) -> list[Answer]:
    llm = _llm(dtype, invariant, speculative_config=NGRAM)
    answers = _answers(llm.generate(PROMPTS, PARAMS, use_tqdm=False))
    stats = spec_decoding_stats(llm)
    assert stats is not None and stats.num_draft_tokens > 0, "no draft was verified"
    return answers


def one_at_a_time(dtype: str, invariant: bool) -> list[Answer]:
    llm = _llm(dtype, invariant, max_num_seqs=1)
    return _answers(llm.generate(PROMPTS, PARAMS, use_tqdm=False))


SERVINGS = [in_a_batch, in_chunks, from_the_prefix_cache, speculated, one_at_a_time]


def _mismatch(expected: list[Answer], got: list[Answer]) -> str | None:
    """Where the first answer that differs differs, or None when all are identical."""
    for i, ((want_ids, want_lps), (got_ids, got_lps)) in enumerate(zip(expected, got, strict=True)):
        if want_ids != got_ids:
            at = next(j for j, (a, b) in enumerate(zip(want_ids, got_ids, strict=True)) if a != b)
            return f"prompt {i}: token {at} is {got_ids[at]}, alone {want_ids[at]}"
        if want_lps != got_lps:
            at = next(j for j, (a, b) in enumerate(zip(want_lps, got_lps, strict=True)) if a != b)
            return f"prompt {i}: logprobs at token {at} are {got_lps[at]}, alone {want_lps[at]}"
    return None


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def dtype(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def served_alone(dtype: str) -> list[Answer]:
    return alone(dtype, invariant=True)


@pytest.mark.parametrize("serving", SERVINGS, ids=lambda f: f.__name__)
def test_answers_are_bit_identical_to_each_prompt_alone(serving, dtype, served_alone):
    mismatch = _mismatch(served_alone, serving(dtype, invariant=True))
    assert mismatch is None, f"{serving.__name__} in {dtype}: {mismatch}"


def test_seeded_samples_are_the_same_alone_and_in_a_batch():
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=MAX_TOKENS,
                            ignore_eos=True, logprobs=LOGPROBS)  # fmt: skip
    llm = _llm("bfloat16", True, max_num_seqs=BATCH, max_num_batched_tokens=2048)
    alone = _answers(llm.generate(PROMPTS[:1], seeded, use_tqdm=False))
    batch = [PROMPTS[0], *FILLERS[: BATCH - 1]]
    params = [seeded] + [PARAMS] * (BATCH - 1)
    assert _mismatch(alone, _answers(llm.generate(batch, params, use_tqdm=False)[:1])) is None


def _linear_isas() -> list[str]:
    """The vector ISAs of core-cpu-kernels' linear kernels on this CPU (none without it)."""
    try:
        from core_cpu_kernels import _C
    except ImportError:
        return []
    return _C.quant_linear_isas()


@pytest.mark.parametrize("isa", _linear_isas())
def test_on_each_isas_kernels_a_batch_answers_as_each_prompt_alone(isa, monkeypatch):
    monkeypatch.setenv("CORE_CPU_ISA", isa)
    mismatch = _mismatch(alone("bfloat16", True), in_a_batch("bfloat16", True))
    assert mismatch is None, f"{isa}: {mismatch}"


def test_without_the_mode_a_batch_of_bfloat16_rows_answers_otherwise():
    """What the mode is for: bfloat16 rows multiplied in a batch of 32 round otherwise than
    alone (a blocked GEMM against a GEMV), and the logprobs show it."""
    assert _mismatch(alone("bfloat16", False), in_a_batch("bfloat16", False)) is not None
