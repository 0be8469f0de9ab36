"""`core generate`: one prompt, streamed to stdout as it is generated."""

from __future__ import annotations

import sys
from typing import Any

import msgspec

from core.engine.llm_engine import LLMEngine
from core.engine.output_processor import RequestOutputKind
from core.engine_args import EngineArgs
from core.sampling_params import SamplingParams

_SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def stream_completion(prompt: str, options: dict[str, Any]) -> None:
    given = {k: options[k] for k in _SAMPLING_FLAGS if options.get(k) is not None}
    SamplingParams(**given)  # fail on a bad flag before the model loads
    engine = LLMEngine(EngineArgs.from_cli(options))
    # Built anew, not replaced, so every value passes SamplingParams' validation.
    params = SamplingParams(
        **{
            **msgspec.structs.asdict(engine.default_sampling_params()),
            "max_tokens": options["max_tokens"],
            "stop": list(options["stop"]) or None,
            "seed": options["sampling_seed"],
            **given,
        }
    )
    if options["chat"]:
        request: str | list[int] = engine.processor.render_chat(
            [{"role": "user", "content": prompt}]
        )
    else:
        request = prompt
    engine.add_prepared("generate", engine.prepare(request, params), RequestOutputKind.DELTA)
    while engine.has_unfinished_requests():
        for output in engine.step():
            sys.stdout.write(output.outputs[0].text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    engine.shutdown()
