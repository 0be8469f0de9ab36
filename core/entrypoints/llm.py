"""LLM: the offline API — `LLM(model).generate(prompts, params)`, `.chat(messages)`, and
`.embed(prompts)` for a model served with `runner="pooling"`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from core.engine.llm_engine import LLMEngine
from core.engine.processor import PreparedRequest
from core.engine_args import EngineArgs
from core.lora.request import LoRARequest
from core.outputs import EmbeddingRequestOutput, RequestOutput
from core.pooling.params import PoolingParams
from core.sampling_params import SamplingParams

Prompt = str | list[int] | dict[str, Any]  # text, token ids, {"prompt"} or {"prompt_token_ids"}
Message = dict[str, Any]


class LLM:
    """An engine in this process. Keyword arguments are EngineArgs fields (vLLM names)."""

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.engine = LLMEngine(EngineArgs(model=model, **engine_args))

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the prompts' order.

        `lora_request`: one adapter for every prompt, or a list aligned with the prompts
        (None entries run on the base model). Every prompt and adapter is validated before
        any is queued: a bad one raises ValueError and the engine is left as it was.
        """
        batch = _as_list(prompts)
        params = self._params_for(batch, sampling_params)
        if priority is not None and len(priority) != len(batch):
            raise ValueError(f"priority has {len(priority)} entries for {len(batch)} prompts")
        loras = _loras_for(batch, lora_request)
        for lora in loras:
            if lora is not None:
                self.engine.processor.check_lora(lora)
        prepared = [
            self.engine.prepare(_prompt_input(p), sp) for p, sp in zip(batch, params, strict=True)
        ]
        return self._run(prepared, priority, loras, use_tqdm)

    def chat(
        self,
        messages: list[Message] | Sequence[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation with the chat template, then generate."""
        self.engine.processor.require_runner("generate")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            self.engine.processor.render_chat(
                conversation,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                chat_template_kwargs=chat_template_kwargs,
            )
            for conversation in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm)

    def embed(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[EmbeddingRequestOutput]:
        """Embed every prompt; outputs come back in the prompts' order, each vector at
        `.outputs.embedding`. The model must be served with `runner="pooling"` (detected
        for embedding checkpoints), else ValueError. Every prompt is validated before any
        is queued."""
        batch = _as_list(prompts)
        params = _pooling_params_for(batch, pooling_params)
        prepared = [
            self.engine.prepare(_prompt_input(p), pp) for p, pp in zip(batch, params, strict=True)
        ]
        return self._run(prepared, None, [None] * len(batch), use_tqdm, desc="Embedding")

    def _params_for(
        self, batch: list[Prompt], params: SamplingParams | Sequence[SamplingParams] | None
    ) -> list[SamplingParams]:
        if params is None:
            return [self.engine.default_sampling_params()] * len(batch)
        if isinstance(params, SamplingParams):
            return [params] * len(batch)
        if len(params) != len(batch):
            raise ValueError(f"sampling_params has {len(params)} entries for {len(batch)} prompts")
        return list(params)

    def _run(
        self,
        prepared: list[PreparedRequest],
        priority: Sequence[int] | None,
        loras: list[LoRARequest | None],
        use_tqdm: bool,
        desc: str = "Generating",
    ) -> list[Any]:
        ids = [self.engine.new_request_id() for _ in prepared]
        for i, (request_id, request) in enumerate(zip(ids, prepared, strict=True)):
            self.engine.add_prepared(
                request_id,
                request,
                priority=priority[i] if priority else 0,
                lora_request=loras[i],
            )
        finished: dict[str, Any] = {}  # RequestOutputs, or EmbeddingRequestOutputs
        with tqdm(total=len(ids), desc=desc, disable=not use_tqdm) as bar:
            while len(finished) < len(ids):
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
        return [finished[request_id] for request_id in ids]


def _pooling_params_for(
    batch: list[Prompt], params: PoolingParams | Sequence[PoolingParams] | None
) -> list[PoolingParams]:
    if params is None or isinstance(params, PoolingParams):
        return [params or PoolingParams()] * len(batch)
    if len(params) != len(batch):
        raise ValueError(f"pooling_params has {len(params)} entries for {len(batch)} prompts")
    return list(params)


def _loras_for(
    batch: list[Prompt], lora_request: LoRARequest | Sequence[LoRARequest | None] | None
) -> list[LoRARequest | None]:
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * len(batch)
    loras = list(lora_request)
    if len(loras) != len(batch):
        raise ValueError(f"lora_request has {len(loras)} entries for {len(batch)} prompts")
    bad = [r for r in loras if r is not None and not isinstance(r, LoRARequest)]
    if bad:
        raise ValueError(f"lora_request entries must be LoRARequest or None, got {bad[0]!r}")
    return loras


def _as_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str | dict):
        return [prompts]
    if isinstance(prompts, list) and prompts and isinstance(prompts[0], int):
        return [prompts]
    return list(prompts)


def _prompt_input(prompt: Prompt) -> str | list[int]:
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return prompt["prompt"]
        raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
    if isinstance(prompt, str | list):
        return prompt
    raise ValueError(f"prompt must be text, token ids or a dict, got {type(prompt).__name__}")
