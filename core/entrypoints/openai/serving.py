"""The generation endpoints: /v1/completions and /v1/chat/completions.

A request's `model` picks the base model or one of the LoRA adapters served (ServedModels);
each of its engine requests runs with that adapter, and its responses carry that name.

Each prompt of a request becomes one engine request (n samples each); outputs are
consumed as deltas, so a client disconnect is noticed between tokens and aborts the
work. Metrics are recorded by the engine frontend (AsyncLLM.stats_listeners), not here.

Turning a request into engine requests (tokenizing, rendering the chat template) runs
off the event loop (OffLoop). A request's own `chat_template` is code the client sends:
it is refused unless the server was started with --trust-request-chat-template, as vLLM.
A chat request's images are loaded before that (core.multimodal.media: each download and
decode on a worker thread, all of a request's at once), once its content parts are
checked and its images counted (core.entrypoints.chat_content); any failure there is a 400
naming the part, and nothing reaches the engine.

A request refused before its stream starts (a dead engine core included: 503) is an HTTP
error like a non-streaming one; once a stream has started, a failure is its last SSE event,
with the body the error response would have had (errors.as_openai_error). An engine request
aborted by the server (its shutdown deadline) ends a stream with finish_reason "abort";
a non-streaming request gets a 503 instead, so a partial completion never passes for a
finished one and the client may retry elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from core.beam_search import BeamSearchParams
from core.engine.async_llm import AsyncLLM
from core.engine.core_client import EngineDeadError
from core.engine.processor import ChatRenderError, PreparedRequest
from core.entrypoints.chat_content import (
    ChatContent,
    ContentFormat,
    messages_for_template,
    parse_chat_content,
)
from core.entrypoints.openai import protocol as p
from core.entrypoints.openai import responses as r
from core.entrypoints.openai.beam_search import beam_search_params
from core.entrypoints.openai.errors import OpenAIError, as_openai_error
from core.entrypoints.openai.frontend_args import FrontendArgs
from core.entrypoints.openai.offload import OffLoop
from core.entrypoints.openai.params import (
    chat_sampling_params,
    completion_sampling_params,
    field_error,
)
from core.entrypoints.openai.reasoning import output_reasoning_parser, reasoning_sampling_params
from core.entrypoints.openai.request_logger import RequestLogger
from core.entrypoints.openai.request_options import (
    EngineRequestOptions,
    engine_request_options,
)
from core.entrypoints.openai.sequence_limit import check_sequence_limit
from core.entrypoints.openai.serving_models import ServedModels
from core.entrypoints.openai.tool_calls import ToolCalling, ToolPlan, ToolStream
from core.lora.request import LoRARequest
from core.multimodal.media import MediaConnector
from core.multimodal.processing import process_prompt
from core.outputs import CompletionOutput, RequestOutput
from core.reasoning import ReasoningParser, ReasoningStream
from core.request import FinishReason
from core.sampling_params import SamplingParams


@dataclass
class TrackedRequest:
    """One prompt's engine request, accumulated from its deltas."""

    prompt_index: int
    prepared: PreparedRequest
    lora_request: LoRARequest | None  # the adapter it runs with; None: the base model
    options: EngineRequestOptions  # the whole request's id, priority and cache salt
    num_tokens: int = 0
    # sample index -> accumulated (text, token_ids, logprobs) and the final fields
    samples: dict[int, CompletionOutput] = field(default_factory=dict)
    prompt_logprobs: list | None = None
    num_cached_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None  # the KV connector's, once finished
    beam_search: BeamSearchParams | None = None  # use_beam_search's; None: sampled


class Serving:
    def __init__(
        self,
        engine: AsyncLLM,
        models: ServedModels,
        offload: OffLoop,
        request_logger: RequestLogger | None = None,
        tool_calling: ToolCalling = ToolCalling(),
        trust_request_chat_template: bool = False,
        content_format: ContentFormat = "auto",
        force_include_usage: bool = False,
        prompt_tokens_details: bool = False,
        max_sequences_per_request: int = FrontendArgs.max_sequences_per_request,
    ):
        """`offload`: where requests are tokenized and rendered; `request_logger`: logs
        each engine request's inputs (--enable-log-requests); `tool_calling`: the
        --enable-auto-tool-choice / --tool-call-parser settings;
        `trust_request_chat_template`: accept a request's own chat_template;
        `content_format`: --chat-template-content-format; `force_include_usage`,
        `prompt_tokens_details`: --enable-force-include-usage,
        --enable-prompt-tokens-details; `max_sequences_per_request`: its flag (see
        sequence_limit). ValueError naming --allowed-local-media-path when that is not a
        directory."""
        self.engine = engine
        self.models = models
        self.offload = offload
        self.request_logger = request_logger
        self.tool_calling = tool_calling
        self.trust_request_chat_template = trust_request_chat_template
        self.content_format = content_format
        self.force_include_usage = force_include_usage
        self.prompt_tokens_details = prompt_tokens_details
        self.max_sequences_per_request = max_sequences_per_request
        self.media = MediaConnector(engine.processor.config.model.allowed_local_media_path)
        # Built here: on a request it would be built on the event loop (it reads the
        # checkpoint's preprocessor config).
        self.mm_processor = engine.processor.mm_processor
        # --reasoning-parser's (None: outputs are all content).
        self.reasoning_parser = engine.reasoning_parser

    # -- shared ---------------------------------------------------------------------------

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names (None: the base model); a 404 when no
        served model has that name."""
        return self.models.lora_request(model)

    def _prepare(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        prompt_field: str,
        multi_modal_data: dict[str, list[Any]] | None = None,
    ) -> PreparedRequest:
        """The InputProcessor's request; its ValueError is a 400 naming the request's field
        (``prompt_field`` is what the request calls the prompt, and holds its images)."""
        try:
            return self.engine.processor.prepare(prompt, params, multi_modal_data)
        except ValueError as exc:
            raise _input_error(exc, prompt_field) from exc

    def _options(
        self, req: p.CompletionRequest | p.ChatCompletionRequest, raw: Request
    ) -> EngineRequestOptions:
        config = self.engine.processor.config
        return engine_request_options(
            req, raw, config.scheduler.policy, config.kv_transfer.kv_connector
        )

    def decode_token(self, token_id: int) -> str:
        return self.engine.tokenizer.decode([token_id])

    async def deltas(
        self, requests: list[TrackedRequest], raw: Request | None
    ) -> AsyncIterator[tuple[TrackedRequest, RequestOutput]]:
        """Deltas of every request, interleaved; aborts all if the client goes away, or
        when the consumer stops (cancelled). `raw` None: no client waits on them (a
        Responses API background response), nothing is watched."""
        queue: asyncio.Queue = asyncio.Queue()
        options = requests[0].options
        base = options.request_id or self.engine.new_request_id()

        async def pump(tracked: TrackedRequest) -> None:
            request_id = f"{base}-{tracked.prompt_index}"
            if self.request_logger is not None:
                self.request_logger.log_inputs(request_id, tracked.prepared, tracked.lora_request)
            try:
                run = self.engine.generate if tracked.beam_search is None else partial(
                    self.engine.beam_search, params=tracked.beam_search
                )  # fmt: skip
                outputs = run(
                    request_id,
                    tracked.prepared,
                    priority=options.priority,
                    lora_request=tracked.lora_request,
                    cache_salt=options.cache_salt,
                )
                async for output in outputs:
                    await queue.put((tracked, output))
            except BaseException as exc:  # delivered to the consumer, which re-raises
                await queue.put((tracked, exc))

        tasks = [asyncio.create_task(pump(t)) for t in requests]
        last_check = time.monotonic()
        try:
            remaining = len(requests)
            while remaining:
                try:
                    tracked, item = await asyncio.wait_for(queue.get(), timeout=1.0)
                except TimeoutError:
                    tracked, item = None, None
                if raw is not None and time.monotonic() - last_check >= 1.0:
                    last_check = time.monotonic()
                    if await raw.is_disconnected():
                        return  # the finally below aborts every request
                if item is None:
                    continue
                if isinstance(item, BaseException):
                    raise item
                self._record(tracked, item)
                if item.finished:
                    remaining -= 1
                yield tracked, item
        finally:
            for task in tasks:  # cancelling a pump aborts its engine request
                task.cancel()

    async def _run_to_end(self, requests: list[TrackedRequest], raw: Request) -> None:
        """Run a non-streaming request's engine requests to their end; a 503 when the
        server aborted one (its shutdown deadline, or a POST /sleep)."""
        async for _ in self.deltas(requests, raw):
            pass
        finish_reasons = {s.finish_reason for t in requests for s in t.samples.values()}
        if str(FinishReason.ABORT) in finish_reasons:
            raise OpenAIError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                "the server aborted the request before it finished (it is shutting down or "
                "going to sleep)",
                code="aborted",
            )

    def _record(self, tracked: TrackedRequest, output: RequestOutput) -> None:
        tracked.num_tokens += sum(len(o.token_ids) for o in output.outputs)
        for delta in output.outputs:
            _accumulate(tracked.samples, delta)
        if output.prompt_logprobs:
            tracked.prompt_logprobs = (tracked.prompt_logprobs or []) + output.prompt_logprobs
        tracked.num_cached_tokens = max(tracked.num_cached_tokens, output.num_cached_tokens)
        if output.kv_transfer_params is not None:
            tracked.kv_transfer_params = output.kv_transfer_params

    def _final_output(self, tracked: TrackedRequest) -> RequestOutput:
        return RequestOutput(
            request_id="",
            prompt=tracked.prepared.prompt,
            prompt_token_ids=tracked.prepared.prompt_token_ids,
            prompt_logprobs=tracked.prompt_logprobs,
            outputs=[tracked.samples[i] for i in sorted(tracked.samples)],
            finished=True,
            num_cached_tokens=tracked.num_cached_tokens,
            kv_transfer_params=tracked.kv_transfer_params,
        )

    def _usage(self, requests: list[TrackedRequest]) -> p.UsageInfo:
        prompt = sum(len(t.prepared.prompt_token_ids) for t in requests)
        completion = sum(t.num_tokens for t in requests)
        details = None
        if self.prompt_tokens_details:
            cached = sum(t.num_cached_tokens for t in requests)
            details = p.PromptTokensDetails(cached_tokens=cached)
        return p.UsageInfo(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=details,
        )

    def _stream(self, chunks: AsyncIterator[str]) -> StreamingResponse:
        return StreamingResponse(chunks, media_type="text/event-stream")

    @staticmethod
    def _sse(model: p._Response | dict[str, Any]) -> str:
        body = model if isinstance(model, dict) else model.model_dump(exclude_none=True)
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    # -- /v1/completions ------------------------------------------------------------------

    async def completions(self, req: p.CompletionRequest, raw: Request) -> Any:
        self.engine.check_healthy()  # a 503 before a stream's 200, as without streaming
        lora = self.check_model(req.model)
        self.engine.processor.require_runner("generate")  # a 400 on an embedding model
        check_sequence_limit(len(req.prompts()), req.n or 1, self.max_sequences_per_request)
        options = self._options(req, raw)
        requests = await self.offload.run(self._completion_requests, req, lora, options)
        n = requests[0].prepared.params.n
        if req.stream:
            choices = self._completion_choices(req, n)
            stream = self._event_stream(req, requests, raw, p.CompletionStreamResponse, choices)
            return self._stream(stream)
        await self._run_to_end(requests, raw)
        choices = [
            r.completion_choice(
                self._final_output(t),
                sample,
                self.decode_token,
                index=t.prompt_index * n + sample.index,
                echo_text=self._echo_text(t) if req.echo else None,
                whole=True,
            )
            for t in requests
            for sample in self._final_output(t).outputs
        ]
        response = p.CompletionResponse(
            model=self.models.model_name(lora),
            choices=choices,
            usage=self._usage(requests),
            kv_transfer_params=requests[0].kv_transfer_params,
        )
        return JSONResponse(response.model_dump(exclude_none=True))

    def _completion_requests(
        self, req: p.CompletionRequest, lora: LoRARequest | None, options: EngineRequestOptions
    ) -> list[TrackedRequest]:
        """One engine request per prompt, tokenized and validated (on the OffLoop)."""
        requests = []
        for i, prompt in enumerate(req.prompts()):
            prompt_len = (
                len(prompt)
                if isinstance(prompt, list)
                else len(self.engine.tokenizer.encode(prompt))
            )
            params = completion_sampling_params(
                req, self.engine.processor.max_model_len, prompt_len,
                self.engine.processor.generation_defaults,
            )  # fmt: skip
            prepared = self._prepare(prompt, params, "prompt")
            max_logprobs = self.engine.processor.config.model.max_logprobs
            search = beam_search_params(req, params, max_logprobs)
            requests.append(TrackedRequest(i, prepared, lora, options, beam_search=search))
        return requests

    def _echo_text(self, tracked: TrackedRequest) -> str:
        prepared = tracked.prepared
        return prepared.prompt or self.engine.tokenizer.decode(prepared.prompt_token_ids)

    def _completion_choices(
        self, req: p.CompletionRequest, n: int
    ) -> Callable[[TrackedRequest, RequestOutput], list[p.CompletionResponseChoice]]:
        """Turns each delta into stream choices; the prompt is echoed once per sample and
        logprob text offsets continue where the previous chunk stopped."""
        offsets: dict[tuple[int, int], int] = {}

        def choices(tracked: TrackedRequest, output: RequestOutput) -> list:
            made = []
            for sample in output.outputs:
                key = (tracked.prompt_index, sample.index)
                first = key not in offsets
                choice = r.completion_choice(
                    output,
                    sample,
                    self.decode_token,
                    index=tracked.prompt_index * n + sample.index,
                    echo_text=self._echo_text(tracked) if req.echo and first else None,
                    text_offset=offsets.get(key, 0),
                )
                offsets[key] = offsets.get(key, 0) + len(choice.text)
                made.append(choice)
            return made

        return choices

    async def _event_stream(
        self,
        req: p.CompletionRequest | p.ChatCompletionRequest,
        requests: list[TrackedRequest],
        raw: Request,
        response_cls: type[p.CompletionStreamResponse] | type[p.ChatCompletionStreamResponse],
        choices_of: Callable[[TrackedRequest, RequestOutput], list],
    ) -> AsyncIterator[str]:
        """SSE chunks of one response id (each with the usage so far when
        stream_options.continuous_usage_stats asks, as vLLM's), the usage chunk if asked,
        then [DONE]."""
        prefix = "cmpl" if response_cls is p.CompletionStreamResponse else "chatcmpl"
        header = {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": self.models.model_name(requests[0].lora_request),
        }
        continuous = req.stream_options is not None and req.stream_options.continuous_usage_stats
        try:
            async for tracked, output in self.deltas(requests, raw):
                # One choice a chunk, as OpenAI sends them (a delta of n samples is n chunks);
                # a tool parser may hold a whole delta back (no choice, no chunk).
                for choice in choices_of(tracked, output):
                    usage = self._usage(requests) if continuous else None
                    yield self._sse(response_cls(**header, choices=[choice], usage=usage))
            asked = req.stream_options is not None and req.stream_options.include_usage
            if asked or self.force_include_usage:
                yield self._sse(response_cls(**header, choices=[], usage=self._usage(requests)))
        except (OpenAIError, EngineDeadError, ValueError) as exc:
            yield self._sse(as_openai_error(exc).body())
        yield "data: [DONE]\n\n"

    # -- /v1/chat/completions -------------------------------------------------------------

    async def chat_content(self, req: p._ChatTemplateRequest) -> tuple[ChatContent, list[Any]]:
        """The request's conversation, its content parts checked, and its images loaded (in
        the conversation's order). A 400 naming chat_template if the request brings one the
        server does not trust, and naming the part at fault for a part, an image or an
        image count the model or the server does not take (nothing is loaded then)."""
        if req.chat_template is not None and not self.trust_request_chat_template:
            raise OpenAIError(
                HTTPStatus.BAD_REQUEST,
                "chat_template: this server does not render templates sent with requests; "
                "start it with --trust-request-chat-template to allow them",
                param="chat_template",
            )
        processor = self.engine.processor
        try:
            content = parse_chat_content(
                req.conversation(),
                self.mm_processor,
                processor.config.model.limit_mm_per_prompt,
            )
            images = await self.media.load_images([(i.source, i.field) for i in content.images])
        except ValueError as exc:
            raise _field_path_error(exc) from exc
        return content, images

    def render_chat(
        self,
        req: p._ChatTemplateRequest,
        content: ChatContent,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The request's conversation (`content`, from `chat_content`), with `tools`
        (OpenAI's dicts) shown to the template, as prompt token ids: each image a
        placeholder, not expanded yet. A 400 naming messages (or the request's own
        chat_template) if the chat template cannot render it, chat_template_kwargs if they
        are refused, and tools if it renders the same prompt without them (it ignores
        them). Blocking: call it on the OffLoop."""
        processor = self.engine.processor
        messages = messages_for_template(
            processor, content, self.content_format, req.chat_template, tools
        )

        def render(tools: list[dict[str, Any]] | None) -> list[int]:
            return processor.render_chat(
                messages,
                chat_template=req.chat_template,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template_kwargs=req.chat_template_kwargs,
                tools=tools,
            )

        try:
            prompt_ids = render(tools)
            ignored = bool(tools) and prompt_ids == render(None)
        except ChatRenderError as exc:
            raise OpenAIError(
                HTTPStatus.BAD_REQUEST, str(exc), param=_render_param(exc, req)
            ) from exc
        if ignored:
            raise OpenAIError(
                HTTPStatus.BAD_REQUEST,
                "tools: the chat template does not render tools; pass a chat_template that "
                "does (or start the server with --chat-template)",
                param="tools",
            )
        return prompt_ids

    def expand_images(self, prompt_ids: list[int], images: list[Any]) -> list[int]:
        """`prompt_ids` (from `render_chat`) with each image's placeholder expanded to the
        positions its embeddings take, as the engine will see them; a 400 naming messages
        when the placeholders and the images do not match. Blocking: on the OffLoop."""
        limits = self.engine.processor.config.model.limit_mm_per_prompt
        try:
            # self.mm_processor is set: chat_content took the images
            expanded = process_prompt(self.mm_processor, prompt_ids, {"image": images}, limits)
        except ValueError as exc:
            raise _input_error(exc, "messages") from exc
        return expanded.prompt_token_ids

    async def chat(self, req: p.ChatCompletionRequest, raw: Request) -> Any:
        self.engine.check_healthy()  # a 503 before a stream's 200, as without streaming
        lora = self.check_model(req.model)
        self.engine.processor.require_runner("generate")  # a 400 on an embedding model
        check_sequence_limit(1, req.n or 1, self.max_sequences_per_request)
        options = self._options(req, raw)
        content, images = await self.chat_content(req)
        tracked, tools = await self.offload.run(
            self.chat_request, req, content, images, lora, options
        )
        requests = [tracked]
        num_top = req.top_logprobs or 0
        prompt_ids = tracked.prepared.prompt_token_ids
        reasoning = output_reasoning_parser(self.reasoning_parser, prompt_ids)
        if req.stream:
            choices = self._chat_choices(num_top, tools, reasoning)
            stream = self._event_stream(req, requests, raw, p.ChatCompletionStreamResponse, choices)
            return self._stream(stream)
        await self._run_to_end(requests, raw)
        final = self._final_output(requests[0])
        choices = [
            r.chat_choice(o, self.decode_token, num_top, tools, reasoning) for o in final.outputs
        ]
        response = p.ChatCompletionResponse(
            model=self.models.model_name(lora),
            choices=choices,
            usage=self._usage(requests),
            kv_transfer_params=requests[0].kv_transfer_params,
            prompt_logprobs=r.prompt_logprobs(final, self.decode_token),
        )
        return JSONResponse(response.model_dump(exclude_none=True))

    def chat_request(
        self,
        req: p.ChatCompletionRequest,
        content: ChatContent,
        images: list[Any],
        lora: LoRARequest | None,
        options: EngineRequestOptions,
    ) -> tuple[TrackedRequest, ToolPlan]:
        """The conversation rendered, tokenized and validated with its images (on the
        OffLoop), and how its output is read for tool calls."""
        tools = self.tool_calling.plan(req, self.engine.tokenizer)
        prompt_ids = self.render_chat(req, content, tools.tools)
        params = chat_sampling_params(
            req, self.engine.processor.max_model_len, len(prompt_ids),
            self.engine.processor.generation_defaults,
        )  # fmt: skip
        params = tools.sampling_params(params)
        params = reasoning_sampling_params(self.reasoning_parser, params)
        multi_modal_data = {"image": images} if images else None
        prepared = self._prepare(prompt_ids, params, "messages", multi_modal_data)
        max_logprobs = self.engine.processor.config.model.max_logprobs
        search = beam_search_params(req, params, max_logprobs)
        return TrackedRequest(0, prepared, lora, options, beam_search=search), tools

    def _chat_choices(
        self, num_top: int, tools: ToolPlan, reasoning: ReasoningParser | None = None
    ) -> Callable[[TrackedRequest, RequestOutput], list[p.ChatCompletionStreamChoice]]:
        """Turns each delta into stream choices; a sample's first chunk names the role.
        Each sample's text goes through its own ReasoningStream with a `reasoning` parser,
        and its content through its own ToolStream when the plan parses output."""
        started: set[int] = set()
        streams: dict[int, ToolStream | None] = {}
        reasonings: dict[int, ReasoningStream | None] = {}

        def choices(_: TrackedRequest, output: RequestOutput) -> list:
            made = []
            for sample in output.outputs:
                role = None if sample.index in started else "assistant"
                started.add(sample.index)
                if sample.index not in streams:
                    streams[sample.index] = tools.stream()
                    reasonings[sample.index] = (
                        None if reasoning is None else ReasoningStream(reasoning)
                    )
                choice = r.chat_stream_choice(
                    sample, self.decode_token, num_top, role=role, tools=streams[sample.index],
                    reasoning=reasonings[sample.index],
                )  # fmt: skip
                if choice is not None:
                    made.append(choice)
            return made

        return choices


def _input_error(exc: ValueError, prompt_field: str) -> OpenAIError:
    """A 400 for the InputProcessor's ValueError, naming the request's field: `prompt_field`
    is what the request calls the prompt, which holds its images too; a logits processor's
    arguments (extra_args) come from vllm_xargs."""
    renames = {"prompt": prompt_field, "multi_modal_data": prompt_field, "extra_args": "vllm_xargs"}
    return field_error(str(exc), renames)


# The field a chat content or media error starts with: `messages[0].content[1].image_url`.
_FIELD_PATH = re.compile(r"messages(\[\d+\]|\.[a-z_]+)*")


def _field_path_error(exc: ValueError) -> OpenAIError:
    """A 400 for an error of chat_content or media, its `param` the field it starts with."""
    path = _FIELD_PATH.match(str(exc))
    return OpenAIError(HTTPStatus.BAD_REQUEST, str(exc), param=path.group(0) if path else None)


def _render_param(exc: ChatRenderError, req: p._ChatTemplateRequest) -> str:
    """The request field a render error names: the one the processor blames, except that a
    template the request brought is a likelier culprit than its messages."""
    if exc.field == "messages" and req.chat_template is not None:
        return "chat_template"
    return exc.field


def _accumulate(samples: dict[int, CompletionOutput], delta: CompletionOutput) -> None:
    sample = samples.get(delta.index)
    if sample is None:
        samples[delta.index] = CompletionOutput(
            index=delta.index,
            text=delta.text,
            token_ids=list(delta.token_ids),
            cumulative_logprob=delta.cumulative_logprob,
            logprobs=list(delta.logprobs) if delta.logprobs is not None else None,
            finish_reason=delta.finish_reason,
            stop_reason=delta.stop_reason,
        )
        return
    sample.text += delta.text
    sample.token_ids.extend(delta.token_ids)
    if delta.logprobs is not None and sample.logprobs is not None:
        sample.logprobs.extend(delta.logprobs)
    sample.cumulative_logprob = delta.cumulative_logprob
    sample.finish_reason, sample.stop_reason = delta.finish_reason, delta.stop_reason
