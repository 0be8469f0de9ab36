"""LLMEngine: the synchronous frontend over an in-process EngineCore.

It owns what happens in the frontend process (DESIGN.md section 4): tokenizing,
validating requests before they reach the engine core (so bad input is a ValueError and
nothing is queued), and turning the engine core's token ids into RequestOutputs.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from core.engine.core import EngineCore
from core.engine.output_processor import OutputProcessor, OutputQueue, RequestOutputKind
from core.engine.protocol import EngineCoreRequest
from core.engine_args import EngineArgs
from core.model_loader import Checkpoint, resolve_model
from core.model_loader.gguf_loader import GGUFCheckpoint
from core.models.arch_config import ArchConfig
from core.outputs import RequestOutput
from core.platforms.selection import select_platform
from core.plugins.hooks import get_hook_manager
from core.plugins.registry import get_registry
from core.sampling_params import SamplingParams
from core.tokenizer import Tokenizer, load_generation_defaults

logger = logging.getLogger(__name__)

# The generation_config.json keys that become SamplingParams defaults.
_GENERATION_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


@dataclass
class PreparedRequest:
    """A validated request, ready to be queued."""

    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams


class LLMEngine:
    def __init__(self, engine_args: EngineArgs) -> None:
        registry = get_registry()
        registry.run_general_plugins()
        choice = select_platform(registry, engine_args.device)
        hooks = get_hook_manager(registry)
        checkpoint = resolve_model(engine_args.model)
        arch = ArchConfig.from_hf(checkpoint.hf_config)
        self.config = engine_args.create_engine_config(
            choice.platform, hooks, model_max_len=arch.max_position_embeddings
        )
        self.served_model_name = self.config.model.served_model_name or checkpoint.served_name
        self.max_model_len = self.config.model.max_model_len
        self.vocab_size = arch.vocab_size
        self.tokenizer = load_tokenizer(checkpoint, self.config.model.tokenizer)
        self.generation_defaults = self._generation_defaults(checkpoint)
        self.core = EngineCore(self.config, choice.platform, checkpoint, hooks)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    def _generation_defaults(self, checkpoint: Checkpoint) -> dict:
        source = self.config.model.generation_config
        if source == "none" or isinstance(checkpoint, GGUFCheckpoint) and source == "auto":
            return {}
        directory = checkpoint.path if source == "auto" else Path(source)
        found = load_generation_defaults(directory)
        return {_GENERATION_KEYS[k]: v for k, v in found.items() if k in _GENERATION_KEYS}

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults."""
        return SamplingParams(**self.generation_defaults)

    # -- requests -------------------------------------------------------------------------

    def new_request_id(self) -> str:
        return str(next(self._ids))

    def prepare(self, prompt: str | list[int], params: SamplingParams) -> PreparedRequest:
        """Tokenize and validate; ValueError naming the problem, nothing queued."""
        if isinstance(prompt, str):
            text: str | None = prompt
            token_ids = self.tokenizer.encode(prompt) if prompt else []
        else:
            text, token_ids = None, list(prompt)
        if not token_ids:
            raise ValueError("prompt must not be empty")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt is {len(token_ids)} tokens long, but max_model_len is "
                f"{self.max_model_len}: the prompt and at least one generated token must fit"
            )
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary")
        params = msgspec.structs.replace(params)  # the caller's object stays untouched
        params.verify(self.config.model.max_logprobs, self.vocab_size)
        params.resolve_bad_words(lambda word: self.tokenizer.encode(word, False))
        return PreparedRequest(text, token_ids, params)

    def add_prepared(
        self,
        request_id: str,
        prepared: PreparedRequest,
        output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
        queue: OutputQueue | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> None:
        request = EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=prepared.prompt_token_ids,
            sampling_params=prepared.params,
            eos_token_id=self.tokenizer.eos_token_id,
            arrival_time=time.time(),
            priority=priority,
            cache_salt=cache_salt,
        )
        for child in self.output_processor.add_request(
            request, prepared.prompt, output_kind, queue
        ):
            self.core.add_request(child)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY,
        priority: int = 0,
    ) -> None:
        self.add_prepared(request_id, self.prepare(prompt, params), output_kind, None, priority)

    def abort_request(self, request_ids: list[str]) -> None:
        self.core.abort_requests(self.output_processor.abort_requests(request_ids))

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        processed = self.output_processor.process_outputs(self.core.step())
        if processed.reqs_to_abort:  # finished here by a stop string
            self.core.abort_requests(processed.reqs_to_abort)
        return processed.request_outputs

    def shutdown(self) -> None:
        self.core.shutdown()


def load_tokenizer(checkpoint: Checkpoint, override: str | None = None) -> Tokenizer:
    """The tokenizer of `override` (a directory or .gguf) or of the checkpoint itself."""
    path = Path(override) if override else checkpoint.path
    if path.suffix == ".gguf":
        return Tokenizer.from_gguf(path)
    return Tokenizer.from_dir(path)
