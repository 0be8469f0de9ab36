"""GGUF weights kept in their quantized form (`--quantization gguf`).

A GGUF file stores each matrix in a ggml type of its own (llama.cpp's mixes put, say,
Q6_K value projections beside Q4_K query projections), so a layer learns its format
only while loading: the checkpoint yields `X.qweight_type` then `X.qweight` (its stored
bytes) for every matrix (`GGUFCheckpoint.iter_weights(keep_quantized=True)`). After
loading, each layer's shards are converted, exactly, into core's group-quantized layout
(4-bit for Q4_0 / Q4_1 / Q4_K, 8-bit for Q5_K / Q6_K / Q8_0) and fused; a layer with a
float shard (F32 / F16 / BF16) is held dense in the activation dtype instead. Embeddings
stay packed too: a lookup dequantizes only the rows it reads, and a tied LM head
multiplies through the same kernel as every linear layer.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from core.model_loader.gguf_dequant import (
    FLOAT_TYPES,
    PACKED_TYPES,
    random_blocks,
    to_packed,
)
from core.quantization.interface import LinearMethod, LinearPartition, QuantizationConfig
from core.quantization.packed import PackedWeight, concat_rows, drop_parameters, store, stored
from core.quantization.unquantized import dense_linear
from core.quantization.weight_loader import (
    WeightLoader,
    add_parameter,
    fused_weight_loader,
    set_random_values,
)

SUPPORTED_TYPES = PACKED_TYPES | frozenset(FLOAT_TYPES)
_CHECKPOINT_PARAMS = ("qweight_type", "qweight")


class GGUFConfig(QuantizationConfig):
    """`quantization_config = {"quant_method": "gguf"}`: no settings, the file says it all."""

    name = "gguf"

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> GGUFConfig:
        unknown = sorted(set(hf_quant_config) - {"quant_method"})
        if unknown:
            raise ValueError(f"quantization_config: gguf takes no settings, got {unknown}")
        return cls()

    def get_linear_method(self, layer_name: str) -> LinearMethod:
        return GGUFLinearMethod()

    def get_embedding_method(self, layer_name: str) -> LinearMethod:
        return GGUFLinearMethod()


class GGUFLinearMethod(LinearMethod):
    """Parameters `qweight_type` (int64 [shards]) and `qweight` (each shard's stored
    bytes), replaced after loading by a packed weight, or a dense `dense_weight`."""

    def create_weights(
        self,
        layer: nn.Module,
        partition: LinearPartition,
        bias: bool,
        dtype: torch.dtype,
    ) -> None:
        sizes = partition.output_sizes_per_partition
        cols = partition.input_size_per_partition
        layer.gguf_shards = [None] * len(sizes)  # each shard's stored bytes, until packed
        types = add_parameter(
            layer, "qweight_type", (len(sizes),), torch.int64, _type_loader(len(sizes))
        )
        types.fill_(-1)  # not loaded yet
        set_random_values(types, lambda g: _random_type(cols, g))
        # A placeholder: each shard's bytes wait in gguf_shards until they are converted.
        loader = _bytes_loader(layer, sizes, cols)
        qweight = add_parameter(layer, "qweight", (0,), torch.uint8, loader)
        set_random_values(qweight, lambda g: random_blocks(_type_of(layer, 0), sizes[0], cols, g))
        if bias:
            add_parameter(layer, "bias", (sum(sizes),), dtype, fused_weight_loader(sizes))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        cols = layer.partition.input_size_per_partition
        shards = []
        for index, raw in enumerate(layer.gguf_shards):
            if raw is None:
                raise ValueError(f"{layer.prefix}: the checkpoint gave no weight for shard {index}")
            qtype = _type_of(layer, index)
            if qtype in FLOAT_TYPES:
                shards.append(raw.view(FLOAT_TYPES[qtype]).reshape(raw.shape[0], cols))
            else:
                shards.append(to_packed(raw, qtype, cols))
        if all(isinstance(shard, PackedWeight) for shard in shards):
            store(layer, concat_rows(shards))
        else:
            dense = [s.dequantize() if isinstance(s, PackedWeight) else s for s in shards]
            weight = torch.cat([d.to(layer.params_dtype) for d in dense])
            layer.register_buffer("dense_weight", weight, persistent=False)
        drop_parameters(layer, _CHECKPOINT_PARAMS)
        del layer.gguf_shards

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        packed = stored(layer)
        if packed is None:
            return dense_linear(x, layer.dense_weight, bias)
        out = packed.matmul(x)
        return out if bias is None else out + bias

    def packed_weight(self, layer: nn.Module) -> PackedWeight | None:
        return stored(layer)  # None: a float weight, through dense_linear

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        packed = stored(layer)
        if packed is None:
            return layer.dense_weight
        return packed.dequantize().to(layer.params_dtype)

    def embed(self, layer: nn.Module, token_ids: torch.Tensor) -> torch.Tensor:
        packed = stored(layer)
        if packed is None:
            return F.embedding(token_ids, layer.dense_weight)
        return packed.rows(token_ids).to(layer.params_dtype)


def _type_loader(num_shards: int) -> WeightLoader:
    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: int | None = None) -> None:
        index = _shard_index(shard_id, num_shards)
        if loaded.numel() != 1:
            raise ValueError(f"a GGUF type tag is one integer, got shape {tuple(loaded.shape)}")
        value = int(loaded.reshape(()))
        try:
            qtype = GGMLQuantizationType(value)
        except ValueError:
            raise ValueError(f"{value} is not a GGML tensor type") from None
        if qtype not in SUPPORTED_TYPES:
            names = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
            raise ValueError(f"type {qtype.name} cannot be kept quantized (supported: {names})")
        param.data[index] = value

    return load


def _bytes_loader(layer: nn.Module, sizes: tuple[int, ...], cols: int) -> WeightLoader:
    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: int | None = None) -> None:
        index = _shard_index(shard_id, len(sizes))
        qtype = _type_of(layer, index)
        block_values, type_size = GGML_QUANT_SIZES[qtype]
        want = (sizes[index], cols // block_values * type_size)
        if cols % block_values or loaded.dtype != torch.uint8 or tuple(loaded.shape) != want:
            raise ValueError(
                f"{qtype.name} bytes of shape {tuple(loaded.shape)} ({loaded.dtype}) do not "
                f"hold a [{sizes[index]}, {cols}] matrix"
            )
        layer.gguf_shards[index] = loaded.to(param.device)

    return load


def _shard_index(shard_id: int | None, num_shards: int) -> int:
    if shard_id is None:
        if num_shards != 1:
            raise ValueError(f"fused parameter of {num_shards} shards needs a shard id")
        return 0
    return shard_id


def _type_of(layer: nn.Module, index: int) -> GGMLQuantizationType:
    value = int(layer.qweight_type[index])
    if value < 0:
        raise ValueError(f"{layer.prefix}: its qweight_type must be loaded before qweight")
    return GGMLQuantizationType(value)


def _random_type(cols: int, generator: torch.Generator) -> torch.Tensor:
    """A random supported type whose blocks fit `cols` columns, as the loader takes it."""
    fits = sorted(t for t in SUPPORTED_TYPES if cols % GGML_QUANT_SIZES[t][0] == 0)
    choice = torch.randint(len(fits), (1,), generator=generator).item()
    return torch.tensor([int(fits[choice])])
