"""JSON-schema output under n-gram speculation: valid, and the same as without drafts.

SmolLM2 (the default model) asked to copy a list into a schema'd JSON object: its output
repeats the prompt's words, so prompt lookup drafts often, and drafts the grammar refuses
(a closing quote where a comma must go...) are trimmed; the bitmask covers every draft
position, and the grammar rolls back over the rejected ones.
"""

from __future__ import annotations

import json

import pytest

from core import LLM, SamplingParams
from core.sampling_params import StructuredOutputsParams

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "fruits": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 6},
        "count": {"type": "integer"},
    },
    "required": ["fruits", "count"],
    "additionalProperties": False,
}
PROMPTS = [
    "Put these fruits into JSON with their count: apple, banana, cherry, date, fig, grape, "
    "kiwi, lemon, mango, apple, banana, cherry.",
]


def _generate(speculative_config: dict | None) -> tuple[list[str], LLM]:
    llm = LLM(max_model_len=512, speculative_config=speculative_config)
    params = SamplingParams(
        temperature=0.0, max_tokens=120, structured_outputs=StructuredOutputsParams(json=SCHEMA)
    )
    messages = [[{"role": "user", "content": p}] for p in PROMPTS]
    outputs = llm.chat(messages, params, use_tqdm=False)
    assert all(o.outputs[0].finish_reason == "stop" for o in outputs)  # not cut off
    return [o.outputs[0].text for o in outputs], llm


def test_json_schema_output_stays_valid_with_ngram_speculation():
    config = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
              "prompt_lookup_max": 4}  # fmt: skip
    texts, llm = _generate(config)
    for text in texts:
        value = json.loads(text)
        assert set(value) == {"fruits", "count"}  # required, and nothing else
        assert isinstance(value["count"], int)
        assert len(value["fruits"]) >= 3 and all(isinstance(f, str) for f in value["fruits"])
    spec = llm.engine.core.scheduler.make_stats().spec_decoding
    assert spec.num_drafts > 0 and spec.num_accepted_tokens > 0
    assert texts == _generate(None)[0]
