"""The `compressed-tensors` method reads LLM Compressor checkpoints: W4A16 / W8A16
pack-quantized and W8A8 int8 layers load to exactly their dequantized weights, the engine
serves them like a float copy holding those weights, and everything else is refused
naming the config field.

The checkpoints are quantized and packed by the test itself, following the format as
published (compressed-tensors' QuantizationArgs and pack_to_int32): round to nearest per
group or channel, signed values stored unsigned (+ 2^(bits - 1)), packed 32 / bits to an
int32 word from the least significant bits, along the inputs for weights and along the
outputs for zero points; not by core's code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from quantized_layers import assert_loads_dequantized
from safetensors.torch import load_file, save_file

from core import LLM, SamplingParams
from core.model_loader import resolve_model
from core.models import build_model
from core.models.layers import LinearBase, MergedLinear, RowParallelLinear
from core.models.layers import linear as linear_layers
from core.quantization import UnquantizedLinearMethod
from core.quantization.compressed_tensors import CompressedTensorsConfig
from core.quantization.compressed_tensors.pack_quantized import PackQuantizedLinearMethod
from core.quantization.compressed_tensors.w8a8 import W8A8LinearMethod
from core.quantization.selector import build_quantization_config
from core.testing.tiny_checkpoint import VOCAB, random_llama, write_tiny_checkpoint

pytest.importorskip("transformers")

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def weights_args(bits: int, group: int | None, symmetric: bool) -> dict:
    strategy = {"strategy": "group", "group_size": group} if group else {"strategy": "channel"}
    return {"num_bits": bits, "type": "int", "symmetric": symmetric, "dynamic": False, **strategy}


TOKEN_INT8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}


def quant_config(
    weights: dict, activations: dict | None = None, fmt: str = "pack-quantized"
) -> dict:
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations}
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {"group_0": group},
        "ignore": ["lm_head"],
        "quantization_status": "compressed",
    }


W8A8 = quant_config(weights_args(8, None, True), TOKEN_INT8, "int-quantized")
SCHEMES = {
    "w4a16-group": quant_config(weights_args(4, 32, True)),
    "w4a16-group-asym": quant_config(weights_args(4, 32, False)),
    "w4a16-channel": quant_config(weights_args(4, None, True)),
    "w8a16-group-asym": quant_config(weights_args(8, 16, False)),
    "w8a16-channel": quant_config(weights_args(8, None, True)),
    "w8a8": W8A8,
}
GROUP = {name: config["config_groups"]["group_0"] for name, config in SCHEMES.items()}


# -- the format, as published ----------------------------------------------------------


def rtn_quantize(w: torch.Tensor, bits: int, group: int | None, symmetric: bool):
    """LLM Compressor's round to nearest of W [N, K] per group (None: per channel): signed
    values q [N, K], float16 scales [N, groups] (quantized with what is stored) and
    signed zero points [N, groups] (zeros when symmetric). W = (q - z) * scale."""
    n, k = w.shape
    group = group or k
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    blocks = w.reshape(n, k // group, group)
    low, high = blocks.amin(-1).clamp(max=0), blocks.amax(-1).clamp(min=0)
    if symmetric:
        scale = torch.maximum(-low, high) / ((qmax - qmin) / 2)
    else:
        scale = (high - low) / (qmax - qmin)
    scale = scale.clamp(min=1e-6).half().float()
    if symmetric:
        zero = torch.zeros_like(scale)
    else:
        zero = (qmin - torch.round(low / scale)).clamp(qmin, qmax)
    q = (torch.round(blocks / scale[..., None]) + zero[..., None]).clamp(qmin, qmax)
    return q.reshape(n, k).long(), scale.half(), zero.long()


def pack_to_int32(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Signed values [R, C] -> int32 [R, C * bits / 32]: each shifted to unsigned by
    2^(bits - 1), value j of word w in bits j * bits.. of it, from the least significant."""
    per_word = 32 // bits
    unsigned = values + 2 ** (bits - 1)
    words = torch.zeros(values.shape[0], values.shape[1] // per_word, dtype=torch.int64)
    for word in range(words.shape[1]):
        for j in range(per_word):
            words[:, word] |= unsigned[:, word * per_word + j] << (j * bits)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def compress(w: torch.Tensor, group: dict) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The checkpoint tensors (by suffix) of one projection W [N, K] quantized as config
    group `group` says, and its dequantized W."""
    args = group["weights"]
    bits, symmetric = args["num_bits"], args["symmetric"]
    q, scale, zero = rtn_quantize(w, bits, args.get("group_size"), symmetric)
    per_input = w.shape[1] // scale.shape[1]
    steps = scale.float().repeat_interleave(per_input, 1)
    dequantized = (q - zero.repeat_interleave(per_input, 1)).float() * steps
    if group.get("input_activations") is not None:  # W8A8 is int-quantized: int8 as it is
        return {"weight": q.to(torch.int8), "weight_scale": scale}, dequantized
    tensors = {
        "weight_packed": pack_to_int32(q, bits),
        "weight_scale": scale,
        "weight_shape": torch.tensor(w.shape, dtype=torch.int64),
    }
    if not symmetric:
        tensors["weight_zero_point"] = pack_to_int32(zero.T.contiguous(), bits).T.contiguous()
    return tensors, dequantized


def tiny_model():
    """hidden 64, intermediate 128: every group of 32 (and every channel) whole runs of 32."""
    return random_llama(
        VOCAB, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
        num_layers=2, max_positions=64, seed=0,
    )  # fmt: skip


def write_checkpoint(
    directory: Path, config: dict, group_of: Callable[[str], str] = lambda module: "group_0"
) -> dict[str, torch.Tensor]:
    """The tiny llama with its linear layers compressed per `config`, each module by the
    config group `group_of(module)` names; returns each projection's dequantized W
    (float32) by module name."""
    write_tiny_checkpoint(directory, tiny_model())
    tensors, expected = {}, {}
    for name, tensor in load_file(directory / "model.safetensors").items():
        module = name.removesuffix(".weight")
        if module.split(".")[-1] not in LINEARS:
            tensors[name] = tensor
            continue
        group = config["config_groups"][group_of(module)]
        compressed, expected[module] = compress(tensor, group)
        tensors |= {f"{module}.{suffix}": t for suffix, t in compressed.items()}
    save_file(tensors, directory / "model.safetensors")
    hf_config = json.loads((directory / "config.json").read_text())
    hf_config["quantization_config"] = config
    (directory / "config.json").write_text(json.dumps(hf_config))
    return expected


def write_float_copy(directory: Path, expected: dict[str, torch.Tensor]) -> Path:
    """The tiny llama with the dequantized weights in place of its linear layers'."""
    write_tiny_checkpoint(directory, tiny_model())
    weights = load_file(directory / "model.safetensors")
    weights |= {f"{module}.weight": w for module, w in expected.items()}
    save_file(weights, directory / "model.safetensors")
    return directory


# -- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_checkpoint_loads_to_exactly_its_dequantized_weights(tmp_path, scheme):
    expected = write_checkpoint(tmp_path, SCHEMES[scheme])
    checkpoint = resolve_model(str(tmp_path))
    config = build_quantization_config("compressed-tensors", checkpoint.hf_config)
    model = build_model(checkpoint, config)
    method = W8A8LinearMethod if scheme == "w8a8" else PackQuantizedLinearMethod
    assert_loads_dequantized(model, expected, method)
    assert isinstance(model.lm_head.linear_method, UnquantizedLinearMethod)


def _tp_layers(monkeypatch, config: CompressedTensorsConfig, rank: int) -> list[LinearBase]:
    """A fused column-parallel and a row-parallel layer as rank `rank` of 2 holds them."""
    monkeypatch.setattr(linear_layers, "get_tensor_model_parallel_world_size", lambda: 2)
    monkeypatch.setattr(linear_layers, "get_tensor_model_parallel_rank", lambda: rank)
    return [
        MergedLinear(64, [64, 64], quant_config=config, prefix="model.layers.0.mlp.gate_up_proj"),
        RowParallelLinear(128, 64, quant_config=config, prefix="model.layers.0.mlp.down_proj"),
    ]


@pytest.mark.parametrize("scheme", ["w4a16-group-asym", "w8a16-channel", "w8a8"])
@pytest.mark.parametrize("rank", [0, 1])
def test_tensor_parallel_ranks_load_their_slice(monkeypatch, scheme, rank):
    torch.manual_seed(rank)
    config = CompressedTensorsConfig.from_config(SCHEMES[scheme])
    column, row = _tp_layers(monkeypatch, config, rank)
    gate, up, down = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 128)
    for layer, shards in ((column, {0: gate, 1: up}), (row, {None: down})):
        for shard_id, w in shards.items():
            tensors, _ = compress(w, GROUP[scheme])
            for suffix, tensor in tensors.items():
                param = getattr(layer, suffix)
                param.weight_loader(param, tensor, shard_id)
        layer.linear_method.process_weights_after_loading(layer)
    half = slice(32 * rank, 32 * rank + 32)
    want_column = torch.cat([compress(w, GROUP[scheme])[1][half] for w in (gate, up)])
    assert torch.equal(column.linear_method.dequantize(column), want_column)
    want_row = compress(down, GROUP[scheme])[1][:, 64 * rank : 64 * rank + 64]
    assert torch.equal(row.linear_method.dequantize(row), want_row)


# -- serving ---------------------------------------------------------------------------------


def greedy_tokens(directory: Path) -> list[list[int]]:
    prompts = ["user : w1 w2 w3 w4", "w7 w7 w9", "w10 w3 w20 w1 w2"]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    llm = LLM(str(directory), dtype="float32", max_model_len=32, kv_cache_memory="1MiB")
    return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """Kernel timings go to the test's own cache (the W8A8 kernels are chosen by timing)."""
    monkeypatch.setenv("CORE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.usefixtures("cache_dir")
def test_weight_only_checkpoint_serves_like_its_dequantized_float_copy(tmp_path):
    # Attention in 4-bit groups with zero points, the MLP in 8 bits per channel.
    attention = {"targets": ["Linear"], "weights": weights_args(4, 32, False)}
    mlp = {"targets": ["re:.*mlp\\..*"], "weights": weights_args(8, None, True)}
    config = quant_config(attention["weights"])
    config["config_groups"] = {"attention": attention, "mlp": mlp}
    expected = write_checkpoint(
        tmp_path / "ct", config, lambda module: "mlp" if ".mlp." in module else "attention"
    )
    float_copy = write_float_copy(tmp_path / "float", expected)
    assert greedy_tokens(tmp_path / "ct") == greedy_tokens(float_copy)


def round_per_token(x: torch.Tensor) -> torch.Tensor:
    """W8A8's dynamic activations as vLLM runs them: each token's row to symmetric int8
    by its own largest |x| (x * 127 / max |x|, rounded half to even), back in x's dtype."""
    x32 = x.float()
    amax = x32.abs().amax(dim=1, keepdim=True)
    step = amax / 127
    factor = 127 / torch.where(amax > 0, amax, torch.ones_like(amax))
    return (torch.round(x32 * factor).clamp(-127, 127) * step).to(x.dtype)


@pytest.mark.usefixtures("cache_dir")
def test_w8a8_checkpoint_serves_like_a_float_copy_rounding_activations_alike(tmp_path, monkeypatch):
    """The float copy's linear layers (not its LM head, which the checkpoint leaves alone)
    round their input per token as W8A8 does: both then multiply the same values, the
    int8 engine with exact integer sums, the float one in float32, so greedy tokens agree
    (the tiny model's logits are far from ties)."""
    expected = write_checkpoint(tmp_path / "ct", W8A8)
    float_copy = write_float_copy(tmp_path / "float", expected)
    w8a8_tokens = greedy_tokens(tmp_path / "ct")
    apply = UnquantizedLinearMethod.apply

    def apply_to_rounded_input(self, layer, x, bias):
        return apply(self, layer, round_per_token(x) if isinstance(layer, LinearBase) else x, bias)

    monkeypatch.setattr(UnquantizedLinearMethod, "apply", apply_to_rounded_input)
    assert w8a8_tokens == greedy_tokens(float_copy)


# -- what is refused ---------------------------------------------------------------------------


def changed(config: dict, path: str, value) -> dict:
    """A deep copy of `config` with the value at dotted `path` set (None deletes it)."""
    config = json.loads(json.dumps(config))
    *parents, key = path.split(".")
    node = config
    for parent in parents:
        node = node[parent]
    if value is None:
        node.pop(key, None)
    else:
        node[key] = value
    return config


W4 = SCHEMES["w4a16-group"]
G0 = "config_groups.group_0"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (changed(W4, f"{G0}.weights.num_bits", 3), f"{G0}.weights.num_bits"),
        (changed(W4, f"{G0}.weights.type", "float"), f"{G0}.weights.type"),
        (changed(W4, f"{G0}.weights.strategy", "tensor"), f"{G0}.weights.strategy"),
        (changed(W4, f"{G0}.weights.group_size", 48), f"{G0}.weights.group_size"),
        (changed(W4, f"{G0}.weights.group_size", None), f"{G0}.weights.group_size"),
        (changed(W4, f"{G0}.weights.actorder", "group"), f"{G0}.weights.actorder"),
        (changed(W4, f"{G0}.weights.dynamic", True), f"{G0}.weights.dynamic"),
        (changed(W4, f"{G0}.output_activations", TOKEN_INT8), f"{G0}.output_activations"),
        (changed(W4, f"{G0}.targets", "Linear"), f"{G0}.targets"),
        (changed(W4, f"{G0}.format", "marlin-24"), f"{G0}.format"),
        (changed(W4, "format", "float-quantized"), "format"),
        (changed(W4, "ignore", ["re:(unclosed"]), "ignore"),
        (changed(W4, "config_groups", {}), "config_groups"),
        (changed(W4, "sparsity_config", {"format": "sparse-24-bitmask"}), "sparsity_config.format"),
        (changed(W4, "kv_cache_scheme", {"num_bits": 8, "type": "float"}), "kv_cache_scheme"),
        (changed(W8A8, f"{G0}.input_activations.dynamic", False),
         f"{G0}.input_activations.dynamic"),
        (changed(W8A8, f"{G0}.input_activations.symmetric", False),
         f"{G0}.input_activations.symmetric"),
        (changed(W8A8, f"{G0}.input_activations.strategy", "tensor"),
         f"{G0}.input_activations.strategy"),
        (changed(W8A8, f"{G0}.weights", weights_args(4, None, True)), f"{G0}.weights.num_bits"),
        (changed(W8A8, f"{G0}.weights", weights_args(8, 128, True)), f"{G0}.weights.strategy"),
        (changed(W8A8, "format", "pack-quantized"), "format"),
    ],
)  # fmt: skip
def test_unsupported_configs_are_refused_naming_the_field(config, field):
    with pytest.raises(ValueError, match=f"^{field.replace('.', '[.]')}: "):
        CompressedTensorsConfig.from_config(config)


def test_group_size_that_does_not_divide_in_features_names_the_layer_and_field():
    config = CompressedTensorsConfig.from_config(changed(W4, f"{G0}.weights.group_size", 96))
    message = f"^mlp: {G0}.weights.group_size 96 does not divide in_features 64$"
    with pytest.raises(ValueError, match=message.replace(".", "[.]")):
        RowParallelLinear(64, 32, quant_config=config, prefix="mlp")


MIXED = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "all": {"targets": ["Linear"], "weights": weights_args(4, 128, True)},
        "mlp_down": {"targets": ["re:.*mlp\\.down_proj$"], "weights": weights_args(8, None, True)},
        "one_o_proj": {
            "targets": ["model.layers.1.self_attn.o_proj"],
            "weights": weights_args(8, None, True),
            "input_activations": TOKEN_INT8,
            "format": "int-quantized",
        },
    },
    "ignore": ["lm_head", "re:model\\.layers\\.0\\.mlp\\.(gate|up)_proj"],
}


def test_layers_take_the_group_that_names_them_most_closely():
    config = CompressedTensorsConfig.from_config(MIXED)

    def scheme(layer: str) -> str:
        method = config.get_linear_method(f"model.layers.{layer}")
        if isinstance(method, PackQuantizedLinearMethod):
            return method.scheme.name
        return type(method).__name__

    assert scheme("1.mlp.down_proj") == "W8A16"  # a pattern beats the class
    assert scheme("1.self_attn.o_proj") == "W8A8LinearMethod"  # a name beats both
    assert scheme("0.self_attn.o_proj") == "W4A16"
    assert scheme("0.self_attn.qkv_proj") == "W4A16"  # q, k and v all by class
    assert scheme("0.mlp.gate_up_proj") == "UnquantizedLinearMethod"  # gate and up ignored
    assert scheme("1.mlp.gate_up_proj") == "W4A16"


def test_fused_projections_quantized_differently_are_refused():
    ignore = ["lm_head", "re:.*\\.gate_proj"]
    config = CompressedTensorsConfig.from_config(changed(MIXED, "ignore", ignore))
    with pytest.raises(ValueError, match=r"^model\.layers\.0\.mlp\.gate_up_proj: .* one scheme"):
        config.get_linear_method("model.layers.0.mlp.gate_up_proj")


def test_a_quantized_lm_head_is_refused():
    with pytest.raises(ValueError, match=f"^ignore: lm_head is quantized [(]{G0} targets it[)]"):
        CompressedTensorsConfig.from_config(changed(W4, "ignore", []))
