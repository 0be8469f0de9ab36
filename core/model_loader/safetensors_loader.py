"""Hugging Face model directories: config.json + safetensors, single file or sharded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from core.model_loader.checkpoint import Checkpoint

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class SafetensorsCheckpoint(Checkpoint):
    """A Hugging Face model directory; `weight_files` are its safetensors files in order."""

    weight_files: tuple[Path, ...]

    def iter_weights(
        self, dtype: torch.dtype, keep_quantized: bool = False
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for file in self.weight_files:
            yield from _iter_file(file, None if keep_quantized else dtype)


def load_safetensors_checkpoint(
    model_dir: Path, served_name: str | None = None
) -> SafetensorsCheckpoint:
    """Open the HF model directory `model_dir` (config.json + safetensors weights).

    Reads config.json and every safetensors header (not the tensors, which are read
    lazily by `iter_weights`). `served_name` defaults to the directory's name.
    Raises ValueError naming the file when config.json or a weight file (a shard the
    index names) is missing, unreadable or corrupt.
    """
    if not model_dir.is_dir():
        raise ValueError(f"model directory {model_dir} does not exist")
    hf_config = _read_json(model_dir / CONFIG_FILE)
    weight_files = _weight_files(model_dir)
    for file in weight_files:
        _check_header(file)
    return SafetensorsCheckpoint(
        path=model_dir,
        hf_config=_normalize_config(hf_config),
        served_name=served_name or model_dir.name,
        weight_files=weight_files,
    )


def _weight_files(model_dir: Path) -> tuple[Path, ...]:
    """The safetensors files of `model_dir`: the shards its index names, else the single file."""
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        weight_map = _read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index_path}: no 'weight_map' naming the shards")
        shards = tuple(model_dir / name for name in sorted(set(weight_map.values())))
        for shard in shards:
            if not shard.is_file():
                raise ValueError(f"{index_path} names shard {shard.name}, which is missing")
        return shards
    single = model_dir / SINGLE_FILE
    if not single.is_file():
        raise ValueError(f"{model_dir} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    return (single,)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"{path} is missing")
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(content, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return content


def _check_header(file: Path) -> None:
    # Opening parses the header and checks that the file covers every tensor it declares,
    # so a truncated download fails here, before any model memory is allocated.
    try:
        with safe_open(file, framework="pt"):
            pass
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{file}: corrupt safetensors file ({exc})") from exc


def _iter_file(file: Path, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
    """The file's tensors, floating ones cast to `dtype` unless it is None."""
    try:
        with safe_open(file, framework="pt") as reader:
            for name in reader.keys():
                tensor = reader.get_tensor(name)
                cast = dtype is not None and tensor.is_floating_point()
                yield name, tensor.to(dtype) if cast else tensor
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{file}: corrupt safetensors file ({exc})") from exc


def _normalize_config(hf_config: dict[str, Any]) -> dict[str, Any]:
    """Add the classic config.json keys when only the transformers-5 spelling is present.

    transformers >= 5 writes `rope_parameters` and `dtype`; hub configs written earlier
    have `rope_theta` / `rope_scaling` and `torch_dtype`. Consumers read the classic keys,
    so both spellings are kept. Per-layer-type `rope_parameters` (no `rope_theta` at the top)
    are left as they are.
    """
    config = dict(hf_config)
    if "torch_dtype" not in config and "dtype" in config:
        config["torch_dtype"] = config["dtype"]
    rope = config.get("rope_parameters")
    if "rope_theta" not in config and isinstance(rope, dict) and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
        scaling = {key: value for key, value in rope.items() if key != "rope_theta"}
        config["rope_scaling"] = (
            None if scaling.get("rope_type", "default") == "default" else scaling
        )
    return config
