"""Conformance of a quantization method (`--core-conformance=quantization:NAME`).

The QuantizationConfig is built with `from_config` from each `--core-conformance-quant-
config` JSON whose "quant_method" is NAME (none given: `{"quant_method": NAME}`), and its
LinearMethod runs inside core's own linear layers (plain, row-parallel, fused gate/up,
fused q/k/v) in float32, bfloat16 and float16. Each parameter is filled with random values
through its own `weight_loader`, a fused layer shard by shard with tensors shaped like the
single-output layer's (what a checkpoint stores per projection): any bit pattern of its
dtype, or what the parameter's own maker gives (`core.quantization.weight_loader.
set_random_values`). Then `process_weights_after_loading` runs on every layer, and:
- `dequantize` gives W of the logical shape in the activation dtype, and a fused layer's
  W is its shards' W stacked in order (the loaders put each shard in its place);
- `apply(layer, x, bias)` equals `rounded_input(layer, x) @ dequantize(layer).T + bias`
  (x itself unless the method quantizes activations) within 1e-5 (float32),
  1e-2 (float16) or 2e-2 (bfloat16) of the product's scale, for 1 and 5 tokens;
- where `packed_weight(layer)` gives a weight, `apply(layer, x, bias)` equals
  `core.ops.quant_linear(x, *its tensors) + bias` to the bit (kernel packages that run whole
  layers call the op on it in place of `apply`: core.models.layer_stack);
- parameters are inference-only (requires_grad False) and carry a weight_loader.
A create_weights that refuses an activation dtype with ValueError skips that dtype.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import pytest
import torch
from torch import nn

from core.models.layers import (
    LinearBase,
    MergedLinear,
    QKVLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from core.ops import quant_linear
from core.quantization.interface import QuantizationConfig
from core.quantization.weight_loader import get_random_values
from core.testing.plugin import quant_configs_of, targets_of

INPUT = 64
TOLERANCES = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}
"""Max |apply - reference| relative to max(|x| @ |W|^T + |bias|), the product's scale."""


@dataclass(frozen=True)
class LayerCase:
    """A core linear layer shape, its fused shards and their shard ids."""

    name: str
    input_size: int
    build: Callable[..., LinearBase]  # (input_size, quant_config=, prefix=, dtype=, bias=)
    shards: tuple[tuple[int | str | None, int], ...]  # (shard id, output size), in order


LAYERS = (
    LayerCase("replicated", INPUT, lambda i, **kw: ReplicatedLinear(i, 96, **kw), ((None, 96),)),
    LayerCase("row-parallel", INPUT, lambda i, **kw: RowParallelLinear(i, 64, **kw), ((None, 64),)),
    LayerCase(
        "merged-gate-up", INPUT, lambda i, **kw: MergedLinear(i, [96, 96], **kw), ((0, 96), (1, 96))
    ),
    LayerCase(
        "qkv",
        INPUT,
        lambda i, **kw: QKVLinear(i, 16, 4, 2, **kw),  # 4 query heads, 2 KV heads of 16
        (("q", 64), ("k", 32), ("v", 32)),
    ),
)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    given = quant_configs_of(metafunc.config)
    params = []
    for target in targets_of(metafunc.config, "quantization"):
        name = target.value.name
        hf_configs = [c for c in given if c.get("quant_method", name) == name]
        hf_configs = hf_configs or [{"quant_method": name}]
        for index, hf_config in enumerate(hf_configs):
            config_id = f"{target.id}-config{index}" if len(hf_configs) > 1 else target.id
            params += [
                pytest.param(
                    target.value,
                    hf_config,
                    layer,
                    dtype,
                    bias,
                    id=_id(config_id, layer, dtype, bias),
                )
                for layer in LAYERS
                for dtype in DTYPES
                for bias in (False, True)
            ]
    metafunc.parametrize(("config_cls", "hf_config", "layer_case", "dtype", "bias"), params)


def _id(config_id: str, layer: LayerCase, dtype: torch.dtype, bias: bool) -> str:
    dtype_name = str(dtype).removeprefix("torch.")
    return f"{config_id}-{layer.name}-{dtype_name}{'-bias' if bias else ''}"


@pytest.fixture
def quant_config(config_cls: type[QuantizationConfig], hf_config: dict) -> QuantizationConfig:
    try:
        return config_cls.from_config(hf_config)
    except ValueError as exc:
        pytest.fail(
            f"from_config({hf_config}) raised: {exc}; give a checkpoint's quantization_config "
            "with --core-conformance-quant-config JSON",
            pytrace=False,
        )


@pytest.fixture
def loaded(
    quant_config,
    layer_case: LayerCase,
    dtype: torch.dtype,
    bias: bool,
    core_conformance_device: torch.device,
) -> tuple[LinearBase, list[LinearBase]]:
    """The layer, and one single-output layer per shard, on the device under test, each
    parameter of both loaded through its weight_loader from the same random tensors (the
    fused one shard by shard)."""
    generator = torch.Generator().manual_seed(0)
    with core_conformance_device:  # create_weights makes parameters on the default device
        layer = _build(quant_config, layer_case.build, layer_case, dtype, bias)
    params = dict(layer.named_parameters(recurse=False))
    shards = []
    for shard_id, size in layer_case.shards:
        single = partial(ReplicatedLinear, output_size=size)
        with core_conformance_device:
            shard = _build(quant_config, single, layer_case, dtype, bias)
        for name, param in shard.named_parameters(recurse=False):
            if name not in params:
                pytest.fail(f"the fused layer has no parameter {name!r}", pytrace=False)
            make = get_random_values(param)
            tensor = make(generator) if make is not None else _random_like(param, generator)
            param.weight_loader(param, tensor)
            params[name].weight_loader(params[name], tensor, shard_id)
        shards.append(shard)
    for each in (layer, *shards):
        each.linear_method.process_weights_after_loading(each)
    return layer, shards


@pytest.fixture
def layer(loaded: tuple[LinearBase, list[LinearBase]]) -> LinearBase:
    return loaded[0]


def _build(
    quant_config, build: Callable[..., LinearBase], case: LayerCase, dtype: torch.dtype, bias: bool
) -> LinearBase:
    prefix = f"model.layers.0.{case.name}"
    try:
        return build(
            case.input_size, quant_config=quant_config, prefix=prefix, dtype=dtype, bias=bias
        )
    except ValueError as exc:
        pytest.skip(f"create_weights refuses {dtype}: {exc}")


def _random_like(param: nn.Parameter, generator: torch.Generator) -> torch.Tensor:
    """Random values of `param`'s shape and dtype: every bit pattern for integers (packed
    formats included), small normal values for floats."""
    if param.dtype.is_floating_point:
        return (torch.randn(param.shape, generator=generator) * 0.1).to(param.dtype)
    if param.dtype == torch.bool:
        return torch.randint(0, 2, param.shape, generator=generator).bool()
    info = torch.iinfo(param.dtype)
    low, high = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.randint(low, high + 1, param.shape, generator=generator, dtype=torch.int64).to(
        param.dtype
    )


def test_dequantize_gives_the_logical_weight(layer: LinearBase, dtype: torch.dtype) -> None:
    weight = layer.linear_method.dequantize(layer)
    partition = layer.partition
    shape = (sum(partition.output_sizes_per_partition), partition.input_size_per_partition)
    assert tuple(weight.shape) == shape, f"dequantize shape {tuple(weight.shape)}, expected {shape}"
    assert weight.dtype == dtype, f"dequantize dtype {weight.dtype}, expected {dtype}"


def test_fused_weight_is_its_shards_in_order(
    loaded: tuple[LinearBase, list[LinearBase]], layer_case: LayerCase
) -> None:
    layer, shards = loaded
    got = layer.linear_method.dequantize(layer)
    start = 0
    for (shard_id, _), shard in zip(layer_case.shards, shards, strict=True):
        want = shard.linear_method.dequantize(shard)
        rows = slice(start, start + want.shape[0])
        assert torch.equal(got[rows], want), (
            f"rows {rows.start}:{rows.stop} of the fused W are not shard {shard_id!r}'s W"
        )
        start = rows.stop


@pytest.mark.parametrize("num_tokens", [1, 5])
def test_apply_equals_the_dequantized_reference(
    layer: LinearBase, dtype: torch.dtype, num_tokens: int
) -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(num_tokens, layer.partition.input_size_per_partition, generator=generator)
    x = x.to(dtype)  # [T, input]
    method = layer.linear_method
    # After process_weights_after_loading the weights may live in buffers.
    device = next(itertools.chain(layer.parameters(), layer.buffers())).device
    got = method.apply(layer, x.to(device), layer.bias).cpu()
    assert got.dtype == dtype, f"apply returned {got.dtype} for {dtype} activations"
    weight = method.dequantize(layer).double().cpu()  # [out, input]
    bias = (
        torch.zeros(weight.shape[0], dtype=torch.float64)
        if layer.bias is None
        else layer.bias.double().cpu()
    )
    # x as the method rounds it (activations quantized at run time), else x itself.
    rounded = method.rounded_input(layer, x.to(device)).double().cpu()
    want = rounded @ weight.T + bias
    scale = (rounded.abs() @ weight.abs().T + bias.abs()).max().item()
    diff = (got.double() - want).abs().max().item()
    assert diff <= TOLERANCES[dtype] * scale, (
        f"apply differs from rounded_input(layer, x) @ dequantize(layer).T + bias by {diff:.3g} "
        f"> {TOLERANCES[dtype]} x scale {scale:.3g}"
    )


@pytest.mark.parametrize("num_tokens", [1, 5])
def test_a_packed_weight_is_what_apply_multiplies(
    layer: LinearBase, dtype: torch.dtype, num_tokens: int
) -> None:
    packed = layer.linear_method.packed_weight(layer)
    if packed is None:
        return  # apply always runs: nothing to hold it to
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(num_tokens, layer.partition.input_size_per_partition, generator=generator)
    x = x.to(dtype).to(packed.qweight.device)
    got = layer.linear_method.apply(layer, x, layer.bias)
    want = quant_linear(x, packed.qweight, packed.scales, packed.mins, packed.bits)
    want = want if layer.bias is None else want + layer.bias
    assert torch.equal(got, want), (
        "apply(layer, x, bias) differs from core.ops.quant_linear on packed_weight(layer) + bias"
    )


def test_parameters_are_inference_only_and_loadable(layer: LinearBase) -> None:
    for name, param in layer.named_parameters(recurse=False):
        assert not param.requires_grad, f"{name} requires grad"
        assert callable(getattr(param, "weight_loader", None)), f"{name} has no weight_loader"
