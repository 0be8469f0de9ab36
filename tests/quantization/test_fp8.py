"""The `fp8` method reads FP8 checkpoints to exactly their dequantized weights, serves them
like a float copy of those weights, quantizes float checkpoints as they load
(`--quantization fp8`), and refuses bad settings naming the field.

The checkpoints here are quantized by the test itself, block by block, following the
format as vLLM and DeepSeek-V3 publish it (float8_e4m3fn `weight`; float32 `weight_scale`
per tensor or per output row, or `weight_scale_inv` per bn x bk block, edge blocks
partial; W = fp8 value * scale), not by core's code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from core import LLM, SamplingParams
from core.engine_args import EngineArgs
from core.model_loader import resolve_model
from core.models import build_model
from core.models.layers import MergedLinear, ReplicatedLinear
from core.platforms.cpu import CpuPlatform
from core.quantization import UnquantizedLinearMethod
from core.quantization.fp8 import Fp8Config, Fp8LinearMethod
from core.quantization.selector import (
    StoredQuantization,
    build_quantization_config,
    resolve_quantization,
)
from core.testing.tiny_checkpoint import write_tiny_checkpoint

pytest.importorskip("transformers")

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
PER_TENSOR, PER_CHANNEL = "per-tensor", "per-channel"


def quantize_blocks(w: torch.Tensor, block_n: int, block_k: int):
    """W [N, K] quantized block by block: (fp8 [N, K], scales [ceil(N/bn), ceil(K/bk)],
    the dequantized W in float32, each element its fp8 value times its block's scale)."""
    n, k = w.shape
    rows, cols = -(-n // block_n), -(-k // block_k)
    values = torch.empty(n, k, dtype=FP8)
    scales = torch.empty(rows, cols)
    dequantized = torch.empty(n, k)
    for i in range(rows):
        for j in range(cols):
            block = (slice(i * block_n, (i + 1) * block_n), slice(j * block_k, (j + 1) * block_k))
            scale = w[block].abs().max() / E4M3_MAX
            values[block] = (w[block] / scale).to(FP8)
            scales[i, j] = scale
            dequantized[block] = values[block].float() * scale
    return values, scales, dequantized


def quantize_linear(w: torch.Tensor, scheme: str | tuple[int, int]):
    """(checkpoint tensors by suffix, dequantized W) of one linear layer's W."""
    if scheme == PER_TENSOR:
        values, scales, dequantized = quantize_blocks(w, *w.shape)
        return {"weight": values, "weight_scale": scales.reshape(())}, dequantized
    if scheme == PER_CHANNEL:
        values, scales, dequantized = quantize_blocks(w, 1, w.shape[1])
        return {"weight": values, "weight_scale": scales}, dequantized  # [N, 1]
    values, scales, dequantized = quantize_blocks(w, *scheme)
    return {"weight": values, "weight_scale_inv": scales}, dequantized


def write_fp8_checkpoint(directory: Path, schemes: dict[str, object], settings: dict) -> dict:
    """The tiny llama, each linear projection quantized by `schemes[projection]` (absent:
    left in float, to be named in ignored_layers); returns each linear's W by module."""
    write_tiny_checkpoint(directory)
    tensors = load_file(directory / "model.safetensors")
    expected = {}
    for name, tensor in list(tensors.items()):
        module = name.removesuffix(".weight")
        scheme = schemes.get(module.split(".")[-1])
        if scheme is None or not name.endswith(".weight"):
            continue
        stored, expected[module] = quantize_linear(tensor, scheme)
        del tensors[name]
        tensors |= {f"{module}.{suffix}": t for suffix, t in stored.items()}
    save_file(tensors, directory / "model.safetensors")
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", **settings}
    (directory / "config.json").write_text(json.dumps(config))
    return expected


def write_float_copy(directory: Path, weights: dict[str, torch.Tensor]) -> Path:
    """The tiny llama with the linear weights `weights` (by module) in float32."""
    write_tiny_checkpoint(directory)
    tensors = load_file(directory / "model.safetensors")
    tensors |= {f"{module}.weight": w for module, w in weights.items()}
    save_file(tensors, directory / "model.safetensors")
    return directory


def load_fp8_model(directory: Path) -> torch.nn.Module:
    checkpoint = resolve_model(str(directory))
    return build_model(checkpoint, build_quantization_config("fp8", checkpoint.hf_config))


def fused_weights(model: torch.nn.Module):
    """(core layer, the checkpoint modules it fuses, in order) of every linear layer."""
    for index, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{index}"
        attn, mlp = layer.self_attn, layer.mlp
        yield attn.qkv_proj, [f"{prefix}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
        yield attn.o_proj, [f"{prefix}.self_attn.o_proj"]
        yield mlp.gate_up_proj, [f"{prefix}.mlp.gate_proj", f"{prefix}.mlp.up_proj"]
        yield mlp.down_proj, [f"{prefix}.mlp.down_proj"]


# Per-tensor attention (each of q, k, v its own scale, fused into one layer), per-channel
# MLP; and blocks of 16 x 24, whose input blocks the layers' 32 and 64 inputs cut short.
MIXED = {**dict.fromkeys(ATTENTION, PER_TENSOR), **dict.fromkeys(MLP, PER_CHANNEL)}
BLOCKS = dict.fromkeys(ATTENTION + MLP, (16, 24))
CHECKPOINTS = {
    "per-tensor+per-channel": (MIXED, {"activation_scheme": "dynamic"}),
    "blocks": (
        BLOCKS,
        {"activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [16, 24]},
    ),
}


@pytest.mark.parametrize("variant", CHECKPOINTS)
def test_fp8_checkpoint_loads_to_its_dequantized_weights(tmp_path, variant):
    expected = write_fp8_checkpoint(tmp_path, *CHECKPOINTS[variant])
    model = load_fp8_model(tmp_path)
    for layer, modules in fused_weights(model):
        assert isinstance(layer.linear_method, Fp8LinearMethod)
        want = torch.cat([expected[module] for module in modules])
        assert torch.equal(layer.linear_method.dequantize(layer), want), layer.prefix


@pytest.mark.parametrize("variant", CHECKPOINTS)
def test_fp8_checkpoint_serves_like_its_dequantized_float_copy(tmp_path, variant):
    expected = write_fp8_checkpoint(tmp_path / "fp8", *CHECKPOINTS[variant])
    write_float_copy(tmp_path / "float", expected)
    assert greedy_tokens(tmp_path / "fp8", "fp8") == greedy_tokens(tmp_path / "float", None)


def greedy_tokens(directory: Path, method: str | None, **options) -> list[list[int]]:
    """Greedy completions of a few prompts, float32 activations; `method` must run."""
    prompts = ["user : w1 w2 w3 w4", "w7 w7 w9", "w10 w3 w20 w1 w2"]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    llm = LLM(str(directory), dtype="float32", max_model_len=32, kv_cache_memory="1MiB",
              **options)  # fmt: skip
    assert llm.engine.config.model.quantization == method
    return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]


def test_ignored_layers_stay_float(tmp_path):
    schemes = {p: PER_CHANNEL for p in ("o_proj", *MLP)}  # q, k and v stay float
    ignored = ["q_proj", "k_proj", "v_proj", "lm_head"]
    write_fp8_checkpoint(tmp_path, schemes, {"ignored_layers": ignored})
    float_weights = load_file(tmp_path / "model.safetensors")
    model = load_fp8_model(tmp_path)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.linear_method, UnquantizedLinearMethod)
    prefix = "model.layers.0.self_attn"
    want = torch.cat(
        [float_weights[f"{prefix}.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")]
    )
    assert torch.equal(qkv.weight, want)
    assert isinstance(model.model.layers[0].self_attn.o_proj.linear_method, Fp8LinearMethod)


@pytest.mark.parametrize(
    ("entry", "layer", "ignored"),
    [
        ("model.layers.0.mlp.down_proj", "model.layers.0.mlp.down_proj", True),
        ("model.layers.1", "model.layers.1.self_attn.o_proj", True),  # a module it lies in
        ("mlp", "model.layers.0.mlp.gate_up_proj", True),
        ("proj", "model.layers.0.self_attn.o_proj", False),  # names are matched whole
        ("model.layers.1", "model.layers.10.mlp.down_proj", False),
    ],
)
def test_which_layers_an_ignored_name_leaves_float(entry, layer, ignored):
    config = Fp8Config.from_config({"quant_method": "fp8", "modules_to_not_convert": [entry]})
    method = config.get_linear_method(layer)
    assert isinstance(method, UnquantizedLinearMethod) == ignored


def test_a_static_checkpoint_loads_and_its_input_scales_are_dropped(tmp_path):
    """W8A16 multiplies activations in their own dtype: input_scale is read, then unused."""
    expected = write_fp8_checkpoint(tmp_path, MIXED, {"activation_scheme": "static"})
    tensors = load_file(tmp_path / "model.safetensors")
    tensors |= {f"{module}.input_scale": torch.tensor(0.02) for module in expected}
    save_file(tensors, tmp_path / "model.safetensors")
    model = load_fp8_model(tmp_path)
    for layer, modules in fused_weights(model):
        assert not hasattr(layer, "input_scale")
        want = torch.cat([expected[module] for module in modules])
        assert torch.equal(layer.linear_method.dequantize(layer), want), layer.prefix


def test_deepseek_128_blocks_cut_short_at_both_edges():
    """A layer of 300 x 200: 3 x 2 blocks of 128, the last of each partial."""
    torch.manual_seed(0)
    w = torch.randn(300, 200)
    stored, want = quantize_linear(w, (128, 128))
    config = Fp8Config.from_config({"quant_method": "fp8", "weight_block_size": [128, 128]})
    layer = ReplicatedLinear(200, 300, quant_config=config, prefix="proj")
    for suffix, tensor in stored.items():
        param = getattr(layer, suffix)
        param.weight_loader(param, tensor)
    layer.linear_method.process_weights_after_loading(layer)
    assert torch.equal(layer.linear_method.dequantize(layer), want)
    x = torch.randn(3, 200)
    torch.testing.assert_close(layer(x), x @ want.T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_where_a_kernel_serves_fp8_linear_weights_stay_fp8(monkeypatch, dtype):
    """With a core::fp8_linear kernel for the device, a fused layer keeps its fp8 values
    and per-shard scales; the op's reference stands in for the kernel here."""
    monkeypatch.setattr("core.ops.provider", lambda op, device: "some-kernels")
    torch.manual_seed(1)
    config = Fp8Config.from_config({"quant_method": "fp8"})
    layer = MergedLinear(48, [40, 24], quant_config=config, prefix="mlp", dtype=dtype)
    want = []
    for shard, size in enumerate((40, 24)):
        stored, dequantized = quantize_linear(torch.randn(size, 48), PER_TENSOR)
        for suffix, tensor in stored.items():
            param = getattr(layer, suffix)
            param.weight_loader(param, tensor, shard)
        want.append(dequantized)
    layer.linear_method.process_weights_after_loading(layer)
    assert layer.fp8_weight.dtype == FP8 and not hasattr(layer, "dense_weight")
    weight = torch.cat(want)
    assert torch.equal(layer.linear_method.dequantize(layer), weight.to(dtype))
    x = torch.randn(5, 48).to(dtype)
    reference = x.double() @ weight.double().T
    scale = (x.double().abs() @ weight.double().abs().T).max()
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2  # float32 sums; one bf16 rounding
    assert (layer(x).double() - reference).abs().max() <= tolerance * scale


# -- --quantization fp8 on float weights, and what it is refused with --------------------


def test_quantization_fp8_on_a_float_checkpoint_quantizes_it_per_channel(tmp_path):
    """The online shorthand: one e4m3 scale per output row, computed as the weights load;
    the engine serves what a float copy of those rounded weights serves."""
    write_tiny_checkpoint(tmp_path / "float")
    tensors = load_file(tmp_path / "float" / "model.safetensors")
    rounded = {
        name.removesuffix(".weight"): quantize_linear(tensor, PER_CHANNEL)[1]
        for name, tensor in tensors.items()
        if name.split(".")[-2] in ATTENTION + MLP
    }
    write_float_copy(tmp_path / "rounded", rounded)
    online = greedy_tokens(tmp_path / "float", "fp8", quantization="fp8")
    assert online == greedy_tokens(tmp_path / "rounded", None)
    checkpoint = resolve_model(str(tmp_path / "float"))
    model = build_model(checkpoint, build_quantization_config("fp8", checkpoint.hf_config))
    for layer, modules in fused_weights(model):
        want = torch.cat([rounded[module] for module in modules])
        assert torch.equal(layer.linear_method.dequantize(layer), want), layer.prefix


@pytest.mark.parametrize(
    ("requested", "stored", "message"),
    [
        ("fp8", "awq", "--quantization fp8: the checkpoint is awq-quantized"),
        ("fp8", "gptq", "--quantization fp8: the checkpoint is gptq-quantized"),
        ("gptq", "fp8", "--quantization gptq: the checkpoint is fp8-quantized"),
        ("awq", "fp8", "--quantization awq: the checkpoint is fp8-quantized"),
        ("none", "fp8", "--quantization none: the checkpoint's weights are fp8-quantized"),
    ],
)
def test_a_method_other_than_the_checkpoints_is_refused_naming_both(requested, stored, message):
    with pytest.raises(ValueError, match=message):
        resolve_quantization(requested, StoredQuantization(method=stored))


def test_fp8_runs_on_float_weights_and_on_its_own_but_awq_does_not():
    assert resolve_quantization("fp8", StoredQuantization()) == "fp8"
    assert resolve_quantization(None, StoredQuantization(method="fp8")) == "fp8"
    config = EngineArgs(quantization="fp8").create_engine_config(
        CpuPlatform(), stored_quantization=StoredQuantization()
    )
    assert config.model.quantization == "fp8"
    with pytest.raises(ValueError, match="--quantization awq: the checkpoint is not quantized"):
        resolve_quantization("awq", StoredQuantization())


def test_an_fp8_checkpoints_own_settings_win_over_the_online_shorthand():
    hf_config = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    config = build_quantization_config("fp8", hf_config)
    assert config.serialized and config.block == (128, 128)
    assert not build_quantization_config("fp8", {}).serialized


# -- bad settings ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"activation_scheme": "per-token"}, "activation_scheme"),
        ({"fmt": "e5m2"}, "fmt"),
        ({"weight_block_size": [128]}, "weight_block_size"),
        ({"weight_block_size": [0, 128]}, "weight_block_size"),
        ({"weight_block_size": [128, True]}, "weight_block_size"),
        ({"weight_block_size": "128x128"}, "weight_block_size"),
        ({"ignored_layers": "lm_head"}, "ignored_layers"),
        ({"modules_to_not_convert": [1]}, "modules_to_not_convert"),
    ],
)
def test_unsupported_settings_are_refused_naming_the_field(settings, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        Fp8Config.from_config({"quant_method": "fp8", **settings})
    with pytest.raises(ValueError, match=rf"^quantization_config \(fp8\): {field}"):
        build_quantization_config(
            "fp8", {"quantization_config": {"quant_method": "fp8", **settings}}
        )


def test_blocks_straddling_fused_projections_are_refused_naming_the_layer():
    config = Fp8Config.from_config({"quant_method": "fp8", "weight_block_size": [32, 32]})
    with pytest.raises(ValueError, match=r"mlp: weight_block_size \[32, 32\].*\[40, 24\]"):
        MergedLinear(48, [40, 24], quant_config=config, prefix="mlp")


def test_ignoring_only_some_fused_projections_is_refused():
    config = Fp8Config.from_config({"quant_method": "fp8", "ignored_layers": ["k_proj"]})
    with pytest.raises(ValueError, match="^ignored_layers: .*qkv_proj fuses"):
        config.get_linear_method("model.layers.0.self_attn.qkv_proj")


def test_a_float_tensor_where_fp8_is_expected_is_named(tmp_path):
    write_fp8_checkpoint(tmp_path, MIXED, {})
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.1.mlp.down_proj.weight"] = torch.zeros(32, 64)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.down_proj\.weight'.*float32"):
        load_fp8_model(tmp_path)
