"""The models a server answers to: its base model and the LoRA adapters it serves.

A request's `model` field picks one, as in vLLM (OpenAIServingModels): the base model's
name, or an adapter's name, whose LoRARequest then goes with the request to the engine.
Adapters come from `--lora-modules` at startup and, when runtime updating is allowed,
from POST /v1/load_lora_adapter. Each gets the next id of this server (1, 2, ...), never
one given before: the engine caches adapter weights by id, so an unloaded adapter's id
may still name its weights there.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus

from core.engine.processor import InputProcessor
from core.entrypoints.openai import protocol as p
from core.entrypoints.openai.errors import OpenAIError
from core.lora.request import LoRARequest
from core.plugins.components import parse_json_object

__all__ = ["LoRAModulePath", "ServedModels"]

_JSON_KEYS = ("name", "path", "base_model_name")


@dataclass(frozen=True)
class LoRAModulePath:
    """One `--lora-modules` item: the adapter's model id, its PEFT directory, and the
    model its /v1/models card names as `parent` (None: the served base model)."""

    name: str
    path: str
    base_model_name: str | None = None

    @classmethod
    def parse(cls, text: str) -> LoRAModulePath:
        """`name=path`, or vLLM's JSON form `{"name": ..., "path": ...,
        "base_model_name": ...}` (base_model_name optional); ValueError saying which."""
        if text.lstrip().startswith("{"):
            return cls._from_json(text)
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"{text!r} is neither name=path nor a JSON object")
        return cls(name, path)

    @classmethod
    def _from_json(cls, text: str) -> LoRAModulePath:
        data = parse_json_object(repr(text), text)
        unknown = sorted(set(data) - set(_JSON_KEYS))
        if unknown:
            raise ValueError(f"{text!r}: unknown keys {unknown} (known: {list(_JSON_KEYS)})")
        missing = [key for key in ("name", "path") if data.get(key) is None]
        if missing:
            raise ValueError(f"{text!r}: missing {missing}")
        given = {key: value for key, value in data.items() if value is not None}
        bad = [key for key, value in given.items() if not (value and isinstance(value, str))]
        if bad:
            raise ValueError(f"{text!r}: {bad} must be non-empty strings")
        return cls(**given)


class ServedModels:
    """The base model and the adapters being served, by model id, in the order added."""

    def __init__(self, processor: InputProcessor, created: int) -> None:
        self._processor = processor
        self._created = created
        self.base_model_name = processor.served_model_name
        self._loras: dict[str, LoRARequest] = {}
        self._parents: dict[str, str] = {}  # adapter name -> its card's `parent`
        self._ids = itertools.count(1)

    @property
    def lora_enabled(self) -> bool:
        return self._processor.config.lora is not None

    def add_lora_modules(self, modules: Iterable[LoRAModulePath]) -> None:
        """Serve the `--lora-modules` adapters; ValueError naming the flag and the module
        when one cannot be served."""
        for module in modules:
            try:
                self.load_lora(module.name, module.path, module.base_model_name)
            except OpenAIError as exc:
                raise ValueError(
                    f"--lora-modules {module.name}={module.path}: {exc.message}"
                ) from exc

    def load_lora(self, name: str, path: str, parent: str | None = None) -> LoRARequest:
        """Serve the adapter at `path` as model `name`: a 400 OpenAIError when the name is
        taken or the engine cannot serve the adapter (InputProcessor.check_lora's reason)."""
        if name in self._loras:
            message = f"The lora adapter '{name}' has already been loaded."
            raise OpenAIError(HTTPStatus.BAD_REQUEST, message, param="lora_name")
        if name == self.base_model_name:
            message = f"The lora adapter name '{name}' is the base model's name."
            raise OpenAIError(HTTPStatus.BAD_REQUEST, message, param="lora_name")
        try:
            request = LoRARequest(name, next(self._ids), path)
            self._processor.check_lora(request)
        except ValueError as exc:
            raise OpenAIError(HTTPStatus.BAD_REQUEST, str(exc), param="lora_path") from exc
        self._loras[name] = request
        self._parents[name] = parent or self.base_model_name
        return request

    def unload_lora(self, name: str) -> None:
        """Stop serving adapter `name` (requests already queued with it finish); a 404
        OpenAIError when it is not served."""
        request = self._loras.pop(name, None)
        if request is None:
            message = f"The lora adapter '{name}' cannot be found."
            raise OpenAIError(
                HTTPStatus.NOT_FOUND, message, type="NotFoundError", param="lora_name"
            )
        del self._parents[name]
        self._processor.forget_lora(request.lora_int_id)

    def lora_request(self, model: str | None) -> LoRARequest | None:
        """The adapter that a request's `model` names; None for the base model (also when
        `model` is not given). A 404 OpenAIError when no served model has that name."""
        if model is None or model == self.base_model_name:
            return None
        request = self._loras.get(model)
        if request is None:
            raise OpenAIError(
                HTTPStatus.NOT_FOUND,
                f"The model `{model}` does not exist.",
                type="NotFoundError",
                param="model",
                code="model_not_found",
            )
        return request

    def model_name(self, lora_request: LoRARequest | None) -> str:
        """The model id that responses of a request with `lora_request` carry."""
        return self.base_model_name if lora_request is None else lora_request.lora_name

    def cards(self) -> list[p.ModelCard]:
        """The /v1/models entries: the base model, then each adapter in the order added."""
        max_model_len = self._processor.max_model_len
        base = p.ModelCard(
            id=self.base_model_name,
            created=self._created,
            root=self._processor.config.model.model or self.base_model_name,
            max_model_len=max_model_len,
        )
        adapters = [
            p.ModelCard(
                id=name,
                created=self._created,
                root=request.lora_path,
                parent=self._parents[name],
                max_model_len=max_model_len,
            )
            for name, request in self._loras.items()
        ]
        return [base, *adapters]
