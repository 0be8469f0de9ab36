"""The quantization extension point: how a linear layer stores its weights and multiplies.

A checkpoint's quantization method (its `quantization_config.quant_method`, or
`--quantization`) names a `QuantizationConfig` class registered in the
`core.quantization` entry-point group. The model asks that config, per linear layer, for
a `LinearMethod`; the method creates the layer's parameters and performs its matmul, so a
plugin (AWQ, GPTQ, FP8...) swaps both without the model code knowing. A
`WrappedLinearMethod` adds to whatever method a layer already has (LoRA over an AWQ or an
unquantized base). `core.quantization.unquantized.UnquantizedLinearMethod` is the
reference every method is measured against.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

if TYPE_CHECKING:
    from core.model_loader.checkpoint import Checkpoint
    from core.quantization.packed import PackedWeight

__all__ = [
    "FUSED_CHECKPOINT_MODULES",
    "LinearMethod",
    "LinearPartition",
    "LinearSplit",
    "QuantizationConfig",
    "WrappedLinearMethod",
]


FUSED_CHECKPOINT_MODULES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
"""The checkpoint modules each of core's fused linear layers stacks, by the last part of
its name: what a method that settles layers by checkpoint names (ignore lists, targets)
matches a fused layer's name against."""


class LinearSplit(str, enum.Enum):
    """Which dimension of W [output, input] tensor parallelism splits across ranks."""

    COLUMN = "column"  # outputs: each rank computes its slice of every fused output
    ROW = "row"  # inputs: each rank multiplies its slice of x; partial sums are added
    REPLICATED = "replicated"  # neither: every rank holds all of W


@dataclass(frozen=True)
class LinearPartition:
    """The part of one linear layer's W that one tensor-parallel rank holds.

    `input_size` and `output_sizes` are the layer's full sizes (`output_sizes` one entry
    per fused output, e.g. q, k, v); the `*_per_partition` properties are this rank's.
    A COLUMN split divides every fused output by `tp_size` (rank r holds rows
    [r * n / tp_size, (r + 1) * n / tp_size) of each output of size n), a ROW split
    divides the input the same way, a REPLICATED layer keeps both whole. Until tensor
    parallelism is built every layer is rank 0 of 1, so the partition is the whole layer.
    """

    input_size: int
    output_sizes: tuple[int, ...]
    split: LinearSplit
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} is not a rank of tp_size {self.tp_size}")
        if self.input_size < 1 or not self.output_sizes or min(self.output_sizes) < 1:
            raise ValueError(
                f"input_size {self.input_size} and output_sizes {self.output_sizes} "
                "must be positive"
            )
        if self.split is LinearSplit.ROW and self.input_size % self.tp_size:
            raise ValueError(
                f"input_size {self.input_size} does not divide into tp_size {self.tp_size} "
                "row-parallel partitions"
            )
        if self.split is LinearSplit.COLUMN:
            for i, size in enumerate(self.output_sizes):
                if size % self.tp_size:
                    raise ValueError(
                        f"output_sizes[{i}] = {size} does not divide into tp_size "
                        f"{self.tp_size} column-parallel partitions"
                    )

    @property
    def input_size_per_partition(self) -> int:
        """The input features this rank multiplies: W's second dimension here."""
        if self.split is LinearSplit.ROW:
            return self.input_size // self.tp_size
        return self.input_size

    @property
    def output_sizes_per_partition(self) -> tuple[int, ...]:
        """This rank's size of each fused output, in order: W's rows here."""
        if self.split is LinearSplit.COLUMN:
            return tuple(size // self.tp_size for size in self.output_sizes)
        return self.output_sizes


class LinearMethod(ABC):
    """Weight creation, matmul and dense reference of one linear layer.

    A linear layer computes y = x W^T + b. On one tensor-parallel rank W has the logical
    shape [sum(p.output_sizes_per_partition), p.input_size_per_partition] for the layer's
    `LinearPartition` p; its rows stack the fused outputs in order (q, k, v for a fused
    attention projection; gate, up for a fused MLP; a single output otherwise), and the
    layer's output is their concatenation. How W is stored (dtype, packing, scales,
    layout) is the method's business; the logical W is what `dequantize` returns.

    Parameters and any per-layer state belong on the layer: a QuantizationConfig may hand
    one method instance to many layers. The reference is `UnquantizedLinearMethod`.
    """

    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        partition: LinearPartition,
        bias: bool,
        dtype: torch.dtype,
    ) -> None:
        """Register this rank's parameters on `layer` (`layer.register_parameter`).

        Contract:
        - Shapes follow `partition`'s per-partition sizes, never its full sizes.
          (Loading a full checkpoint tensor into a partition, taking rank tp_rank's slice,
          arrives with tensor parallelism; until then the two are equal.)
        - Parameter names are the checkpoint's suffixes for this method ("weight" for
          unquantized; e.g. "qweight", "qzeros", "scales" for AWQ): the model loads the
          checkpoint tensor `<layer prefix>.<name>` into the parameter `<name>`.
        - Every parameter carries a `weight_loader(param, loaded, shard_id)` attribute
          (`core.quantization.weight_loader.set_weight_loader`). `shard_id` is the index
          into `output_sizes_per_partition` of the fused output the checkpoint tensor
          holds, or None for a tensor covering the whole parameter (the layer translates
          its own shard names, "q" or 0, into that index). `fused_weight_loader`
          implements the common case of shards stacked along one dimension.
        - When `bias` is true, register a parameter named "bias" of shape
          [sum(partition.output_sizes_per_partition)] in `dtype`; `apply` receives it.
          Otherwise register none: the layer has already set `layer.bias` to None.
        - Parameters are created with requires_grad=False (inference only) on the
          current default device; `dtype` is the model's activation dtype.
        """

    @abstractmethod
    def apply(
        self,
        layer: nn.Module,
        x: torch.Tensor,  # [num_tokens, input_size_per_partition], the activation dtype
        bias: torch.Tensor | None,  # [sum(output_sizes_per_partition)]
    ) -> torch.Tensor:  # [num_tokens, sum(output_sizes_per_partition)], activation dtype
        """x W^T + bias, computed from the parameters `create_weights` made.

        The hot path (every layer, every step): keep Python work and temporaries to a
        minimum. It must equal `self.rounded_input(layer, x) @ self.dequantize(layer).T +
        bias` up to the rounding of its arithmetic (the conformance kit checks exactly that).
        """

    @abstractmethod
    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        """The layer's logical W as a dense tensor, the reference `apply` is held to.

        Shape [sum(output_sizes_per_partition), input_size_per_partition], in the
        activation dtype `create_weights` received, on the parameters' device. Off the
        hot path (tests, the conformance kit, tools): it may allocate and be slow. It may
        return a parameter itself (the unquantized method does), so callers must not
        modify the result in place.
        """

    def rounded_input(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The activation `apply` multiplies by W, as values in x's dtype: x itself (the
        default), or, for a method that quantizes activations as it runs (W8A8: int8 per
        token), what x rounds to. Off the hot path, like `dequantize`: the other half of
        the reference `apply` is held to."""
        return x

    def packed_weight(self, layer: nn.Module) -> PackedWeight | None:
        """The weight `apply` multiplies by when `apply(layer, x, bias)` is exactly
        `core.ops.quant_linear(x, *its tensors) + bias` (x not reordered, nothing added), so
        that a kernel package running whole layers (core.models.layer_stack) may call the
        op's kernel on it directly; None otherwise (the default: `apply` must run). On the
        hot path: no copies."""
        return None

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Turn the loaded checkpoint tensors into the form `apply` multiplies, once.

        Called for every layer after the whole checkpoint is loaded (by the worker, and by
        the conformance kit), before the first `apply`: the place to repack a checkpoint's
        layout into a kernel's, or to merge fused shards stored in different formats.
        Afterwards the checkpoint parameters may be gone (replaced by buffers); `apply`
        and `dequantize` must then work from what replaced them, and describe the same W.
        The default keeps the parameters as loaded.
        """

    def embed(self, layer: nn.Module, token_ids: torch.Tensor) -> torch.Tensor:
        """Rows `token_ids` [T] of W as [T, input_size] in the activation dtype.

        For a layer that is a vocabulary embedding (`QuantizationConfig.
        get_embedding_method`): W [vocab, hidden] is both the embedding table and, when
        the head is tied, the LM head's weight. The default dequantizes all of W on every
        call; a method that serves embeddings overrides it to read only the rows asked for.
        """
        return torch.nn.functional.embedding(token_ids, self.dequantize(layer))


class WrappedLinearMethod(LinearMethod):
    """A method that adds to another one (its `base`) without knowing what the base is.

    LoRA is the intended user: its wrapper keeps the base's parameters and `apply`
    (AWQ, GGUF, unquantized alike), registers its own low-rank buffers, and adds their
    product to the base's output. Every call delegates to `base` by default; a wrapper
    overrides `add_weights` to register its tensors and `apply`. `dequantize` describes
    what `apply` computes for a row the wrapper leaves alone; a wrapper whose addition
    depends on the row (core-lora's: each token row's adapter, from the forward context)
    documents its own per-row reference beside it.

    A layer wraps the method it already has with `LinearBase.wrap_linear_method`, after
    its base parameters exist (and possibly after they are loaded); a QuantizationConfig
    may also return a wrapper from `get_linear_method`, and then `create_weights` makes
    the base's parameters and the wrapper's together.
    """

    def __init__(self, base: LinearMethod) -> None:
        self.base = base

    def create_weights(
        self,
        layer: nn.Module,
        partition: LinearPartition,
        bias: bool,
        dtype: torch.dtype,
    ) -> None:
        self.base.create_weights(layer, partition, bias, dtype)
        self.add_weights(layer, partition, dtype)

    def add_weights(self, layer: nn.Module, partition: LinearPartition, dtype: torch.dtype) -> None:
        """Register this wrapper's own parameters on `layer`, beside the base's.

        Same rules as `create_weights` (per-partition shapes, a `weight_loader` on each,
        requires_grad=False); names must differ from the base's, which stay untouched.
        The default registers none.
        """

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.base.apply(layer, x, bias)

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        return self.base.dequantize(layer)

    def rounded_input(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.base.rounded_input(layer, x)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.base.process_weights_after_loading(layer)


class QuantizationConfig(ABC):
    """A quantization method and its settings, registered in `core.quantization`.

    `name` is the entry name (the checkpoint's `quant_method`). The engine builds one
    instance per model with `from_config` and passes it to the model class, which calls
    `get_linear_method` once per linear layer while it is constructed.
    """

    name: ClassVar[str]
    # Whether its methods declare, for every parameter, how it lies along W
    # (`set_shard_dims`), so that its layers split across tensor-parallel ranks; the
    # frontend refuses --tensor-parallel-size above 1 for a method that does not.
    tensor_parallel: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> QuantizationConfig:
        """Build from the checkpoint's `quantization_config` dict; ValueError naming a
        missing or unsupported field."""

    @abstractmethod
    def get_linear_method(self, layer_name: str) -> LinearMethod:
        """The method for the linear layer `layer_name` (its module prefix, e.g.
        "model.layers.0.self_attn.qkv_proj"); return an `UnquantizedLinearMethod` for
        layers the checkpoint leaves unquantized."""

    @classmethod
    def for_float_weights(cls) -> QuantizationConfig | None:
        """The config that quantizes a float checkpoint's weights as they load: what
        `--quantization NAME` runs on a checkpoint without a `quantization_config` (vLLM's
        online quantization; fp8 stores each linear weight in e4m3 once loaded). Its
        methods then take the checkpoint's float tensors. None (the default): the method
        runs only on weights stored in it, and asking for it on float weights is refused."""
        return None

    def get_embedding_method(self, layer_name: str) -> LinearMethod | None:
        """The method for the vocabulary embedding or LM head `layer_name`
        ("model.embed_tokens", "lm_head"): a linear layer from hidden to vocabulary whose
        `embed` looks rows up. None (the default, what most methods want) leaves them
        unquantized."""
        return None

    @classmethod
    def quantize_checkpoint(
        cls, checkpoint: Checkpoint, out_dir: Path, options: Mapping[str, Any]
    ) -> None:
        """Write a checkpoint quantized with this method, made from `checkpoint`, to `out_dir`.

        What `core quantize NAME MODEL OUT_DIR` runs. `checkpoint` is any model core loads
        (a Hugging Face directory or a GGUF file); `options` are the method's settings
        (e.g. {"group_size": 128}) from the command line. The result must load back with
        this method as a Hugging Face directory: config.json whose `quantization_config`
        names it, safetensors weights and the tokenizer files. ValueError naming an
        unknown or invalid option. A method that cannot produce checkpoints (the default)
        raises ValueError saying so.
        """
        raise ValueError(f"quantization method {cls.name!r} cannot write checkpoints")
