"""LoRARequest: which adapter a request runs with, as vLLM names it.

A msgspec Struct because it crosses the frontend -> engine-core socket inside an
EngineCoreRequest; `__post_init__` runs on decode too, so a malformed message fails like
a bad Python call. The adapter's files are read where it is loaded (the worker) and
checked before the request is queued (the frontend); this type only names them.
"""

from __future__ import annotations

import msgspec

__all__ = ["LoRARequest"]


class LoRARequest(msgspec.Struct, frozen=True):
    """`LoRARequest(lora_name, lora_int_id, lora_path)`.

    `lora_name` is the adapter's public name (the server's model id for it, and the key
    that keeps its prefix-cache blocks apart); `lora_int_id` (>= 1) identifies the loaded
    weights in the engine's caches; `lora_path` is a PEFT adapter directory
    (adapter_config.json + adapter_model.safetensors).
    """

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("lora_request.lora_name must not be empty")
        if isinstance(self.lora_int_id, bool) or self.lora_int_id < 1:
            raise ValueError(f"lora_request.lora_int_id must be >= 1, got {self.lora_int_id!r}")
        if not self.lora_path:
            raise ValueError("lora_request.lora_path must not be empty")

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def path(self) -> str:
        return self.lora_path
