"""compressed-tensors checkpoints (LLM Compressor): W4A16 / W8A16 pack-quantized and W8A8
int8 layers; see `config`."""

from core.quantization.compressed_tensors.config import CompressedTensorsConfig

__all__ = ["CompressedTensorsConfig"]
