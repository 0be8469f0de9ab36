"""LLM: the offline API — `LLM(model).generate(prompts, params)`, `.chat(messages)`,
`.embed(prompts)`, `.classify(prompts)`, `.score(text_1, text_2)`, `.reward(prompts)` and
`.encode(prompts, pooling_task=...)` for a model served with `runner="pooling"` that has
the task (core.pooling.tasks), and `.encode({"data": ...})` for a model with an IO processor
(`io_processor_plugin=`).

A prompt of a model that takes images carries them as vLLM's do:
`{"prompt": ..., "multi_modal_data": {"image": a PIL image or a list}}`, one placeholder
per image in the prompt; `chat` takes them as content parts (core.entrypoints.chat_content).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from tqdm import tqdm

from core.beam_search import BeamSearchOutput, BeamSearchParams, beam_search, check_beam_width
from core.engine.core_client import run_inline
from core.engine.llm_engine import LLMEngine
from core.engine.processor import PreparedRequest
from core.engine.stat_logger import StatLoggerFactory
from core.engine_args import EngineArgs
from core.entrypoints.chat_content import (
    ContentFormat,
    messages_for_template,
    parse_chat_content,
)
from core.entrypoints.scoring import plan_scores
from core.io_processors import IOProcessor, Params, prompt_parts, require_io_processor
from core.lora.request import LoRARequest
from core.multimodal.media import MediaConnector
from core.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    IOProcessorRequestOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringRequestOutput,
)
from core.pooling.params import PoolingParams, PoolingTask
from core.request import fit_max_tokens
from core.sampling_params import SamplingParams

# Text, token ids, or {"prompt"} or {"prompt_token_ids"} with an optional "multi_modal_data".
Prompt = str | list[int] | dict[str, Any]
Message = dict[str, Any]


class LLM:
    """An engine in this process. Keyword arguments are EngineArgs fields (vLLM names);
    `stat_loggers`: StatLoggerBase classes or factories (core.engine.stat_logger) fed the
    engine's stats, besides the `core.stat_loggers` plugins."""

    def __init__(
        self,
        model: str | None = None,
        stat_loggers: Sequence[StatLoggerFactory] = (),
        **engine_args: Any,
    ) -> None:
        self.engine = LLMEngine(EngineArgs(model=model, **engine_args), stat_loggers)
        self._media = MediaConnector(self.engine.config.model.allowed_local_media_path)

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
        prepared = [self._prepare(p, sp) for p, sp in zip(batch, params, strict=True)]
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
        chat_template_content_format: ContentFormat = "auto",
    ) -> list[RequestOutput]:
        """Render each conversation with the chat template, then generate.

        Messages may hold `image_url` parts (data URLs, file URLs under
        allowed_local_media_path, http(s) URLs) and `image_pil` parts (a PIL image);
        `chat_template_content_format` is how the template sees content (see
        core.entrypoints.chat_content). Every conversation is checked and its images
        loaded before any is queued; a bad one raises ValueError naming its field."""
        self.engine.processor.require_runner("generate")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        render_options = {
            "chat_template": chat_template,
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
            "chat_template_kwargs": chat_template_kwargs,
        }
        prompts = [
            self._chat_prompt(conversation, chat_template_content_format, render_options)
            for conversation in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _chat_prompt(
        self,
        conversation: list[Message],
        content_format: ContentFormat,
        render_options: dict[str, Any],
    ) -> Prompt:
        """The conversation rendered: its token ids, and its images when it has some."""
        processor = self.engine.processor
        content = parse_chat_content(
            conversation, processor.mm_processor, processor.config.model.limit_mm_per_prompt
        )
        images = [self._media.load_image(image.source, image.field) for image in content.images]
        chat_template = render_options["chat_template"]
        messages = messages_for_template(processor, content, content_format, chat_template)
        prompt_token_ids = processor.render_chat(messages, **render_options)
        if not images:
            return prompt_token_ids
        return {"prompt_token_ids": prompt_token_ids, "multi_modal_data": {"image": images}}

    def beam_search(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: BeamSearchParams,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        use_tqdm: bool = False,
    ) -> list[BeamSearchOutput]:
        """vLLM's beam search (core.beam_search): each prompt's `params.beam_width` best
        sequences, best first, their tokens and text the prompt's and the generated ones.
        Prompts are texts, token ids or {"prompt"} / {"prompt_token_ids"} dicts;
        `lora_request` as `generate` takes it. Every prompt is checked before the first
        step (ValueError naming the field); `use_tqdm` shows the steps."""
        batch = _as_list(prompts)
        loras = _loras_for(batch, lora_request)
        for lora in loras:
            if lora is not None:
                self.engine.processor.check_lora(lora)
        check_beam_width(params, self.engine.config.model.max_logprobs)
        prompt_ids = [self._beam_prompt(prompt, params) for prompt in batch]
        tokenizer = self.engine.tokenizer
        with tqdm(total=params.max_tokens, desc="Beam search", disable=not use_tqdm) as bar:

            async def step(beams: list[tuple[int, list[int]]], step_params: SamplingParams):
                bar.update(1)  # never suspends: run_inline drives the search (core_client)
                prepared = [self.engine.prepare(tokens, step_params) for _, tokens in beams]
                return self._run(prepared, None, [loras[i] for i, _ in beams], use_tqdm=False)

            search = beam_search(prompt_ids, params, step, tokenizer.eos_token_id, tokenizer.decode)
            return run_inline(search)

    def _beam_prompt(self, prompt: Prompt, params: BeamSearchParams) -> list[int]:
        """The prompt's token ids, checked, with room for the longest beam."""
        text_or_ids, multi_modal_data = _prompt_input(prompt)
        if multi_modal_data:
            raise ValueError("multi_modal_data: beam search takes text prompts only")
        ids = self.engine.prepare(text_or_ids, SamplingParams(max_tokens=1)).prompt_token_ids
        fit_max_tokens(params.max_tokens, len(ids), self.engine.processor.max_model_len, exact=True)
        return ids

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (needs enable_sleep_mode=True; core.worker.sleep_mode): free the
        KV cache and offload (level 1: restored as they were) or drop (level 2: reloaded
        from the checkpoint) the weights until `wake_up`; generating meanwhile is a
        RuntimeError. ValueError without enable_sleep_mode or for another level."""
        self.engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back `tags` ("weights", "kv_cache"; None: both) after `sleep`; the prefix
        cache starts empty."""
        self.engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping()

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
        return self._pool(prompts, pooling_params, "embed", use_tqdm)

    def encode(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: Params | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
        pooling_task: PoolingTask | None = None,
    ) -> list[IOProcessorRequestOutput] | list[PoolingRequestOutput]:
        """Answer each request `{"data": ...}` with the model's IO processor (vLLM's
        `LLM.encode` with an IO processor plugin): its data parsed and turned into prompts,
        the prompts generated (or pooled, under `runner="pooling"`) with `pooling_params` as
        the processor's `validate_or_generate_params` leaves them, the outputs
        post-processed. One output per request, in order, the answer at `.outputs`.
        ValueError when the model has no IO processor, a request is not `{"data": ...}`, or
        the processor or the engine refuses its data; every request is checked before any
        is queued.

        With a `pooling_task` other than "plugin" (core.pooling.tasks), `prompts` are plain
        prompts pooled for that task: one PoolingRequestOutput of the task's kind each."""
        if pooling_task not in (None, "plugin"):
            return self._pool(prompts, pooling_params, pooling_task, use_tqdm)
        processor = self.engine.processor.io_processor
        if pooling_task is None and processor is None and not _is_io_request(prompts):
            tasks = self.engine.processor.pooling_tasks.supported
            raise ValueError(
                f"pooling_task is required for LLM.encode of plain prompts (this model "
                f"serves {list(tasks)}), or {{'data': ...}} requests with an IO processor"
            )
        processor = require_io_processor(processor)
        batch = [prompts] if isinstance(prompts, Mapping) else list(prompts)
        request_ids = [self.engine.new_request_id() for _ in batch]
        prepared = [
            self._prepare_io(processor, request, pooling_params, request_id)
            for request, request_id in zip(batch, request_ids, strict=True)
        ]
        flat = [p for per_request in prepared for p in per_request]
        outputs = self._run(flat, None, [None] * len(flat), use_tqdm, desc="Encoding")
        answers, start = [], 0
        for request_id, per_request in zip(request_ids, prepared, strict=True):
            mine = outputs[start : start + len(per_request)]
            start += len(per_request)
            answers.append(
                IOProcessorRequestOutput(request_id, processor.post_process(mine, request_id))
            )
        return answers

    # -- pooling tasks (core.pooling.tasks) ----------------------------------------------

    def classify(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[ClassificationRequestOutput]:
        """Each prompt's class probabilities at `.outputs.probs` (label i is the config's
        id2label[i]), in the prompts' order. ValueError naming the task unless the model
        classifies (a *ForSequenceClassification checkpoint)."""
        return self._pool(prompts, pooling_params, "classify", use_tqdm)

    def score(
        self,
        text_1: str | Sequence[str],
        text_2: str | Sequence[str],
        pooling_params: PoolingParams | None = None,
        use_tqdm: bool = True,
    ) -> list[ScoringRequestOutput]:
        """One `.outputs.score` per pair of texts, 1:1, 1:N or N:N (core.entrypoints.
        scoring): a cross-encoder's relevance, or the cosine of an embedding model's two
        vectors. ValueError naming the task unless the model scores, or naming the input."""
        plan = plan_scores(self.engine.processor, text_1, text_2, pooling_params)
        loras = [None] * len(plan.prepared)
        return plan.finish(self._run(plan.prepared, None, loras, use_tqdm, desc="Scoring"))

    def reward(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[PoolingRequestOutput]:
        """Each prompt's token-wise reward outputs (the token_classify task, as vLLM's
        `LLM.reward`): `.outputs.data` [num_prompt_tokens, num_labels]. ValueError naming
        the task unless the model has them (a decoder *ForSequenceClassification)."""
        return self._pool(prompts, pooling_params, "token_classify", use_tqdm)

    def _pool(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None,
        task: PoolingTask,
        use_tqdm: bool,
    ) -> list[Any]:
        """Every prompt pooled for `task`, validated before any is queued."""
        batch = _as_list(prompts)
        params = [_with_task(p, task) for p in _pooling_params_for(batch, pooling_params)]
        prepared = [self._prepare(p, pp) for p, pp in zip(batch, params, strict=True)]
        desc = "Embedding" if task == "embed" else "Pooling"
        return self._run(prepared, None, [None] * len(batch), use_tqdm, desc=desc)

    def _prepare_io(
        self,
        processor: IOProcessor,
        request: Mapping[str, Any],
        params: Params | None,
        request_id: str,
    ) -> list[PreparedRequest]:
        """The validated engine requests of one IO request, nothing queued."""
        if not isinstance(request, Mapping) or set(request) != {"data"}:
            raise ValueError(f'an encode request must be {{"data": ...}}, got {request!r:.80}')
        data = processor.parse_request(request["data"])
        request_params = processor.validate_or_generate_params(params)
        return [
            self.engine.prepare(parts.prompt, request_params, parts.multi_modal_data)
            for parts in prompt_parts(processor.pre_process(data, request_id))
        ]

    def _prepare(self, prompt: Prompt, params: SamplingParams | PoolingParams) -> PreparedRequest:
        text_or_ids, multi_modal_data = _prompt_input(prompt)
        return self.engine.prepare(text_or_ids, params, multi_modal_data)

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
        finished: dict[str, Any] = {}  # RequestOutputs, or PoolingRequestOutputs
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


def _with_task(params: PoolingParams, task: PoolingTask) -> PoolingParams:
    if params.task not in (None, task):
        raise ValueError(f"pooling_params.task {params.task!r} cannot be run as task {task!r}")
    return msgspec.structs.replace(params, task=task)


def _is_io_request(prompts: Any) -> bool:
    """Whether `prompts` are IO-processor requests ({"data": ...}, or a list of them)."""
    first = prompts[0] if isinstance(prompts, list) and prompts else prompts
    return isinstance(first, Mapping) and "data" in first


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


def _prompt_input(prompt: Prompt) -> tuple[str | list[int], dict[str, Any] | None]:
    """The prompt (text or token ids) and its multi_modal_data (None: none)."""
    if isinstance(prompt, str | list):
        return prompt, None
    if not isinstance(prompt, dict):
        raise ValueError(f"prompt must be text, token ids or a dict, got {type(prompt).__name__}")
    mm_data = prompt.get("multi_modal_data")
    if mm_data is not None and not isinstance(mm_data, dict):
        raise ValueError(
            "multi_modal_data must be a dict of modality -> item or items, e.g. "
            f"{{'image': image}}, not {type(mm_data).__name__}"
        )
    if "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"]), mm_data
    if "prompt" in prompt:
        return prompt["prompt"], mm_data
    raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
