"""`core quantize awq MODEL OUT_DIR`: an AutoAWQ-format checkpoint from any model core loads.

The model (a Hugging Face directory or a GGUF file, dequantized to float32) runs on a
small calibration text; every linear layer's inputs are recorded; per decoder layer the
AWQ scale of each group of linears sharing an input is searched (`awq_search`) and
folded in, as AutoAWQ does for the Llama family:

- q/k/v (core's fused qkv_proj): scale into their columns, 1/scale into input_layernorm;
- o_proj: 1/scale into v_proj's rows, only when v has one output per o_proj input (as
  many KV heads as query heads); otherwise it is rounded without a scale;
- gate/up (gate_up_proj): 1/scale into post_attention_layernorm;
- down_proj: 1/scale into up_proj's rows.

Then every linear is rounded to 4 bits in groups and written in AutoAWQ's GEMM layout
(`awq_format`) under the checkpoint's separate names (q_proj, k_proj, ...), with the
other tensors (embeddings, the folded norms, an untied lm_head) in float16.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from tqdm import tqdm

from core.model_loader import Checkpoint, GGUFCheckpoint
from core.models import build_model
from core.models.calibration import record_linear_inputs
from core.models.layers import LinearBase
from core.tokenizer import Tokenizer, load_tokenizer
from core_quant_awq.awq_format import PACK, pack_columns
from core_quant_awq.awq_search import GROUP_SIZES, check_group_size, quantize_groups, search_scale

__all__ = ["AWQOptions", "calibration_sequences", "quantize_checkpoint"]

CALIBRATION_TEXT = "calibration.txt"  # package data: an original English text of ~2k tokens
WEIGHTS_FILE = "model.safetensors"
# Copied from a Hugging Face directory when present (core reads tokenizer.json).
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
# The checkpoint names of core's fused linears' outputs, in order.
_HF_SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class AWQOptions:
    """The settings of `core quantize awq` (`--group-size`, `--option KEY=VALUE`).

    group_size: inputs per quantization group, one of 32/64/128; by default 128, or the
      largest of 64, 32 that divides every linear layer's input size.
    num_samples, seq_len: the calibration runs num_samples sequences of seq_len tokens,
      consecutive pieces of the calibration text.
    calibration_file: a UTF-8 text file to calibrate on instead of the built-in text.
    """

    group_size: int | None = None
    num_samples: int = 4
    seq_len: int = 128
    calibration_file: str | None = None

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> AWQOptions:
        """Read `options`; ValueError naming an unknown option or a value of the wrong type."""
        known = {field.name: field for field in fields(cls)}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"unknown AWQ options {unknown}; known: {sorted(known)}")
        for name, value in options.items():
            wanted = str if name == "calibration_file" else int
            if type(value) is not wanted or (wanted is int and value < 1):
                raise ValueError(f"AWQ option {name} should be a positive {wanted.__name__}")
        if options.get("group_size", GROUP_SIZES[0]) not in GROUP_SIZES:
            raise ValueError(
                f"group_size should be one of {GROUP_SIZES}, got {options['group_size']}"
            )
        return cls(**options)


@dataclass
class _DenseModel:
    """The float32 weights being scaled and folded, taken from the core model."""

    weights: dict[str, torch.Tensor]  # linear prefix -> W [out, in]
    biases: dict[str, torch.Tensor]  # linear prefix -> b [out], for linears with a bias
    output_sizes: dict[str, tuple[int, ...]]  # linear prefix -> its fused outputs' sizes
    others: dict[str, torch.Tensor]  # every other parameter by name (embeddings, norms)

    @classmethod
    def of(cls, model: nn.Module) -> _DenseModel:
        linears = {m.prefix: m for m in model.modules() if isinstance(m, LinearBase)}
        owned = {
            f"{prefix}.{name}"
            for prefix, module in linears.items()
            for name, _ in module.named_parameters(recurse=False)
        }
        return cls(
            weights={p: m.linear_method.dequantize(m).float().clone() for p, m in linears.items()},
            biases={p: m.bias.float().clone() for p, m in linears.items() if m.bias is not None},
            output_sizes={p: m.partition.output_sizes for p, m in linears.items()},
            others={n: t.float().clone() for n, t in model.named_parameters() if n not in owned},
        )


@dataclass(frozen=True)
class _ScaleGroup:
    """Linear `linear` reads what `previous` produces: an RMSNorm's output (`shard` None),
    or output `shard` of a fused linear. Names are relative to the decoder layer."""

    linear: str
    previous: str
    shard: int | None = None


_SCALE_GROUPS = (
    _ScaleGroup("self_attn.qkv_proj", "input_layernorm"),
    _ScaleGroup("self_attn.o_proj", "self_attn.qkv_proj", shard=2),
    _ScaleGroup("mlp.gate_up_proj", "post_attention_layernorm"),
    _ScaleGroup("mlp.down_proj", "mlp.gate_up_proj", shard=1),
)


def quantize_checkpoint(checkpoint: Checkpoint, out_dir: Path, options: Mapping[str, Any]) -> None:
    """Write `checkpoint` quantized with AWQ to `out_dir` as an AutoAWQ GEMM checkpoint.

    `out_dir` receives model.safetensors, config.json (the checkpoint's config with
    torch_dtype float16 and the AWQ quantization_config) and the tokenizer files.
    `options`: see `AWQOptions`. ValueError for a bad option, a checkpoint that is
    already quantized, or a model whose layout is not the Llama family's.
    """
    settings = AWQOptions.from_mapping(options)
    if checkpoint.hf_config.get("quantization_config"):
        raise ValueError(f"{checkpoint.path} is already quantized: quantize an unquantized model")
    context = checkpoint.hf_config["max_position_embeddings"]
    if settings.seq_len > context:
        raise ValueError(f"seq_len {settings.seq_len} exceeds the model's context of {context}")
    tokenizer = load_tokenizer(checkpoint)
    sequences = calibration_sequences(tokenizer, settings)
    model = build_model(checkpoint)
    group_size = _group_size(settings.group_size, model)
    inputs = record_linear_inputs(model, sequences)
    dense = _DenseModel.of(model)
    del model  # the dense copy is all that is needed from here on
    tensors = _quantize(dense, inputs, group_size)
    # Written only once everything succeeded.
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    config = _awq_config(checkpoint.hf_config, group_size)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _write_tokenizer_files(checkpoint, tokenizer, out_dir)


def calibration_sequences(tokenizer: Tokenizer, options: AWQOptions) -> list[torch.Tensor]:
    """The calibration token sequences: the first num_samples pieces of seq_len tokens of
    the calibration text. ValueError naming both options when the text is too short."""
    if options.calibration_file is None:
        source = resources.files("core_quant_awq").joinpath(CALIBRATION_TEXT)
    else:
        source = Path(options.calibration_file)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"calibration_file {source}: cannot read it ({exc})") from exc
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)
    needed = options.num_samples * options.seq_len
    if ids.shape[0] < needed:
        raise ValueError(
            f"the calibration text has {ids.shape[0]} tokens, fewer than num_samples "
            f"{options.num_samples} x seq_len {options.seq_len}"
        )
    return list(ids[:needed].split(options.seq_len))


def _group_size(requested: int | None, model: nn.Module) -> int:
    """`requested`, checked against every linear; by default the largest that fits all."""
    in_sizes = {
        m.prefix: m.partition.input_size for m in model.modules() if isinstance(m, LinearBase)
    }
    if requested is None:
        for size in sorted(GROUP_SIZES, reverse=True):
            if all(in_size % size == 0 for in_size in in_sizes.values()):
                return size
        raise ValueError(f"no group_size of {GROUP_SIZES} divides every linear's input size")
    for prefix, in_size in in_sizes.items():
        try:
            check_group_size(requested, in_size)
        except ValueError as exc:
            raise ValueError(f"{prefix}: {exc}") from exc
    return requested


def _quantize(
    dense: _DenseModel, inputs: dict[str, torch.Tensor], group_size: int
) -> dict[str, torch.Tensor]:
    """Scale, fold and round every decoder layer; the checkpoint tensors by name."""
    layers = sorted({int(m[1]) for p in dense.weights if (m := _LAYER.match(p))})
    outside = [p for p in dense.weights if not _LAYER.match(p)]
    if outside:
        raise ValueError(f"linear layers outside model.layers.N are not supported: {outside}")
    tensors: dict[str, torch.Tensor] = {}
    for index in tqdm(layers, desc="AWQ", unit="layer"):
        base = f"model.layers.{index}"
        groups = [group for group in _SCALE_GROUPS if _foldable(dense, base, group)]
        scales = [
            search_scale(inputs[linear], dense.weights[linear], group_size)
            for linear in (f"{base}.{group.linear}" for group in groups)
        ]
        for group, scale in zip(groups, scales, strict=True):  # all searched, then folded
            _fold(dense, base, group, scale)
        for prefix in [p for p in dense.weights if p.startswith(f"{base}.")]:
            inputs.pop(prefix, None)
            tensors.update(_packed_linear(dense, prefix, group_size))
    for name, tensor in dense.others.items():
        tensors[name] = _to_half(name, tensor)
    return tensors


def _foldable(dense: _DenseModel, base: str, group: _ScaleGroup) -> bool:
    """Whether `group`'s scale can be folded into its previous operation.

    A norm always can; a linear's shard only when it has one output per input of the
    group's linear. ValueError when the layer lacks the Llama-family modules.
    """
    linear, previous = f"{base}.{group.linear}", f"{base}.{group.previous}"
    if linear not in dense.weights:
        raise ValueError(f"the model has no {linear}: not a Llama-family decoder layout")
    if group.shard is None:
        if f"{previous}.weight" not in dense.others:
            raise ValueError(f"the model has no {previous}: not a Llama-family decoder layout")
        return True
    if previous not in dense.output_sizes:
        raise ValueError(f"the model has no {previous}: not a Llama-family decoder layout")
    return dense.output_sizes[previous][group.shard] == dense.weights[linear].shape[1]


def _fold(dense: _DenseModel, base: str, group: _ScaleGroup, scale: torch.Tensor) -> None:
    """W * scale for the group's linear, 1 / scale into what produces its input."""
    linear, previous = f"{base}.{group.linear}", f"{base}.{group.previous}"
    dense.weights[linear] = dense.weights[linear] * scale  # [out, in] * [in]
    if group.shard is None:
        norm = f"{previous}.weight"
        dense.others[norm] = dense.others[norm] / scale
        return
    sizes = dense.output_sizes[previous]
    rows = slice(sum(sizes[: group.shard]), sum(sizes[: group.shard + 1]))
    dense.weights[previous][rows] /= scale[:, None]
    if previous in dense.biases:
        dense.biases[previous][rows] /= scale


def _packed_linear(dense: _DenseModel, prefix: str, group_size: int) -> dict[str, torch.Tensor]:
    """qweight / qzeros / scales (and bias) of each checkpoint linear the layer fuses."""
    base, _, name = prefix.rpartition(".")
    sizes = dense.output_sizes[prefix]
    hf_names = _HF_SHARDS.get(name, (name,))
    if len(hf_names) != len(sizes):
        raise ValueError(f"{prefix}: {len(sizes)} fused outputs, no checkpoint names for them")
    quantized = quantize_groups(dense.weights[prefix], group_size)
    stored = {
        "qweight": pack_columns(quantized.q.T),  # [in, out / 8]
        "qzeros": pack_columns(quantized.zeros.T),  # [in / G, out / 8]
        "scales": quantized.scales.T,  # [in / G, out]
    }
    tensors = {}
    start = 0
    for hf_name, size in zip(hf_names, sizes, strict=True):
        if size % PACK:
            raise ValueError(f"{base}.{hf_name}: {size} outputs, not a multiple of {PACK}")
        for suffix, tensor in stored.items():
            step = 1 if suffix == "scales" else PACK
            columns = slice(start // step, (start + size) // step)
            tensors[f"{base}.{hf_name}.{suffix}"] = tensor[:, columns].contiguous()
        if prefix in dense.biases:
            bias_name = f"{base}.{hf_name}.bias"
            tensors[bias_name] = _to_half(bias_name, dense.biases[prefix][start : start + size])
        start += size
    return tensors


def _to_half(name: str, tensor: torch.Tensor) -> torch.Tensor:
    half = tensor.half().contiguous()
    if not torch.isfinite(half).all():
        raise ValueError(f"{name}: values beyond float16's range after scaling")
    return half


def _awq_config(hf_config: Mapping[str, Any], group_size: int) -> dict[str, Any]:
    """config.json of the AWQ checkpoint: the model's, float16, and AutoAWQ's settings."""
    config = {**hf_config, "torch_dtype": "float16"}
    if "dtype" in config:  # transformers 5's spelling of torch_dtype
        config["dtype"] = "float16"
    config["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group_size,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }
    return config


def _write_tokenizer_files(checkpoint: Checkpoint, tokenizer: Tokenizer, out_dir: Path) -> None:
    """tokenizer.json and tokenizer_config.json (with the chat template) into `out_dir`:
    copied from a Hugging Face directory, written from a GGUF file's vocabulary."""
    if not isinstance(checkpoint, GGUFCheckpoint):
        for name in _TOKENIZER_FILES:
            if (checkpoint.path / name).is_file():
                shutil.copyfile(checkpoint.path / name, out_dir / name)
        return
    tokenizer.save(out_dir, model_max_length=checkpoint.hf_config["max_position_embeddings"])
