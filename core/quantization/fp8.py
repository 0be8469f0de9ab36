"""FP8 weights (W8A16) as a core quantization method, entry `fp8`.

Reads checkpoints whose config.json says `"quant_method": "fp8"` (vLLM's and transformers'
FP8 format; DeepSeek-V3 and Qwen3 ship it block-wise): each quantized linear layer stores
`weight` in float8_e4m3fn [N, K] and either `weight_scale` (float32, one per tensor: a
scalar or [1] per checkpoint projection, or one per output row: [N] or [N, 1]) or, with
`weight_block_size` [bn, bk], `weight_scale_inv` (float32 [ceil(N / bn), ceil(K / bk)],
the scale of each bn x bk block; despite the name, W = fp8 value * scale_inv).

`--quantization fp8` on a float checkpoint quantizes every linear weight to e4m3 as it
loads, one scale per output row (`Fp8Config.for_float_weights`): vLLM's online shorthand,
per channel where vLLM's is per tensor, so that no row's range is set by another's.

Activations stay in the model's dtype (W8A16): the products are float32 or the model's
dtype, never fp8, so a static checkpoint's `input_scale` (what a GPU's fp8 GEMM would
quantize activations with) is read and dropped, and the output is nearer the float
model's than an fp8 GEMM's. After loading, a layer's W is held in core::fp8_linear's
layout (per-row scales, `core.ops.fp8_linear`), exact for every variant above, and then:
- where a kernel serves core::fp8_linear on the weights' device (a kernel package's, which
  then owns the choice, by timing, between its fp8 path and a dequantized copy), W stays
  in fp8, 1 byte per weight. core-cpu-kernels does on the CPU: its C++ kernel converts
  the bytes to float32 in registers, and on an AMD EPYC (Zen 3, 2 threads) took 0.75-0.92x
  the time of torch's multiply of a dense bf16 copy on one bf16 row, 0.13-0.4x on 8 to 64
  (SmolLM2's shapes, its 49,152-row head included), and 0.38x the float32 copy's on the
  head's single float32 row; oneDNN on a dense float32 copy, which its timing then keeps
  within its copies' memory budget, was faster for float32 batches of 8
  (core_cpu_kernels/candidates.py has the figures);
- else W is dequantized once into a dense copy in the activation dtype, multiplied by
  core::linear: on that EPYC the reference's per-tile dequantization made a layer's call
  4-77x slower than the copy's (torch converts e4m3 at 12-16 ns a value there), so without
  a kernel the copy's memory (2 or 4 bytes per weight) buys the speed. (`--quantization
  fp8` on float weights then saves no memory: it rounds them as an fp8 checkpoint would be
  rounded, unless a kernel keeps them in fp8.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from core import ops
from core.ops.fp8_linear import FP8_DTYPE, dequantize, fp8_linear, num_blocks, quantize
from core.quantization.interface import (
    FUSED_CHECKPOINT_MODULES,
    LinearMethod,
    LinearPartition,
    QuantizationConfig,
)
from core.quantization.packed import drop_parameters
from core.quantization.unquantized import UnquantizedLinearMethod, dense_linear
from core.quantization.weight_loader import WeightLoader, add_parameter, fused_weight_loader

ACTIVATION_SCHEMES = ("dynamic", "static")
# What a layer may have loaded, replaced after loading by core::fp8_linear's layout.
_CHECKPOINT_PARAMS = ("weight", "weight_scale", "weight_scale_inv", "input_scale")
_BLOCK_FIELD = "weight_block_size"


class Fp8Config(QuantizationConfig):
    """`quantization_config = {"quant_method": "fp8", "activation_scheme": "dynamic" |
    "static", "fmt": "e4m3", "weight_block_size": [bn, bk], "ignored_layers": [...]}`, all
    but quant_method optional (transformers spells ignored_layers modules_to_not_convert).

    `serialized`: the checkpoint stores fp8 weights (false: float weights, quantized as
    they load). `block`: (bn, bk) for block-wise scales, else None (per tensor or per
    output row). `ignored`: the layers the checkpoint left in float (`_is_ignored`)."""

    name = "fp8"

    def __init__(
        self,
        serialized: bool = True,
        static_input_scales: bool = False,
        block: tuple[int, int] | None = None,
        ignored: tuple[str, ...] = (),
    ) -> None:
        self.serialized = serialized
        self.static_input_scales = static_input_scales
        self.block = block
        self.ignored = ignored

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> Fp8Config:
        scheme = hf_quant_config.get("activation_scheme", "dynamic")
        if scheme not in ACTIVATION_SCHEMES:
            raise ValueError(f"activation_scheme: one of {ACTIVATION_SCHEMES}, got {scheme!r}")
        fmt = hf_quant_config.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ValueError(f"fmt: only e4m3 (float8_e4m3fn) weights are read, got {fmt!r}")
        ignored: list[str] = []
        for field in ("ignored_layers", "modules_to_not_convert"):
            names = hf_quant_config.get(field) or []
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"{field}: a list of module names, got {names!r}")
            ignored += names
        return cls(
            serialized=True,
            static_input_scales=scheme == "static",
            block=_block_size(hf_quant_config.get(_BLOCK_FIELD)),
            ignored=tuple(ignored),
        )

    @classmethod
    def for_float_weights(cls) -> Fp8Config:
        return cls(serialized=False)

    def get_linear_method(self, layer_name: str) -> LinearMethod:
        if _is_ignored(layer_name, self.ignored):
            return UnquantizedLinearMethod()
        return Fp8LinearMethod(self)


def _block_size(value: object) -> tuple[int, int] | None:
    """weight_block_size as (bn, bk): two positive ints (they need not divide the layers'
    sizes: edge blocks are partial, as DeepSeek's are), or None."""
    if value is None:
        return None
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ValueError(f"{_BLOCK_FIELD}: two positive integers [bn, bk], got {value!r}")
    return value[0], value[1]


def _is_ignored(layer_name: str, ignored: Sequence[str]) -> bool:
    """Whether the checkpoint keeps `layer_name` in float: an entry of `ignored` is it, a
    module it lies in ("model.visual", "mlp") or its last names ("lm_head", "mlp.gate"). A fused
    layer ("...qkv_proj") is also ignored when all its checkpoint projections ("...q_proj",
    ...) are; ValueError when only some are (one layer holds one format)."""
    head, _, last = layer_name.rpartition(".")
    if any(_names(layer_name, entry) for entry in ignored):
        return True
    shards = [f"{head}.{shard}" for shard in FUSED_CHECKPOINT_MODULES.get(last, ())]
    skipped = [shard for shard in shards if any(_names(shard, entry) for entry in ignored)]
    if skipped and len(skipped) < len(shards):
        raise ValueError(
            f"ignored_layers: {layer_name} fuses {', '.join(shards)}: ignore all or none of "
            f"them, not only {', '.join(skipped)}"
        )
    return bool(shards) and len(skipped) == len(shards)


def _names(layer_name: str, entry: str) -> bool:
    """Whether `entry` is a run of whole dotted names of `layer_name` ("mlp" names
    "model.layers.0.mlp.down_proj"; "proj" names nothing)."""
    return f".{entry}." in f".{layer_name}."


class Fp8LinearMethod(LinearMethod):
    """Parameters `weight` (fp8, or the activation dtype for float weights) and
    `weight_scale` [N, 1] or `weight_scale_inv` [N / bn, K / bk] (and `input_scale`
    [shards] for a static checkpoint); replaced after loading by `fp8_weight`,
    `fp8_scales` (core::fp8_linear's layout) or a `dense_weight` (see the module)."""

    def __init__(self, config: Fp8Config) -> None:
        self.config = config

    def create_weights(
        self,
        layer: nn.Module,
        partition: LinearPartition,
        bias: bool,
        dtype: torch.dtype,
    ) -> None:
        sizes = partition.output_sizes_per_partition
        shape = (sum(sizes), partition.input_size_per_partition)
        if not self.config.serialized:
            add_parameter(layer, "weight", shape, dtype, fused_weight_loader(sizes))
        else:
            add_parameter(layer, "weight", shape, FP8_DTYPE, _fp8_loader(sizes))
            self._create_scales(layer, sizes, shape[1])
        if self.config.static_input_scales:
            loader = _row_scale_loader([1] * len(sizes))  # one per projection
            add_parameter(layer, "input_scale", (len(sizes),), torch.float32, loader)
        if bias:
            add_parameter(layer, "bias", (shape[0],), dtype, fused_weight_loader(sizes))

    def _create_scales(self, layer: nn.Module, sizes: tuple[int, ...], inputs: int) -> None:
        block = self.config.block
        if block is None:
            loader = _row_scale_loader(sizes)
            add_parameter(layer, "weight_scale", (sum(sizes), 1), torch.float32, loader)
            return
        block_n, block_k = block
        if len(sizes) > 1 and any(size % block_n for size in sizes):
            # A block straddling two projections would hold two checkpoint tensors' scales.
            raise ValueError(
                f"{getattr(layer, 'prefix', 'layer')}: {_BLOCK_FIELD} {list(block)}: the fused "
                f"projections' output sizes {list(sizes)} must be multiples of {block_n}"
            )
        block_rows = [num_blocks(size, block_n) for size in sizes]
        shape = (sum(block_rows), num_blocks(inputs, block_k))
        loader = fused_weight_loader(block_rows)
        add_parameter(layer, "weight_scale_inv", shape, torch.float32, loader)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight, scales, block_k = self._fp8_layout(layer)
        drop_parameters(layer, [name for name in _CHECKPOINT_PARAMS if hasattr(layer, name)])
        if ops.provider("fp8_linear", weight.device.type) is None:
            dense = dequantize(weight, scales, block_k).to(layer.params_dtype)
            layer.register_buffer("dense_weight", dense, persistent=False)
            return
        layer.register_buffer("fp8_weight", weight, persistent=False)
        layer.register_buffer("fp8_scales", scales, persistent=False)
        layer.fp8_block_k = block_k

    def _fp8_layout(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(weight, per-row scales, block_k) of core::fp8_linear from what was loaded."""
        inputs = layer.weight.shape[1]
        if not self.config.serialized:
            weight, scales = quantize(layer.weight.data, 1, inputs)  # one scale per row
            return weight, scales, inputs
        if self.config.block is None:
            return layer.weight.data, layer.weight_scale.data, inputs
        block_n, block_k = self.config.block
        rows = layer.weight_scale_inv.data.repeat_interleave(block_n, dim=0)
        return layer.weight.data, rows[: layer.weight.shape[0]].contiguous(), block_k

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        block_k = getattr(layer, "fp8_block_k", None)
        if block_k is None:
            return dense_linear(x, layer.dense_weight, bias)
        out = fp8_linear(x, layer.fp8_weight, layer.fp8_scales, block_k)
        return out if bias is None else out + bias

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        block_k = getattr(layer, "fp8_block_k", None)
        if block_k is None:
            return layer.dense_weight
        return dequantize(layer.fp8_weight, layer.fp8_scales, block_k).to(layer.params_dtype)


def _fp8_loader(sizes: Sequence[int]) -> WeightLoader:
    """The fused loader, refusing anything but e4m3 values (a float tensor copied in would
    be rounded to fp8 without its scale: a layer the config should have ignored)."""
    load = fused_weight_loader(sizes)

    def load_fp8(param: nn.Parameter, loaded: torch.Tensor, shard_id: int | None = None) -> None:
        if loaded.dtype != FP8_DTYPE:
            raise ValueError(
                f"an fp8 weight must be {FP8_DTYPE}, got {loaded.dtype} (a float layer the "
                "quantization_config's ignored_layers should name?)"
            )
        load(param, loaded, shard_id)

    return load_fp8


def _row_scale_loader(sizes: Sequence[int]) -> WeightLoader:
    """A loader of one value per row of each shard ([size, 1] or [size] per shard) that
    also takes one value for the whole shard (a scalar or [1]), spread over its rows."""
    load = fused_weight_loader(sizes)

    def load_scales(param: nn.Parameter, loaded: torch.Tensor, shard_id: int | None = None) -> None:
        size = sizes[0 if shard_id is None else shard_id]
        if loaded.numel() == 1:
            loaded = loaded.reshape(1).expand(size)
        if loaded.numel() == size:
            loaded = loaded.reshape(size, *param.shape[1:])
        load(param, loaded, shard_id)

    return load_scales
