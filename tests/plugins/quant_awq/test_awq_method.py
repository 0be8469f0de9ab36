"""The `awq` method reads AutoAWQ checkpoints: the packing order is AutoAWQ's, the engine
serves them, and bad checkpoints or settings fail naming what is wrong.

The checkpoints here are packed by the test itself, following AutoAWQ's documented
layout (WQLinear_GEMM.from_linear: int weights transposed to [in, out], eight outputs per
int32 in the order 0 2 4 6 1 3 5 7, four bits each from the lowest), not by the plugin.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest
import torch
from core_quant_awq.awq import AWQConfig, AWQLinearMethod
from quantized_layers import assert_loads_dequantized
from safetensors.torch import load_file, save_file

from core import LLM, SamplingParams
from core.model_loader import resolve_model
from core.models import build_model
from core.models.layers import MergedLinear
from core.plugins.registry import PluginRegistry
from core.quantization import UnquantizedLinearMethod
from core.quantization.selector import build_quantization_config, quantization_config_class
from core.testing.tiny_checkpoint import write_tiny_checkpoint

pytest.importorskip("transformers")

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AUTOAWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def autoawq_quantize(w: torch.Tensor, group: int):
    """AutoAWQ's zero-point round-to-nearest of W [out, in]: (int weights [out, in],
    zeros [out, groups], scales [out, groups])."""
    out, inp = w.shape
    grouped = w.reshape(-1, group)
    max_val, min_val = grouped.amax(dim=1, keepdim=True), grouped.amin(dim=1, keepdim=True)
    scales = (max_val - min_val).clamp(min=1e-5) / 15
    scales = scales.half().float()  # stored as float16: quantize with what is stored
    zeros = (-torch.round(min_val / scales)).clamp(0, 15)
    intweight = (torch.round(grouped / scales) + zeros).clamp(0, 15)
    return (
        intweight.reshape(out, inp).int(),
        zeros.reshape(out, -1).int(),
        scales.reshape(out, -1),
    )


def autoawq_pack(intweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor):
    """(qweight [in, out/8], qzeros [groups, out/8], scales [groups, out] half), packed
    column by column as AutoAWQ's WQLinear_GEMM.from_linear does."""

    def pack(values: torch.Tensor) -> torch.Tensor:  # [rows, out] -> [rows, out / 8]
        packed = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int32)
        for col in range(values.shape[1] // 8):
            for i in range(8):
                packed[:, col] |= values[:, col * 8 + AUTOAWQ_ORDER[i]] << (i * 4)
        return packed

    return pack(intweight.T.contiguous()), pack(zeros.T.contiguous()), scales.T.half().contiguous()


def write_awq_checkpoint(directory: Path, group: int, **overrides) -> dict[str, torch.Tensor]:
    """The tiny llama, its linear layers AWQ-packed; returns each linear's W as the
    test computes it, (q - z) * s in float32, by HF module name."""
    write_tiny_checkpoint(directory)
    weights = load_file(directory / "model.safetensors")
    expected, tensors = {}, {}
    for name, tensor in weights.items():
        module = name.removesuffix(".weight")
        if module.split(".")[-1] not in LINEARS:
            tensors[name] = tensor.half()
            continue
        intweight, zeros, scales = autoawq_quantize(tensor.float(), group)
        qweight, qzeros, half_scales = autoawq_pack(intweight, zeros, scales)
        tensors |= {
            f"{module}.qweight": qweight,
            f"{module}.qzeros": qzeros,
            f"{module}.scales": half_scales,
        }
        groups = zeros.repeat_interleave(group, dim=1)
        steps = scales.repeat_interleave(group, dim=1)
        expected[module] = (intweight - groups).float() * steps
    tensors |= overrides
    save_file(tensors, directory / "model.safetensors")
    config = json.loads((directory / "config.json").read_text())
    config["torch_dtype"] = "float16"
    config["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return expected


def load_awq_model(directory: Path) -> torch.nn.Module:
    checkpoint = resolve_model(str(directory))
    return build_model(checkpoint, build_quantization_config("awq", checkpoint.hf_config))


def test_autoawq_packed_checkpoint_loads_to_its_dequantized_weights(tmp_path):
    group = 32  # the tiny model's hidden size
    expected = write_awq_checkpoint(tmp_path, group)
    model = load_awq_model(tmp_path)
    assert_loads_dequantized(model, expected, AWQLinearMethod)


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_layer_multiplies_by_its_autoawq_shards(group, dtype):
    torch.manual_seed(group)
    sizes, inputs = [40, 24], 256
    layer = MergedLinear(inputs, sizes, quant_config=AWQConfig(group), prefix="mlp", dtype=dtype)
    want = []
    for shard, size in enumerate(sizes):
        intweight, zeros, scales = autoawq_quantize(torch.randn(size, inputs), group)
        packed = autoawq_pack(intweight, zeros, scales)
        for name, tensor in zip(("qweight", "qzeros", "scales"), packed, strict=True):
            param = getattr(layer, name)
            param.weight_loader(param, tensor, shard)
        steps = scales.repeat_interleave(group, dim=1)
        want.append((intweight - zeros.repeat_interleave(group, dim=1)).float() * steps)
    layer.linear_method.process_weights_after_loading(layer)
    weight = torch.cat(want)  # [64, 256]
    assert torch.equal(layer.linear_method.dequantize(layer).float(), weight.to(dtype).float())
    for tokens in (1, 3, 17):
        x = torch.randn(tokens, inputs).to(dtype)
        reference = x.double() @ weight.double().T
        scale = (x.double().abs() @ weight.double().abs().T).max()
        tolerance = 1e-6 if dtype == torch.float32 else 1e-2  # fp32 sums; one bf16 rounding
        assert (layer(x).double() - reference).abs().max() <= tolerance * scale


def test_awq_checkpoint_serves_like_its_dequantized_float_copy(tmp_path):
    expected = write_awq_checkpoint(tmp_path / "awq", 32)
    float_dir = write_tiny_checkpoint(tmp_path / "float")
    weights = load_file(float_dir / "model.safetensors")
    for module, weight in expected.items():
        weights[f"{module}.weight"] = weight
    # The float copy holds exactly what the AWQ copy stores: float16 norms and embeddings.
    save_file(
        {name: t.half().float() for name, t in weights.items()}, float_dir / "model.safetensors"
    )
    prompts = ["user : w1 w2 w3 w4", "w7 w7 w9", "w10 w3 w20 w1 w2"]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outputs = {}
    for name in ("awq", "float"):
        llm = LLM(str(tmp_path / name), dtype="float32", max_model_len=32, kv_cache_memory="1MiB")
        assert llm.engine.config.model.quantization == ("awq" if name == "awq" else None)
        outputs[name] = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    assert outputs["awq"] == outputs["float"]


def test_group_size_that_does_not_divide_in_features_names_the_layer(tmp_path):
    write_awq_checkpoint(tmp_path, 32)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["group_size"] = 96  # a multiple of 32 that 32 and 64 lack
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="qkv_proj: group_size 96 does not divide in_features 32"):
        load_awq_model(tmp_path)


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path):
    bad = {"model.layers.1.mlp.down_proj.qzeros": torch.zeros(3, 4, dtype=torch.int32)}
    write_awq_checkpoint(tmp_path, 32, **bad)
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.down_proj\.qzeros'.*\(3, 4\)"):
        load_awq_model(tmp_path)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"bits": 8, "group_size": 128}, "bits"),
        ({"bits": 4}, "group_size"),
        ({"bits": 4, "group_size": 48}, "group_size"),
        ({"bits": 4, "group_size": 128, "zero_point": False}, "zero_point"),
        ({"bits": 4, "group_size": 128, "version": "gemv"}, "version"),
    ],
)
def test_unsupported_settings_are_refused_naming_the_field(settings, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        AWQConfig.from_config({"quant_method": "awq", **settings})


def test_autoawq_spellings_and_modules_to_not_convert():
    config = AWQConfig.from_config(
        {"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "modules_to_not_convert": ["mlp"]}
    )
    assert config.group_size == 64
    assert isinstance(
        config.get_linear_method("model.layers.0.mlp.down_proj"), UnquantizedLinearMethod
    )
    assert isinstance(config.get_linear_method("model.layers.0.self_attn.o_proj"), AWQLinearMethod)


def test_awq_without_the_plugin_names_the_package_to_install():
    # This environment's entry points, less the plugin's.
    points = [ep for ep in metadata.entry_points(group="core.quantization") if ep.name != "awq"]
    registry = PluginRegistry(points, allowlist=None)
    with pytest.raises(ValueError, match=r"--quantization awq: .*pip install core-quant-awq"):
        quantization_config_class("awq", registry)


def test_an_awq_target_drafts_with_a_float_model(tmp_path):
    pytest.importorskip("core_spec_decode")
    write_awq_checkpoint(tmp_path / "awq", 32)
    draft = write_tiny_checkpoint(tmp_path / "draft")  # float weights: it stays unquantized
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    outputs = []
    for spec in (None, {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2}):
        llm = LLM(str(tmp_path / "awq"), dtype="float32", max_model_len=32,
                  kv_cache_memory="1MiB", speculative_config=spec)  # fmt: skip
        outputs.append(llm.generate(["w1 w2 w3"], params)[0].outputs[0].token_ids)
    assert outputs[0] == outputs[1]
