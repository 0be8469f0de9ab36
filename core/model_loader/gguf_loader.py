"""GGUF files: header to config, tensor names to HF names, weights dequantized."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, ReaderTensor

from core.model_loader.checkpoint import Checkpoint
from core.model_loader.gguf_config import hf_config_from_gguf
from core.model_loader.gguf_dequant import SUPPORTED_TYPES, dequantize
from core.model_loader.gguf_metadata import GGUFTensorInfo, read_gguf_header
from core.quantization.selector import StoredQuantization

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Folded into hf_config["rope_scaling"]; not a model parameter.
_ROPE_FREQS = "rope_freqs.weight"
# llama.cpp's converter permutes q/k rows of these architectures (its rotary embedding
# pairs adjacent dimensions where transformers pairs the two halves of a head).
_PERMUTED_ARCHS = frozenset({"llama"})


class _GGUFReader(GGUFReader):
    """GGUFReader over a plain ndarray view of its memory map.

    The reader slices its map once per metadata string (~100k for a tokenizer); slicing
    an np.memmap costs twice as much as slicing a plain view of the same mapping.
    """

    @property
    def data(self) -> np.ndarray:
        return self._mapped

    @data.setter
    def data(self, mapped: np.ndarray) -> None:
        self._mapped = mapped.view(np.ndarray)


@dataclass(frozen=True)
class GGUFCheckpoint(Checkpoint):
    """A .gguf file; weights are dequantized (and q/k un-permuted) as they are yielded."""

    _reader: GGUFReader | None = field(default=None, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # The memory-mapped reader stays in this process; a copy reopens the file.
        return {**self.__dict__, "_reader": None}

    @property
    def stored_quantization(self) -> StoredQuantization:
        """Method "gguf" (kept in blocks), also loadable dequantized."""
        return StoredQuantization(method="gguf", dequantizable=True)

    def reader(self) -> GGUFReader:
        """The parsed file, for its tensor data.

        GGUFReader parses every metadata array too (about a second for a 49k-token
        vocabulary), so it is opened on first use, once per process, and kept. Raises
        ValueError when the file has become unreadable.
        """
        reader = self._reader
        if reader is None:
            reader = _open(self.path)
            # A cache, not state: excluded from equality, repr and pickling.
            object.__setattr__(self, "_reader", reader)
        return reader

    def iter_weights(
        self, dtype: torch.dtype, keep_quantized: bool = False
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """As `Checkpoint.iter_weights`. With `keep_quantized`, each matrix `X.weight`
        comes as two tensors instead: `X.qweight_type`, a 0-d int64 tensor holding its
        GGMLQuantizationType, then `X.qweight`, its stored bytes as uint8 [rows, bytes
        per row] (whatever the type, float ones included); vectors come as stored."""
        permuted = self.hf_config["model_type"] in _PERMUTED_ARCHS
        for tensor in self.reader().tensors:
            if tensor.name == _ROPE_FREQS:
                continue
            name = hf_name(tensor.name)
            as_blocks = keep_quantized and len(tensor.shape) == 2
            weight = _raw_rows(tensor) if as_blocks else _read_tensor(tensor)
            if permuted:
                weight = _unpermute_rows(name, weight, self.hf_config)
            if as_blocks:
                stem = name.removesuffix(".weight")
                yield f"{stem}.qweight_type", torch.tensor(int(tensor.tensor_type))
                yield f"{stem}.qweight", weight
            else:
                yield name, weight if keep_quantized else weight.to(dtype)


def load_gguf_checkpoint(path: Path, served_name: str | None = None) -> GGUFCheckpoint:
    """Open the GGUF file `path`: read its header into a config and check its tensors.

    Every tensor name must map to an HF name, every tensor type must be one core
    dequantizes and every tensor's data must lie within the file, so a file core cannot
    serve fails here rather than mid-load. `served_name` defaults to the file name without
    its extension. Raises ValueError when the file is missing, truncated or corrupt, names
    an unsupported architecture, or holds an unknown tensor name or an unsupported tensor
    type (naming both).
    """
    header = read_gguf_header(path)
    # The slow full reader is needed at load only for rope_freqs' values; it is then kept
    # for the weights.
    reader = _open(path) if _ROPE_FREQS in header.tensors else None
    rope_freqs = None if reader is None else _tensor_data(reader, _ROPE_FREQS)
    hf_config = hf_config_from_gguf(header, rope_freqs)
    for tensor in header.tensors.values():
        _check_tensor(tensor)
    return GGUFCheckpoint(
        path=path,
        hf_config=hf_config,
        served_name=served_name or path.stem,
        _reader=reader,
    )


def hf_name(gguf_name: str) -> str:
    """The transformers parameter name of the GGUF tensor `gguf_name` (ValueError if none)."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES and suffix in ("weight", "bias"):
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match[2] not in _LAYER_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face parameter name")
    layer, kind, suffix = match.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}"


def _open(path: Path) -> GGUFReader:
    try:
        return _GGUFReader(path)
    # The reader reports a bad file with whatever numpy raised first while slicing it.
    except (ValueError, KeyError, IndexError, TypeError, OSError) as exc:
        raise ValueError(f"{path}: corrupt or truncated GGUF file ({exc})") from exc


def _tensor_data(reader: GGUFReader, name: str) -> np.ndarray:
    return next(tensor.data for tensor in reader.tensors if tensor.name == name)


def _check_tensor(tensor: GGUFTensorInfo) -> None:
    if tensor.tensor_type not in SUPPORTED_TYPES:
        supported = ", ".join(sorted(qtype.name for qtype in SUPPORTED_TYPES))
        raise ValueError(
            f"GGUF tensor {tensor.name} has type {tensor.tensor_type.name}, which core cannot "
            f"dequantize (supported: {supported})"
        )
    if tensor.name != _ROPE_FREQS:
        hf_name(tensor.name)


def _read_tensor(tensor: ReaderTensor) -> torch.Tensor:
    shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))  # GGUF ne: fastest first
    return dequantize(tensor.data, tensor.tensor_type, shape)


def _raw_rows(tensor: ReaderTensor) -> torch.Tensor:
    """A matrix's stored bytes, one row of blocks per output: uint8 [rows, bytes per row]."""
    rows = int(tensor.shape[-1])  # GGUF ne: the output dimension is the last
    data = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(rows, -1)
    return torch.from_numpy(data.copy())


def _unpermute_rows(name: str, weight: torch.Tensor, hf_config: dict[str, Any]) -> torch.Tensor:
    """Undo the row permutation llama.cpp applies to q_proj / k_proj of llama models.

    Within each head, transformers' row order is [first half | second half] of the
    rotary pairs; llama.cpp interleaves them (row 2i is pair i's first, 2i+1 its second).
    """
    if ".self_attn.q_proj." in name:
        num_heads = hf_config["num_attention_heads"]
    elif ".self_attn.k_proj." in name:
        num_heads = hf_config["num_key_value_heads"]
    else:
        return weight
    rest = weight.shape[1:]
    # weight: [H * D, ...] -> [H, D/2, 2, ...] -> [H, 2, D/2, ...] -> [H * D, ...]
    pairs = weight.reshape(num_heads, -1, 2, *rest)
    return pairs.transpose(1, 2).reshape(weight.shape)
