"""PEFT LoRA adapters: which layer of the model each adapter module lands on, and reading one.

A PEFT adapter is a directory with adapter_config.json (r, lora_alpha, use_rslora,
target_modules, rank_pattern / alpha_pattern...) and adapter_model.safetensors, whose
tensors are named "base_model.model.<module>.lora_A.weight" ([r, in]) and
"...lora_B.weight" ([out, r]), <module> being the checkpoint's name for a linear layer
("model.layers.0.self_attn.q_proj"). The model fuses some of those into one layer
("qkv_proj"), so `lora_targets` maps every checkpoint module name to a layer and a shard
of its output. `check_adapter` validates an adapter against those targets from the
config and the safetensors header alone (the frontend runs it on a meta-device model);
`load_adapter` runs the same checks, then reads the tensors.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex
import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from core.config import LoRAConfig
from core.input_checks import parse_json_text
from core.lora.request import LoRARequest
from core.models.hf_weights import StackedParam
from core.models.layers.linear import LinearBase

__all__ = [
    "LoRAAdapter",
    "LoRATarget",
    "LoRAWeights",
    "check_adapter",
    "load_adapter",
    "lora_targets",
]

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

# adapter_config.json is read before anything else is checked: a real one is a few KiB
# (rank_pattern for every module of a large model stays under 100 KiB).
MAX_CONFIG_BYTES = 1024 * 1024
# Wall time for matching every module against rank_pattern / alpha_pattern keys (PEFT
# regexes, which a client may choose): catastrophic backtracking ends here, not after minutes.
PATTERN_MATCH_SECONDS = 1.0

_TENSOR_NAME = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<factor>[AB])\.weight")

# adapter_config.json fields that change what the adapter computes; the layers add
# x A^T B^T * scaling and nothing else, so an adapter using any of them is refused.
# Each must be absent or falsy (False, None, [], {}); "bias" is checked on its own.
_UNSUPPORTED_FIELDS = (
    "use_dora",
    "use_qalora",
    "lora_bias",
    "fan_in_fan_out",
    "modules_to_save",
    "layer_replication",
    "trainable_token_indices",
    "target_parameters",
    "alora_invocation_tokens",
    "use_bdlora",
    "arrow_config",
    "kasa_config",
    "monteclora_config",
)


@dataclass(frozen=True)
class LoRATarget:
    """The output shard `shard` of the model's linear layer `layer`, which one checkpoint
    module's LoRA A [r, input_size] and B [output_size, r] apply to."""

    layer: str  # the LinearBase module's name in the model, e.g. "model.layers.0.mlp.down_proj"
    shard: int  # index into that layer's partition.output_sizes
    input_size: int
    output_size: int


@dataclass
class LoRAWeights:
    """One module's low-rank update: y += x @ a.T @ b.T."""

    a: torch.Tensor  # [r, input_size]
    b: torch.Tensor  # [output_size, r], already multiplied by the module's scaling


@dataclass
class LoRAAdapter:
    """A loaded adapter, on the CPU, in the dtype it was loaded for."""

    request: LoRARequest
    rank: int  # the largest r among its modules
    weights: dict[str, dict[int, LoRAWeights]]  # layer name -> shard index -> weights


@dataclass(frozen=True)
class _ModulePlan:
    """One checkpoint module of an adapter, checked: its tensors, target and scaling."""

    a_name: str
    b_name: str
    target: LoRATarget
    rank: int
    scaling: float


def lora_targets(model: nn.Module) -> dict[str, LoRATarget]:
    """Every linear layer of `model` an adapter can target, keyed by the checkpoint (PEFT)
    module name, e.g. "model.layers.0.self_attn.q_proj".

    A fused layer (its last name component is a `fused_module` of
    `type(model).stacked_params`) gives one entry per shard, named by the shard's
    `hf_module`; any other LinearBase with a single output gives one entry under its own
    name. A fused layer the model does not describe in `stacked_params` gets none: which
    checkpoint modules it holds is unknown.
    """
    stacked = getattr(type(model), "stacked_params", ())
    targets: dict[str, LoRATarget] = {}
    for name, module in model.named_modules():
        if isinstance(module, LinearBase):
            targets.update(_layer_targets(name, module, stacked))
    return targets


def check_adapter(request: LoRARequest, targets: dict[str, LoRATarget], config: LoRAConfig) -> None:
    """Raise ValueError when `request`'s adapter cannot run on the layers `targets`
    describes (see `lora_targets`) under `config`. The message starts with
    "LoRA adapter '<lora_name>': " and names the field, file or tensor at fault.

    Reads adapter_config.json and the safetensors header (names and shapes), never tensor
    data, so it is cheap and works for a model built on the meta device.
    """
    _plan(request, targets, config)


def load_adapter(
    request: LoRARequest, targets: dict[str, LoRATarget], config: LoRAConfig, dtype: torch.dtype
) -> LoRAAdapter:
    """The adapter of `request` read onto the CPU in `dtype`, each B multiplied by its
    module's scaling (lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora, r and
    lora_alpha per module after rank_pattern / alpha_pattern). ValueError as
    `check_adapter`, which it runs first."""
    plans = _plan(request, targets, config)
    weights: dict[str, dict[int, LoRAWeights]] = {}
    with safe_open(Path(request.lora_path) / WEIGHTS_FILE, framework="pt", device="cpu") as f:
        for plan in plans:
            a = f.get_tensor(plan.a_name).to(dtype)  # [r, input_size]
            # Scale in float32 so that a low-precision dtype rounds once, not twice.
            b = (f.get_tensor(plan.b_name).float() * plan.scaling).to(dtype)  # [out, r]
            _check_finite(request, plan.a_name, a, "")
            _check_finite(request, plan.b_name, b, f" once scaled by {plan.scaling:g}")
            weights.setdefault(plan.target.layer, {})[plan.target.shard] = LoRAWeights(a, b)
    return LoRAAdapter(request, max(plan.rank for plan in plans), weights)


def _check_finite(request: LoRARequest, name: str, tensor: torch.Tensor, how: str) -> None:
    """Refuse a tensor with inf or NaN (as stored, or overflowing the model's dtype once
    scaled): the layers keep a row's delta out of other slots' rows only while every slot's
    B is finite (0 x inf is NaN)."""
    if not torch.isfinite(tensor).all():
        raise _error(request, f"tensor {name!r} has non-finite values{how} in {tensor.dtype}")


def _layer_targets(
    name: str, layer: LinearBase, stacked: Sequence[StackedParam]
) -> dict[str, LoRATarget]:
    """The targets of the layer `name`: one per shard `stacked` names for a fused layer,
    its own name for a single-output one."""
    parent, _, last = name.rpartition(".")
    shards = [entry for entry in stacked if entry.fused_module == last]
    if not shards:
        return {name: _target(name, layer, 0)} if len(layer.partition.output_sizes) == 1 else {}
    prefix = f"{parent}." if parent else ""
    return {
        prefix + entry.hf_module: _target(name, layer, layer.shard_index(entry.shard_id))
        for entry in shards
    }


def _target(name: str, layer: LinearBase, shard: int) -> LoRATarget:
    size = layer.checkpoint_output_sizes[shard]
    return LoRATarget(name, shard, layer.partition.input_size, size)


def _plan(
    request: LoRARequest, targets: dict[str, LoRATarget], config: LoRAConfig
) -> list[_ModulePlan]:
    """Every check of `check_adapter`; the checked modules, ready to read."""
    adapter_config = _read_config(request)
    _check_features(request, adapter_config)
    _check_target_modules(request, adapter_config.get("target_modules"), targets)
    modules = _pair_tensors(request, _read_shapes(request))
    deadline = time.monotonic() + PATTERN_MATCH_SECONDS
    return [
        _plan_module(request, adapter_config, config, targets, module, tensors, deadline)
        for module, tensors in sorted(modules.items())
    ]


def _error(request: LoRARequest, message: str) -> ValueError:
    return ValueError(f"LoRA adapter '{request.lora_name}': {message}")


def _read_config(request: LoRARequest) -> dict[str, Any]:
    """adapter_config.json, once the adapter directory has both files; at most
    MAX_CONFIG_BYTES, nested at most MAX_JSON_DEPTH levels."""
    directory = Path(request.lora_path)
    try:
        if not directory.is_dir():
            raise _error(request, f"lora_path {_shown(request.lora_path)} is not a directory")
        for file in (CONFIG_FILE, WEIGHTS_FILE):
            if not (directory / file).is_file():
                raise _error(request, f"lora_path {_shown(request.lora_path)} has no {file}")
        size = (directory / CONFIG_FILE).stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise _error(request, f"{CONFIG_FILE} is {size} bytes, over {MAX_CONFIG_BYTES}")
        text = (directory / CONFIG_FILE).read_bytes().decode()
    except (OSError, UnicodeDecodeError) as exc:  # a name too long, unreadable, not UTF-8
        message = f"lora_path {_shown(request.lora_path)} cannot be read: {exc}"
        raise _error(request, message) from exc
    try:
        adapter_config = parse_json_text(text, CONFIG_FILE)
    except ValueError as exc:
        raise _error(request, f"{CONFIG_FILE} cannot be read: {exc}") from exc
    if not isinstance(adapter_config, dict):
        raise _error(request, f"{CONFIG_FILE} must hold a JSON object")
    return adapter_config


def _shown(path: str) -> str:
    """`path` quoted for a message, cut short when it is long."""
    return repr(path) if len(path) <= 200 else f"{path[:200]!r}... ({len(path)} characters)"


def _check_features(request: LoRARequest, adapter_config: dict[str, Any]) -> None:
    """Refuse an adapter that is not plain LoRA (another PEFT method, or a LoRA variant)."""
    peft_type = adapter_config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise _error(request, f"peft_type {peft_type!r} is not supported, only 'LORA'")
    bias = adapter_config.get("bias", "none")
    if bias != "none":
        raise _error(request, f"bias {bias!r} is not supported, only 'none'")
    for field in _UNSUPPORTED_FIELDS:
        if adapter_config.get(field):
            value = adapter_config[field]
            raise _error(request, f"{field} {value!r} is not supported")


def _check_target_modules(
    request: LoRARequest, target_modules: Any, targets: dict[str, LoRATarget]
) -> None:
    """Each name in a target_modules list must match (as PEFT matches it: the whole module
    name or its dotted suffix) a module the model has a LoRA layer for. A regex string
    (PEFT full-matches it) is left to the tensor checks: they see what it selected."""
    if not isinstance(target_modules, list):
        return
    for name in target_modules:
        if not isinstance(name, str) or not any(
            key == name or key.endswith(f".{name}") for key in targets
        ):
            supported = sorted({key.rpartition(".")[2] for key in targets})
            raise _error(
                request,
                f"target_modules names {name!r}, which has no LoRA layer in this model; "
                f"supported: {supported}",
            )


def _read_shapes(request: LoRARequest) -> dict[str, list[int]]:
    """Tensor name -> shape, from the safetensors header only."""
    path = Path(request.lora_path) / WEIGHTS_FILE
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            return {name: f.get_slice(name).get_shape() for name in f.keys()}
    except (OSError, SafetensorError) as exc:
        raise _error(request, f"{WEIGHTS_FILE} cannot be read: {exc}") from exc


def _pair_tensors(
    request: LoRARequest, shapes: dict[str, list[int]]
) -> dict[str, dict[str, tuple[str, list[int]]]]:
    """Checkpoint module -> {"A": (tensor name, shape), "B": ...}, each module with both."""
    modules: dict[str, dict[str, tuple[str, list[int]]]] = {}
    for name, shape in shapes.items():
        if "lora_embedding_" in name:
            raise _error(request, f"tensor {name!r}: embedding LoRA is not supported")
        match = _TENSOR_NAME.fullmatch(name)
        if match is None:
            raise _error(
                request,
                f"tensor {name!r} is not a LoRA weight "
                "('base_model.model.<module>.lora_A.weight' or '...lora_B.weight')",
            )
        modules.setdefault(match["module"], {})[match["factor"]] = (name, shape)
    if not modules:
        raise _error(request, f"{WEIGHTS_FILE} holds no LoRA weights")
    for tensors in modules.values():
        if len(tensors) == 1:
            ((factor, (name, _)),) = tensors.items()
            other = "B" if factor == "A" else "A"
            raise _error(request, f"tensor {name!r} has no lora_{other} beside it")
    return modules


def _plan_module(
    request: LoRARequest,
    adapter_config: dict[str, Any],
    config: LoRAConfig,
    targets: dict[str, LoRATarget],
    module: str,
    tensors: dict[str, tuple[str, list[int]]],
    deadline: float,
) -> _ModulePlan:
    """Check one module's A and B against its target, the adapter's r and the limit;
    pattern keys are matched before `deadline` (time.monotonic) or refused."""
    a_name, b_name = tensors["A"][0], tensors["B"][0]
    target = targets.get(module)
    if target is None:
        raise _error(request, f"tensor {a_name!r}: the model has no LoRA layer for {module!r}")
    rank = _module_rank(request, target, tensors["A"], tensors["B"])
    r, alpha = _module_rank_alpha(request, adapter_config, module, deadline)
    if rank != r:
        raise _error(
            request, f"r: tensor {a_name!r} has rank {rank}, {CONFIG_FILE} gives {module} r={r}"
        )
    if rank > config.max_lora_rank:
        raise _error(
            request, f"r {rank} of {module} is above --max-lora-rank {config.max_lora_rank}"
        )
    scaling = alpha / math.sqrt(rank) if adapter_config.get("use_rslora") else alpha / rank
    return _ModulePlan(a_name, b_name, target, rank, scaling)


def _module_rank(
    request: LoRARequest, target: LoRATarget, a: tuple[str, list[int]], b: tuple[str, list[int]]
) -> int:
    """r of a module whose A (name, shape) is [r, input_size] and B [output_size, r]."""
    (a_name, a_shape), (b_name, b_shape) = a, b
    if len(a_shape) != 2 or a_shape[1] != target.input_size:
        raise _error(
            request,
            f"tensor {a_name!r} has shape {a_shape}, the model needs [r, {target.input_size}]",
        )
    rank = a_shape[0]
    if b_shape != [target.output_size, rank]:
        raise _error(
            request,
            f"tensor {b_name!r} has shape {b_shape}, the model needs "
            f"[{target.output_size}, {rank}] (its lora_A has shape {a_shape})",
        )
    return rank


def _module_rank_alpha(
    request: LoRARequest, adapter_config: dict[str, Any], module: str, deadline: float
) -> tuple[int, float]:
    """(r, lora_alpha) of `module`: rank_pattern / alpha_pattern, else r / lora_alpha."""
    values = []
    for field, pattern_field in (("r", "rank_pattern"), ("lora_alpha", "alpha_pattern")):
        if field not in adapter_config:
            raise _error(request, f"{field} is missing from {CONFIG_FILE}")
        patterns = adapter_config.get(pattern_field) or {}
        key = _pattern_key(request, pattern_field, patterns, module, deadline)
        value = patterns[key] if key is not None else adapter_config[field]
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise _error(request, f"{field if key is None else pattern_field} gives {value!r}")
        values.append(value)
    return values[0], values[1]


def _pattern_key(
    request: LoRARequest, pattern_field: str, patterns: Any, module: str, deadline: float
) -> str | None:
    """The first key of `patterns` that matches `module` as PEFT's `get_pattern_key` does
    (the key, a regex, matches the whole name or a suffix after a dot), or None. Matched
    with `regex`, whose matching stops at a timeout (`re` cannot be stopped)."""
    if not isinstance(patterns, dict):
        raise _error(request, f"{pattern_field} must be a JSON object, got {patterns!r}")
    for key in patterns:
        try:
            timeout = max(deadline - time.monotonic(), 0.0)
            if regex.match(rf"(.*\.)?({key})$", module, timeout=timeout):
                return key
        except regex.error as exc:
            raise _error(request, f"{pattern_field} key {key!r} is not a regex: {exc}") from exc
        except TimeoutError:
            raise _error(
                request,
                f"{pattern_field} keys take over {PATTERN_MATCH_SECONDS} s to match the "
                f"model's modules (key {key[:100]!r})",
            ) from None
    return None
