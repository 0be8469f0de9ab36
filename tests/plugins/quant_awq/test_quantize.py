"""`core quantize awq` (core_quant_awq.quantize) on a tiny random Llama with planted outliers.

A few hidden channels of both norms, and a few rows of v_proj and up_proj, are scaled up
30x, so every group of linears (q/k/v, o, gate/up, down) sees some huge input channels:
the case AWQ's activation-aware scales exist for. Expected weights are computed here from
AutoAWQ's documented rounding, not by the quantizer's own functions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from core_quant_awq import awq_format
from core_quant_awq.awq_search import search_scale
from core_quant_awq.quantize import AWQOptions, calibration_sequences, quantize_checkpoint
from safetensors.torch import load_file, save_file
from torch import nn

from core.model_loader import load_safetensors_checkpoint, resolve_model
from core.models import build_model
from core.models.calibration import forward_sequence, perplexity, record_linear_inputs
from core.quantization.selector import build_quantization_config
from core.testing.tiny_checkpoint import VOCAB, WORDS, write_tiny_checkpoint
from core.tokenizer import Tokenizer

GROUP_SIZE = 32
HIDDEN, INTERMEDIATE, NUM_LAYERS = 128, 256, 2
OUTLIER_CHANNELS = [3, 40, 77, 100]
OUTLIER_GAIN = 30.0
PROJECTIONS = {  # checkpoint linear -> (input size, output size)
    "self_attn.q_proj": (HIDDEN, HIDDEN),
    "self_attn.k_proj": (HIDDEN, HIDDEN),
    "self_attn.v_proj": (HIDDEN, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (HIDDEN, INTERMEDIATE),
    "mlp.up_proj": (HIDDEN, INTERMEDIATE),
    "mlp.down_proj": (INTERMEDIATE, HIDDEN),
}


def _outlier_model() -> transformers.LlamaForCausalLM:
    """4 query and 4 KV heads (so o_proj's scale folds into v_proj), outliers planted."""
    config = transformers.LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.input_layernorm.weight[OUTLIER_CHANNELS] *= OUTLIER_GAIN
            layer.post_attention_layernorm.weight[OUTLIER_CHANNELS] *= OUTLIER_GAIN
            layer.self_attn.v_proj.weight[OUTLIER_CHANNELS] *= OUTLIER_GAIN
            layer.mlp.up_proj.weight[OUTLIER_CHANNELS] *= OUTLIER_GAIN
    return model


def _word_text(num_words: int, seed: int) -> str:
    generator = torch.Generator().manual_seed(seed)
    words = [w for w in WORDS if w.startswith("w")]
    picks = torch.randint(0, len(words), (num_words,), generator=generator)
    return " ".join(words[i] for i in picks)


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("outliers"), _outlier_model())


@pytest.fixture(scope="module")
def options(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    text = tmp_path_factory.mktemp("calibration") / "words.txt"
    text.write_text(_word_text(200, seed=1))
    return dict(group_size=GROUP_SIZE, num_samples=4, seq_len=32, calibration_file=str(text))


@pytest.fixture(scope="module")
def awq_dir(source_dir: Path, options: dict[str, Any], tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("awq")
    quantize_checkpoint(load_safetensors_checkpoint(source_dir), out_dir, options)
    return out_dir


def _round_to_nearest(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """AutoAWQ's pseudo_quantize_tensor (zero point, 4 bits), scales held in float16."""
    groups = weight.reshape(weight.shape[0], -1, group_size)
    low = groups.amin(dim=-1, keepdim=True)
    high = groups.amax(dim=-1, keepdim=True)
    scales = ((high - low).clamp(min=1e-5) / 15).half().float()
    zeros = torch.clamp(-torch.round(low / scales), 0, 15)
    q = torch.clamp(torch.round(groups / scales) + zeros, 0, 15)
    return ((q - zeros) * scales).reshape(weight.shape)


def _dequantized(awq_dir: Path) -> dict[str, torch.Tensor]:
    """The AWQ checkpoint's tensors as float32 HF weights, each linear dequantized."""
    stored = load_file(awq_dir / "model.safetensors")
    weights = {}
    for name, tensor in stored.items():
        stem, _, suffix = name.rpartition(".")
        if suffix == "qweight":
            packed = (stored[f"{stem}.{part}"] for part in ("qweight", "qzeros", "scales"))
            weights[f"{stem}.weight"] = awq_format.dequantize(*packed)
        elif suffix not in ("qzeros", "scales"):
            weights[name] = tensor.float()
    return weights


def _dense_checkpoint(directory: Path, weights: dict[str, torch.Tensor], source: Path):
    """A float32 HF directory of `weights` with the source model's config."""
    directory.mkdir()
    shutil.copyfile(source / "config.json", directory / "config.json")
    save_file(
        {name: t.contiguous() for name, t in weights.items()}, directory / "model.safetensors"
    )
    return load_safetensors_checkpoint(directory)


def _logits(model: nn.Module, sequences: list[torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([model.compute_logits(forward_sequence(model, s)) for s in sequences])


def _held_out_sequences() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(3, len(VOCAB), (32,), generator=generator) for _ in range(4)]


def test_awq_cuts_the_logit_error_of_round_to_nearest(source_dir: Path, awq_dir: Path, tmp_path):
    source = load_safetensors_checkpoint(source_dir)
    original = dict(source.iter_weights(torch.float32))
    rtn = {
        name: _round_to_nearest(t, GROUP_SIZE) if name.endswith("proj.weight") else t
        for name, t in original.items()
    }
    sequences = _held_out_sequences()
    exact = _logits(build_model(source), sequences)
    awq_model = build_model(_dense_checkpoint(tmp_path / "awq", _dequantized(awq_dir), source_dir))
    rtn_model = build_model(_dense_checkpoint(tmp_path / "rtn", rtn, source_dir))
    awq, plain = _logits(awq_model, sequences), _logits(rtn_model, sequences)

    awq_mse = (awq - exact).pow(2).mean().item()
    rtn_mse = (plain - exact).pow(2).mean().item()
    assert awq_mse <= 0.8 * rtn_mse, f"AWQ logit MSE {awq_mse:.3g} vs RTN {rtn_mse:.3g}"


def test_checkpoint_has_autoawq_tensor_names_shapes_and_dtypes(awq_dir: Path) -> None:
    stored = load_file(awq_dir / "model.safetensors")
    want: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        "model.embed_tokens.weight": ((len(VOCAB), HIDDEN), torch.float16),
        "model.norm.weight": ((HIDDEN,), torch.float16),
        "lm_head.weight": ((len(VOCAB), HIDDEN), torch.float16),
    }
    for i in range(NUM_LAYERS):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            want[f"model.layers.{i}.{norm}.weight"] = ((HIDDEN,), torch.float16)
        for proj, (n_in, n_out) in PROJECTIONS.items():
            prefix = f"model.layers.{i}.{proj}"
            want[f"{prefix}.qweight"] = ((n_in, n_out // 8), torch.int32)
            want[f"{prefix}.qzeros"] = ((n_in // GROUP_SIZE, n_out // 8), torch.int32)
            want[f"{prefix}.scales"] = ((n_in // GROUP_SIZE, n_out), torch.float16)
    assert {name: (tuple(t.shape), t.dtype) for name, t in stored.items()} == want


def test_config_is_the_models_with_autoawq_quantization_config(source_dir: Path, awq_dir: Path):
    source = json.loads((source_dir / "config.json").read_text())
    written = json.loads((awq_dir / "config.json").read_text())
    assert written.pop("quantization_config") == {
        "quant_method": "awq",
        "bits": 4,
        "group_size": GROUP_SIZE,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }
    assert written.pop("torch_dtype") == "float16"
    assert written.pop("dtype", "float16") == "float16"
    unchanged = {k: v for k, v in source.items() if k not in ("torch_dtype", "dtype")}
    assert {k: v for k, v in written.items() if k in unchanged} == unchanged


def test_tokenizer_files_are_copied_from_a_model_directory(source_dir: Path, awq_dir: Path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (awq_dir / name).read_bytes() == (source_dir / name).read_bytes()
    assert Tokenizer.from_dir(awq_dir).chat_template is not None


def test_dequantized_weights_are_the_folded_rounded_weights(
    source_dir: Path, awq_dir: Path, options: dict[str, Any]
) -> None:
    source = load_safetensors_checkpoint(source_dir)
    sequences = calibration_sequences(Tokenizer.from_dir(source_dir), AWQOptions(**options))
    inputs = record_linear_inputs(build_model(source), sequences)
    weights = dict(source.iter_weights(torch.float32))
    got = _dequantized(awq_dir)
    for i in range(NUM_LAYERS):
        prefix = f"model.layers.{i}"

        def w(name: str, prefix: str = prefix) -> torch.Tensor:
            return weights[f"{prefix}.{name}.weight"]

        def scale(fused: str, *parts: str, prefix: str = prefix) -> torch.Tensor:
            stacked = torch.cat([w(part) for part in parts])
            return search_scale(inputs[f"{prefix}.{fused}"], stacked, GROUP_SIZE)

        qkv = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
        s_qkv = scale("self_attn.qkv_proj", *qkv)
        s_o = scale("self_attn.o_proj", "self_attn.o_proj")
        s_gate_up = scale("mlp.gate_up_proj", "mlp.gate_proj", "mlp.up_proj")
        s_down = scale("mlp.down_proj", "mlp.down_proj")
        assert not torch.equal(s_qkv, torch.ones_like(s_qkv))  # the outliers are scaled
        # Each linear holds round(W * its scale); 1 / scale went into what feeds it.
        folded = {
            "self_attn.q_proj": w("self_attn.q_proj") * s_qkv,
            "self_attn.k_proj": w("self_attn.k_proj") * s_qkv,
            "self_attn.v_proj": w("self_attn.v_proj") * s_qkv / s_o[:, None],
            "self_attn.o_proj": w("self_attn.o_proj") * s_o,
            "mlp.gate_proj": w("mlp.gate_proj") * s_gate_up,
            "mlp.up_proj": w("mlp.up_proj") * s_gate_up / s_down[:, None],
            "mlp.down_proj": w("mlp.down_proj") * s_down,
        }
        for name, weight in folded.items():
            want = _round_to_nearest(weight, GROUP_SIZE)
            torch.testing.assert_close(got[f"{prefix}.{name}.weight"], want, rtol=0, atol=1e-6)
        norms = {"input_layernorm": s_qkv, "post_attention_layernorm": s_gate_up}
        for norm, s in norms.items():
            want = (w(norm) / s).half().float()
            torch.testing.assert_close(got[f"{prefix}.{norm}.weight"], want, rtol=0, atol=0)


def test_qkv_biases_are_split_and_v_bias_takes_o_projs_scale(tmp_path: Path, options) -> None:
    config = transformers.Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    attention = model.model.layers[0].self_attn
    with torch.no_grad():
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
            projection.bias.normal_()
        attention.v_proj.weight[OUTLIER_CHANNELS] *= OUTLIER_GAIN
    source = load_safetensors_checkpoint(write_tiny_checkpoint(tmp_path / "qwen2", model))
    quantize_checkpoint(source, tmp_path / "awq", options)

    sequences = calibration_sequences(Tokenizer.from_dir(source.path), AWQOptions(**options))
    inputs = record_linear_inputs(build_model(source), sequences)
    o_proj = "model.layers.0.self_attn.o_proj"
    s_o = search_scale(inputs[o_proj], attention.o_proj.weight.detach(), GROUP_SIZE)
    assert not torch.allclose(s_o, torch.ones_like(s_o))  # a fold would show
    stored = load_file(tmp_path / "awq" / "model.safetensors")
    prefix = "model.layers.0.self_attn"
    assert torch.equal(stored[f"{prefix}.q_proj.bias"], attention.q_proj.bias.half())
    assert torch.equal(stored[f"{prefix}.k_proj.bias"], attention.k_proj.bias.half())
    assert torch.equal(stored[f"{prefix}.v_proj.bias"], (attention.v_proj.bias / s_o).half())


def test_the_checkpoint_loads_with_the_awq_method(source_dir: Path, awq_dir: Path, tmp_path):
    checkpoint = load_safetensors_checkpoint(awq_dir)
    quant_config = build_quantization_config("awq", checkpoint.hf_config)
    sequences = _held_out_sequences()
    got = _logits(build_model(checkpoint, quant_config), sequences)
    dense = _dense_checkpoint(tmp_path / "dense", _dequantized(awq_dir), source_dir)
    want = _logits(build_model(dense), sequences)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_group_size_not_dividing_an_input_size_is_named(tmp_path: Path) -> None:
    checkpoint = load_safetensors_checkpoint(write_tiny_checkpoint(tmp_path / "tiny"))
    options = dict(group_size=64, num_samples=1, seq_len=4, calibration_file=_text_file(tmp_path))
    with pytest.raises(ValueError, match="group_size 64 does not divide in_features 32"):
        quantize_checkpoint(checkpoint, tmp_path / "out", options)
    assert not (tmp_path / "out").exists()  # nothing is written before the checks pass


@pytest.mark.parametrize(
    "options,message",
    [
        ({"group_size": 48}, "group_size should be one of"),
        ({"group_sise": 32}, r"unknown AWQ options \['group_sise'\]"),
        ({"num_samples": "8"}, "num_samples should be a positive int"),
        ({"seq_len": 0}, "seq_len should be a positive int"),
        ({"seq_len": 1000}, "seq_len 1000 exceeds"),
        ({"num_samples": 100}, "fewer than num_samples 100 x seq_len"),
        ({"calibration_file": "/nonexistent/text.txt"}, "calibration_file /nonexistent"),
    ],
)
def test_bad_options_are_named(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    checkpoint = load_safetensors_checkpoint(write_tiny_checkpoint(tmp_path / "tiny"))
    options = {"seq_len": 4, "calibration_file": _text_file(tmp_path), **options}
    with pytest.raises(ValueError, match=message):
        quantize_checkpoint(checkpoint, tmp_path / "out", options)
    assert not (tmp_path / "out").exists()


def test_default_group_size_is_the_largest_dividing_every_input(tmp_path: Path) -> None:
    checkpoint = load_safetensors_checkpoint(write_tiny_checkpoint(tmp_path / "tiny"))
    options = dict(num_samples=2, seq_len=8, calibration_file=_text_file(tmp_path))
    quantize_checkpoint(checkpoint, tmp_path / "out", options)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["quantization_config"]["group_size"] == 32  # hidden size 32


HELD_OUT_TEXT = """\
Maps are promises about the world. A good one leaves out almost everything, keeping only
what a traveller needs: the roads, the rivers, a church spire that can be seen for miles.
Early mapmakers filled the blank edges with sea monsters and guesses, and sailors learned
to trust the coastlines near home and doubt the ones far away. Today a phone draws the map
as we walk, yet people still get lost, usually because they stop looking at the street and
start looking at the screen. When the signal fails in the hills, the old skills return: the
sun in the south at midday, moss on the damp side of a wall, and the patience to stop,
turn around, and walk back to the last place where everything still made sense.
"""


def _text_file(directory: Path) -> str:
    path = directory / "words.txt"
    path.write_text(_word_text(64, seed=3))
    return str(path)


@pytest.mark.slow
def test_default_model_quantizes_and_keeps_its_perplexity(tmp_path: Path) -> None:
    """The default model (a GGUF file): written with its tokenizer, loaded with the awq
    method, and its perplexity on a held-out text stays near the float model's."""
    source = resolve_model(None)
    quantize_checkpoint(source, tmp_path, {})
    checkpoint = load_safetensors_checkpoint(tmp_path)
    tokenizer, gguf_tokenizer = Tokenizer.from_dir(tmp_path), Tokenizer.from_gguf(source.path)
    assert tokenizer.chat_template == gguf_tokenizer.chat_template
    for name in ("bos_token", "eos_token", "pad_token_id"):
        assert getattr(tokenizer, name) == getattr(gguf_tokenizer, name)
    ids = tokenizer.encode(HELD_OUT_TEXT, add_special_tokens=False)
    assert ids == gguf_tokenizer.encode(HELD_OUT_TEXT, add_special_tokens=False)
    float_ppl = perplexity(build_model(source), ids, 256)
    quant_config = build_quantization_config("awq", checkpoint.hf_config)
    awq_ppl = perplexity(build_model(checkpoint, quant_config), ids, 256)
    assert awq_ppl < 1.5 * float_ppl, f"AWQ perplexity {awq_ppl:.3f} vs float {float_ppl:.3f}"
