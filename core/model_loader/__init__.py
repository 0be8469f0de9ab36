"""Weight loading: HF safetensors directories, GGUF files, default model, hub resolution."""

from core.model_loader.checkpoint import Checkpoint
from core.model_loader.gguf_loader import GGUFCheckpoint, load_gguf_checkpoint
from core.model_loader.resolve import resolve_model
from core.model_loader.safetensors_loader import (
    SafetensorsCheckpoint,
    load_safetensors_checkpoint,
)

__all__ = [
    "Checkpoint",
    "GGUFCheckpoint",
    "SafetensorsCheckpoint",
    "load_gguf_checkpoint",
    "load_safetensors_checkpoint",
    "resolve_model",
]
