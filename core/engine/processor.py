"""The frontend's input side, shared by LLMEngine and AsyncLLM.

It resolves the model and the configuration, loads the tokenizer, renders chat
conversations, and turns a prompt and SamplingParams into a validated request — so bad
input is a ValueError in the frontend and never reaches the engine core. Each ValueError's
message starts with the input field it names (`prompt`, `messages`, a SamplingParams
field), which the OpenAI server turns into the error's `param`; a chat render error also
carries its field as data (ChatRenderError.field).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import msgspec
import torch

from core.chat_template import check_template_kwargs, load_chat_template
from core.config import EngineConfig, UsageContext
from core.engine.protocol import EngineCoreRequest
from core.engine_args import EngineArgs
from core.input_checks import check_text
from core.io_processors.interface import IOProcessor
from core.io_processors.selector import load_io_processor
from core.lora.request import LoRARequest
from core.lora.selector import lora_manager_class
from core.model_loader import Checkpoint, resolve_model
from core.model_loader.gguf_loader import GGUFCheckpoint
from core.model_loader.load_checks import check_load_options
from core.models.arch_config import ArchConfig
from core.models.multimodal import supports_multimodal
from core.models.registry import resolve_model_class
from core.multimodal.encoder_cache import EncoderBudget
from core.multimodal.inputs import MultiModalFeature
from core.multimodal.media import allowed_media_root
from core.multimodal.processing import MultiModalProcessor, process_prompt
from core.platforms.interface import Platform
from core.platforms.selection import select_platform
from core.plugins.hooks import get_hook_manager
from core.plugins.registry import get_registry
from core.pooling.params import PoolingParams
from core.pooling.runner import CheckpointPooling
from core.pooling.tasks import ModelTasks
from core.quantization.selector import build_quantization_config
from core.request import check_pooled_prompt, fit_max_tokens
from core.sample.logits_processor_selector import logits_processor_classes
from core.sampling_params import SamplingParams
from core.tokenizer import load_generation_defaults, load_tokenizer

# The generation_config.json keys that become SamplingParams defaults.
_GENERATION_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


class ChatRenderError(ValueError):
    """A conversation `InputProcessor.render_chat` cannot render. `field` is the input at
    fault, as data for callers that report it (the OpenAI server's `param`): the
    `chat_template_kwargs` it refused, or the `messages` the template failed on."""

    def __init__(self, message: str, field: Literal["chat_template_kwargs", "messages"]):
        super().__init__(message)
        self.field = field


@dataclass
class PreparedRequest:
    """A validated request, ready to be queued."""

    prompt: str | None
    prompt_token_ids: list[int]  # placeholders expanded: one per embedding of each item
    params: SamplingParams | PoolingParams  # generate, or embed (--runner pooling)
    mm_features: list[MultiModalFeature] = field(default_factory=list)  # in prompt order


@dataclass
class EngineSetup:
    """Everything the frontend resolves before an engine core starts."""

    config: EngineConfig
    platform: Platform
    checkpoint: Checkpoint
    hooks: Any

    @classmethod
    def from_engine_args(
        cls, engine_args: EngineArgs, usage: UsageContext = UsageContext.OFFLINE
    ) -> EngineSetup:
        registry = get_registry()
        registry.run_general_plugins()
        choice = select_platform(registry, engine_args.device)
        hooks = get_hook_manager(registry)
        checkpoint = resolve_model(
            engine_args.model, engine_args.revision, engine_args.download_dir
        )
        check_load_options(
            checkpoint, engine_args.load_format, bool(engine_args.trust_remote_code), registry
        )
        arch = ArchConfig.from_hf(checkpoint.hf_config)
        model_cls = resolve_model_class(arch.architectures, registry)
        config = engine_args.create_engine_config(
            choice.platform,
            hooks,
            model_max_len=_context_length(model_cls, arch),
            usage=usage,
            stored_quantization=checkpoint.stored_quantization,
            pooling=CheckpointPooling.read(checkpoint, model_cls, engine_args.runner),
            num_layers=arch.num_hidden_layers,
            multimodal=supports_multimodal(model_cls),
        )
        tp_size = config.parallel.tensor_parallel_size
        if config.model.quantization is not None:
            # Fail here, naming the flag or the plugin to install, not in the engine core.
            method = build_quantization_config(
                config.model.quantization, checkpoint.hf_config, registry
            )
            if tp_size > 1 and not method.tensor_parallel:
                raise ValueError(
                    f"--tensor-parallel-size {tp_size}: {config.model.quantization!r} weights "
                    "cannot be split across ranks yet; use --quantization none or one rank"
                )
        allowed_media_root(config.model.allowed_local_media_path)
        if config.lora is not None:
            lora_manager_class(config.lora, registry)  # installed, or the package to install
        arch.check_tensor_parallel(tp_size)
        parallel = config.parallel
        if arch.mla is not None and parallel.world_size > 1:
            raise ValueError(
                f"--tensor-parallel-size {tp_size} x --pipeline-parallel-size "
                f"{parallel.pipeline_parallel_size}: multi-head latent attention "
                f"({', '.join(arch.architectures)}) runs on one rank for now; use 1 and 1"
            )
        spare = parallel.eplb.num_redundant_experts if parallel.enable_eplb else 0
        ranks, flags = tp_size, f"--tensor-parallel-size {tp_size}"
        if parallel.experts_span_engines:
            ranks *= parallel.data_parallel_size
            flags += f" x --data-parallel-size {parallel.data_parallel_size}"
        arch.check_expert_parallel(ranks, flags, parallel.enable_expert_parallel, spare)
        return cls(config, choice.platform, checkpoint, hooks)


class InputProcessor:
    def __init__(self, setup: EngineSetup) -> None:
        self.config = setup.config
        checkpoint = setup.checkpoint
        self.served_model_name = self.config.model.served_model_name or checkpoint.served_name
        self.max_model_len: int = self.config.model.max_model_len
        self._arch = ArchConfig.from_hf(checkpoint.hf_config)
        self.vocab_size = self._arch.vocab_size
        # What the model is served for (--runner): sampling tokens, or pooling prompts.
        self.runner = "generate" if self.config.pooler is None else "pooling"
        # The pooling tasks it serves (core.pooling.tasks): none when it generates.
        model_cls = resolve_model_class(self._arch.architectures)
        self.pooling_tasks = ModelTasks.of(model_cls, checkpoint.hf_config, self.runner)
        self._matryoshka_dimensions = checkpoint.hf_config.get("matryoshka_dimensions")
        self.tokenizer = load_tokenizer(checkpoint, self.config.model.tokenizer)
        # --chat-template is a file or the template itself: read once, here.
        configured = self.config.model.chat_template
        self._chat_template = None if configured is None else load_chat_template(configured)
        if self._chat_template is not None:  # the deployment's choice: rendered in-process
            self.tokenizer.trust_chat_template(self._chat_template)
        self.generation_defaults = self._generation_defaults(checkpoint)
        self._loras: dict[int, LoRARequest] = {}  # adapters checked, by lora_int_id
        self._retired_lora_ids: set[int] = set()
        self._shape_model: torch.nn.Module | None = None
        self._checkpoint = checkpoint
        # What a multimodal item may take of the encoder's step budget and cache.
        self._encoder_budget = EncoderBudget.of(self.config.scheduler, self.max_model_len)
        # Built in the frontend only (the engine core never imports a processor), before
        # the engine core starts, so a wrong --io-processor-plugin stops the start early.
        self.io_processor: IOProcessor | None = load_io_processor(self.config, checkpoint.hf_config)
        # The custom logits processors the workers will run: their validate_params checks
        # each request here, and a wrong --logits-processors stops the start early.
        self.logits_processor_classes = logits_processor_classes(self.config)

    def _generation_defaults(self, checkpoint: Checkpoint) -> dict[str, Any]:
        source = self.config.model.generation_config
        if source == "none" or isinstance(checkpoint, GGUFCheckpoint) and source == "auto":
            return {}
        directory = checkpoint.path if source == "auto" else Path(source)
        found = load_generation_defaults(directory)
        return {_GENERATION_KEYS[k]: v for k, v in found.items() if k in _GENERATION_KEYS}

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults."""
        return SamplingParams(**self.generation_defaults)

    @cached_property
    def mm_processor(self) -> MultiModalProcessor | None:
        """The model's multimodal processor; None for a model that takes only text."""
        model_cls = resolve_model_class(self._arch.architectures)
        if not supports_multimodal(model_cls):
            return None
        return model_cls.multimodal_processor(self._checkpoint.path, self._checkpoint.hf_config)

    def prepare(
        self,
        prompt: str | list[int],
        params: SamplingParams | PoolingParams,
        multi_modal_data: Mapping[str, Any] | None = None,
    ) -> PreparedRequest:
        """Tokenize and validate; ValueError naming the problem, nothing queued.

        SamplingParams ask to generate, PoolingParams to pool (their task, else the model's
        default: core.pooling.tasks), each only on a model served by that runner and, for
        a pooling task, only one the model serves (ValueError naming the task).
        `multi_modal_data` ({"image": an image or a list}) goes with a prompt holding one
        placeholder per item; each placeholder is expanded to its item's embeddings.
        """
        if isinstance(params, PoolingParams):
            if multi_modal_data:
                raise ValueError("multi_modal_data: embedding requests take text only")
            return self._prepare_pooled(prompt, params)
        self.require_runner("generate")
        text, token_ids = self._prompt_tokens(prompt)
        features: list[MultiModalFeature] = []
        if multi_modal_data or self.mm_processor is not None:
            token_ids, features = self._expand_items(token_ids, multi_modal_data or {})
        # Only the check: max_tokens stays as given (None, or capped to the room left by the
        # engine core's Request, with the same rule), so SamplingParams is not re-validated
        # against a cap the caller never asked for.
        fit_max_tokens(params.max_tokens, len(token_ids), self.max_model_len)
        if params.structured_outputs is not None:
            _check_grammar(params)
        params = msgspec.structs.replace(params)  # the caller's object stays untouched
        params.verify(self.config.model.max_logprobs, self.vocab_size)
        params.resolve_whole_vocabulary(self.vocab_size)
        params.resolve_bad_words(lambda word: self.tokenizer.encode(word, False))
        self._check_logits_processor_args(params)
        return PreparedRequest(text, token_ids, params, features)

    def _check_logits_processor_args(self, params: SamplingParams) -> None:
        """Each custom logits processor's `validate_params`; its ValueError names extra_args."""
        for cls in self.logits_processor_classes:
            try:
                cls.validate_params(params)
            except ValueError as exc:
                raise ValueError(
                    f"extra_args refused by logits processor {cls.__qualname__}: {exc}"
                ) from exc

    def _expand_items(
        self, token_ids: list[int], mm_data: Mapping[str, Any]
    ) -> tuple[list[int], list[MultiModalFeature]]:
        """The prompt with each item's placeholder expanded, and the items' features;
        ValueError naming multi_modal_data for a text-only model or an item larger than an
        explicit encoder budget."""
        if self.mm_processor is None:
            raise ValueError(
                f"multi_modal_data: {self.served_model_name} takes text only, not "
                f"{', '.join(mm_data)}"
            )
        processed = process_prompt(
            self.mm_processor, token_ids, mm_data, self.config.model.limit_mm_per_prompt
        )
        for feature in processed.features:
            self._encoder_budget.check_item(feature)
        return processed.prompt_token_ids, processed.features

    def _prepare_pooled(self, prompt: str | list[int], params: PoolingParams) -> PreparedRequest:
        params = self._pooling_params(params)
        text, token_ids = self._prompt_tokens(prompt)
        return self._pooled(text, token_ids, params)

    def _pooling_params(self, params: PoolingParams) -> PoolingParams:
        """`params` with its task resolved (None: the model's default); ValueError naming
        the task when the model does not serve it, or a field the task does not read."""
        task = params.task or self.pooling_tasks.default
        self.pooling_tasks.require(task)
        if task == "score" and not self.pooling_tasks.cross_encoder:
            raise ValueError(
                "task 'score': an embedding model scores a text pair by the cosine of the two "
                "texts' embeddings (LLM.score, /score), not one prompt"
            )
        return msgspec.structs.replace(params, task=task)  # the caller's object stays untouched

    def _pooled(
        self, text: str | None, token_ids: list[int], params: PoolingParams
    ) -> PreparedRequest:
        check_pooled_prompt(len(token_ids), self.max_model_len)
        params.verify(self._arch.hidden_size, self._matryoshka_dimensions)
        if params.second_text_start is not None and self._arch.type_vocab_size < 2:
            raise ValueError(
                f"second_text_start: {self._arch.architectures[0]} has one token type only"
            )
        return PreparedRequest(text, token_ids, params)

    def prepare_pair(
        self, text: str, text_pair: str, params: PoolingParams | None = None
    ) -> PreparedRequest:
        """A text pair scored by a cross-encoder, encoded together as its tokenizer joins
        pairs (the second text's token types ride in `second_text_start`, for an encoder
        with token types); ValueError naming the problem, nothing queued."""
        params = self._pooling_params(params or PoolingParams(task="score"))
        if params.task != "score":
            raise ValueError(f"task: a text pair is scored (task 'score'), not {params.task!r}")
        if not self.pooling_tasks.cross_encoder:
            raise ValueError("a text pair is encoded together only by a cross-encoder")
        token_ids, type_ids = self.tokenizer.encode_pair(text, text_pair)
        if self._arch.type_vocab_size >= 2 and any(type_ids):
            params = msgspec.structs.replace(params, second_text_start=_second_text(type_ids))
        return self._pooled(None, token_ids, params)

    def _prompt_tokens(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt given as either; ValueError naming prompt when it is
        empty, is not valid Unicode, or holds an id outside the vocabulary (after the field,
        vLLM's words for the last two)."""
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
            text: str | None = prompt
            token_ids = self.tokenizer.encode(prompt) if prompt else []
        else:
            text, token_ids = None, list(prompt)
        if not token_ids:
            raise ValueError("prompt: The decoder prompt cannot be empty")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt: Token id {bad[0]} is out of vocabulary")
        return text, token_ids

    def require_runner(self, runner: str) -> None:
        """ValueError unless the model is served by `runner` ("generate" or "pooling"):
        generation asked of an embedding model, or embeddings of a generating one."""
        if runner == self.runner:
            return
        if self.runner == "pooling":
            raise ValueError(
                "this model is served with --runner pooling: it embeds (LLM.embed, "
                "/v1/embeddings) and cannot generate text"
            )
        raise ValueError(
            "this model is served with --runner generate: it cannot embed; start it with "
            "--runner pooling"
        )

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """The prompt token ids of a conversation, rendered with the chat template.

        `chat_template` (a template name or source) overrides the configured one (else the
        model's); `continue_final_message` ends the prompt right after the last message's
        content, so the model continues it instead of starting a new turn; `tools` (OpenAI
        function tools) are the template's `tools`. Bad `chat_template_kwargs` (a reserved
        name, data that is not JSON) are a ChatRenderError naming them; a template that
        cannot render the conversation, or renders text that is not valid Unicode, one
        naming messages.
        """
        try:
            check_template_kwargs(chat_template_kwargs or {})
        except ValueError as exc:
            raise ChatRenderError(str(exc), "chat_template_kwargs") from exc
        try:
            text = self.tokenizer.apply_chat_template(
                list(messages),
                add_generation_prompt=add_generation_prompt,
                chat_template=chat_template or self._chat_template,
                tools=tools,
                **(chat_template_kwargs or {}),
            )
            check_text(text, "the rendered prompt")
        except ValueError as exc:
            message = f"messages cannot be rendered with the chat template: {exc}"
            raise ChatRenderError(message, "messages") from exc
        if continue_final_message and messages:
            last = _last_text(messages[-1].get("content"))
            text = text[: text.rfind(last) + len(last)]
        return self.tokenizer.encode(text, add_special_tokens=False)

    def chat_template_source(
        self, chat_template: str | None = None, tools: object = None
    ) -> str | None:
        """The template `render_chat` renders with for `chat_template` (a request's, or
        None) and `tools`: the one named, else --chat-template, else the model's; None when
        there is none (rendering will say so)."""
        try:
            return self.tokenizer.select_chat_template(chat_template or self._chat_template, tools)
        except ValueError:
            return None

    def check_lora(self, request: LoRARequest) -> None:
        """ValueError, before anything is queued, when `request`'s adapter cannot be served:
        LoRA not enabled, its id or name already taken by another adapter (the engine
        caches weights by id and prefixes by name), or the implementation's
        `check_adapter` refusing it. Each adapter is checked once."""
        lora = self.config.lora
        if lora is None:
            raise ValueError(
                "lora_request: LoRA adapters are not enabled (start with --enable-lora)"
            )
        known = self._loras.get(request.lora_int_id)
        if known == request:
            return
        if known is not None or request.lora_int_id in self._retired_lora_ids:
            raise ValueError(
                f"lora_request.lora_int_id: {request.lora_int_id} is already used by another "
                "adapter; give each adapter its own id"
            )
        if any(r.lora_name == request.lora_name for r in self._loras.values()):
            raise ValueError(
                f"lora_request.lora_name: {request.lora_name!r} is already the name of another "
                "adapter"
            )
        lora_manager_class(lora).check_adapter(self._model_shapes(), request, lora)
        self._loras[request.lora_int_id] = request

    def forget_lora(self, lora_int_id: int) -> bool:
        """Free the adapter's name for another one; its id stays taken (the engine may
        still hold its weights under that id). False when it was not known."""
        request = self._loras.pop(lora_int_id, None)
        if request is None:
            return False
        self._retired_lora_ids.add(lora_int_id)
        return True

    def _model_shapes(self) -> torch.nn.Module:
        """The model built on the meta device: its layers' shapes, no weights."""
        if self._shape_model is None:
            model_cls = resolve_model_class(self._arch.architectures)
            with torch.device("meta"):
                self._shape_model = model_cls(self._arch, None, torch.float32)
        return self._shape_model

    def engine_core_request(
        self,
        request_id: str,
        prepared: PreparedRequest,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> EngineCoreRequest:
        params = prepared.params
        pooled = isinstance(params, PoolingParams)
        return EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=prepared.prompt_token_ids,
            sampling_params=None if pooled else params,
            pooling_params=params if pooled else None,
            eos_token_id=self.tokenizer.eos_token_id,
            arrival_time=time.time(),
            priority=priority,
            cache_salt=cache_salt,
            lora_request=lora_request,
            mm_features=prepared.mm_features or None,
        )


def _context_length(model_cls: type, arch: ArchConfig) -> int:
    """The longest prompt `model_cls` serves: its own `max_model_len(arch)` where it has
    one (RoBERTa's position table starts past its padding rows), else the config's."""
    own = getattr(model_cls, "max_model_len", None)
    return arch.max_position_embeddings if own is None else own(arch)


def _second_text(type_ids: Sequence[int]) -> int:
    """Where a pair's second text starts: its types are 0 up to there and 1 from there on
    (as BERT's tokenizers give them); ValueError for any other pattern."""
    start = list(type_ids).index(1)
    if any(t != 0 for t in type_ids[:start]) or any(t != 1 for t in type_ids[start:]):
        raise ValueError(f"text_pair: the tokenizer's token types {list(type_ids)} are not "
                         "one segment of type 0 then one of type 1")  # fmt: skip
    return start


def _last_text(content: Any) -> str:
    """The text a message's content ends with: the content itself, or its last text part
    (OpenAI's list of parts, as the "openai" content format hands it to the template)."""
    if not isinstance(content, list):
        return str(content or "")
    texts = [part.get("text", "") for part in content if part.get("type") == "text"]
    return texts[-1] if texts else ""


def _check_grammar(params: SamplingParams) -> None:
    """Parse the constraint here, so a bad schema (or one no text satisfies) is the
    caller's ValueError, not a request that fails later in the engine core."""
    from core.structured_output.language import check_grammar

    check_grammar(params.structured_outputs)
