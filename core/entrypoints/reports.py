"""The text of `core plugins` and `core info`: what was discovered, chosen and why."""

from __future__ import annotations

import platform as host

from pluggy import HookCaller

import core
from core import envs, kernel_choice
from core.platforms.interface import Platform
from core.plugins.hooks import get_hook_manager
from core.plugins.registry import (
    PluginEntry,
    PluginRegistry,
    get_registry,
    plugin_distributions_without_entries,
)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    )


def _state(entry: PluginEntry) -> str:
    state = entry.state.value
    if entry.reason:
        state += f": {entry.reason}"
    if entry.warning:
        state += f" (warning: {entry.warning})"
    return state


def plugins_report(registry: PluginRegistry | None = None) -> str:
    registry = registry or get_registry()
    registry.check_all_api_versions()
    selected = _selected_components(registry)  # loads what selection needs, first
    rows = [
        [e.group, e.name, e.distribution, e.version, e.api_spec or "-", _state(e)]
        for e in registry.all_entries()
    ]
    rows += [
        ["-", "-", name, version, "-", "installed: registers no entry points yet"]
        for name, version in plugin_distributions_without_entries(registry)
    ]
    headers = ["group", "entry", "distribution", "version", "api", "state"]
    return _table(headers, rows) + "\n\n" + selected


def hooks_report(registry: PluginRegistry | None = None) -> str:
    """Every hook specification, the plugins implementing it, and its docstring's first line."""
    callers = sorted(vars(get_hook_manager(registry).hook).items())
    rows = [
        [name, _implementers(caller), _first_line(caller.spec.function.__doc__)]
        for name, caller in callers
        if caller.spec is not None  # pluggy keeps callers for unknown hooks too
    ]
    return _table(["hook", "implemented by", "description"], rows)


def _implementers(caller: HookCaller) -> str:
    return ", ".join(sorted(impl.plugin_name for impl in caller.get_hookimpls())) or "(none)"


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n", 1)[0]


def _selected_components(registry: PluginRegistry) -> str:
    from core.attention.interface import AttentionRequirements
    from core.attention.selector import select_attention_backend
    from core.platforms.selection import select_platform
    from core.sample.selector import select_sampler_class

    try:
        choice = select_platform(registry)
    except ValueError as exc:
        return f"platform: none selected ({exc})"
    platform = choice.platform
    lines = [f"platform: {choice.name} ({choice.reason})"]
    lines += [f"  rejected {name}: {why}" for name, why in choice.rejected.items()]
    req = AttentionRequirements(dtype=platform.default_dtype, head_size=64, block_size=16)
    label = f"attention backend (for {req})"
    try:
        lines.append(f"{label}: {select_attention_backend(platform, req, None, registry).name}")
    except ValueError as exc:
        lines.append(f"{label}: none ({exc})")
    try:
        lines.append(f"sampler: {select_sampler_class(platform, None, registry)[0]}")
    except ValueError as exc:
        lines.append(f"sampler: none ({exc})")
    return "\n".join(lines)


def rank_layout_lines(tp: int, pp: int, dp: int) -> list[str]:
    """The DP x PP x TP rank grid as `core info` prints it: each rank's coordinates and the
    groups of each axis (the multiprocess executor runs one process per rank of a DP
    engine)."""
    from core.distributed.parallel_state import RankGrid

    grid = RankGrid(tp, pp, dp)
    lines = [f"rank layout: DP {dp} x PP {pp} x TP {tp} = {grid.world_size} ranks"]
    for rank in range(grid.world_size):
        lines.append(f"  rank {rank}: dp {rank // (tp * pp)}, pp {rank // tp % pp}, tp {rank % tp}")
    lines += [
        f"  TP groups: {grid.tp_group_ranks()}",
        f"  PP groups: {grid.pp_group_ranks()}",
        f"  DP groups: {grid.dp_group_ranks()}",
    ]
    return lines


def info_report(registry: PluginRegistry | None = None) -> str:
    import torch

    from core.platforms.selection import select_platform

    registry = registry or get_registry()
    lines = [f"core {core.__version__} on Python {host.python_version()} ({host.machine()})"]
    try:
        choice = select_platform(registry)
    except ValueError as exc:
        return "\n".join([*lines, f"platform: none selected: {exc}"])
    lines.append(f"platform: {choice.name} ({choice.platform.device_name}) — {choice.reason}")
    lines += [f"  rejected {name}: {why}" for name, why in choice.rejected.items()]
    memory = choice.platform.memory_info()
    lines += [
        f"torch: {torch.__version__}, {torch.get_num_threads()} threads",
        f"memory: {memory.available_bytes / 2**30:.1f} GiB available "
        f"of {memory.total_bytes / 2**30:.1f} GiB",
        f"default dtype: {str(choice.platform.default_dtype).removeprefix('torch.')} "
        f"({choice.platform.default_dtype_reason})",
    ]
    lines += _kernel_op_lines(registry, choice.platform.device_type)
    lines += kernel_choice.table_lines(kernel_choice.KERNEL_CHOICES)
    lines += _batch_invariant_lines(registry)
    lines += _quantization_lines(registry, choice.platform)
    return "\n".join(lines + _moe_lines(registry, choice.platform.device_type))


def _batch_invariant_lines(registry: PluginRegistry) -> list[str]:
    """Whether engines started here run in batch-invariant mode (core.batch_invariant),
    and the kernels and attention backends that serve it: an engine in the mode runs no
    others."""
    env = envs.BATCH_INVARIANT_ENV
    state = (
        f"on for engines started here ({env}=1), unless one says LLM(batch_invariant=False)"
        if envs.batch_invariant()
        else "off for engines started here; --batch-invariant (LLM(batch_invariant=True)) "
        f"turns it on per engine, {env}=1 for every engine"
    )
    lines = [f"batch-invariant mode: {state}"]
    lines += kernel_choice.invariant_lines(kernel_choice.KERNEL_CHOICES)
    serving, others = _invariant_attention_backends(registry)
    return [
        *lines,
        f"  attention backends that serve it: {', '.join(serving) or 'none'}",
        f"  attention backends that do not: {', '.join(others) or 'none'}",
    ]


def _invariant_attention_backends(registry: PluginRegistry) -> tuple[list[str], list[str]]:
    """The installed attention backends (each family's MLA backend too) whose capabilities
    declare `batch_invariant`, and the others."""
    from core.attention.interface import AttentionBackend
    from core.plugins.groups import ATTENTION_BACKENDS

    serving: list[str] = []
    others: list[str] = []
    for entry in registry.entries(ATTENTION_BACKENDS):
        try:
            backend = registry.require(ATTENTION_BACKENDS, entry.name, AttentionBackend)
        except ValueError:
            continue  # plugins_report says why
        for member in (backend, backend.mla_backend):
            if member is not None:
                (serving if member.capabilities.batch_invariant else others).append(member.name)
    return sorted(serving), sorted(others)


def _moe_lines(registry: PluginRegistry, device_type: str) -> list[str]:
    """The installed mixture-of-experts architectures, who runs their experts here, and
    how they split over ranks."""
    from torch import nn

    from core.ops import REFERENCE, provider
    from core.plugins.groups import MODELS

    names = []
    for entry in registry.entries(MODELS):
        try:
            cls = registry.require(MODELS, entry.name, nn.Module)
        except ValueError:
            continue  # plugins_report says why
        if getattr(cls, "expert_params", ()):
            names.append(entry.name)
    return [
        "mixtures of experts:",
        f"  architectures: {', '.join(sorted(names)) or 'none installed'}",
        f"  experts via core::fused_moe on {device_type}: "
        f"{provider('fused_moe', device_type) or REFERENCE}",
        "  layouts: tensor parallel (each expert split), --enable-expert-parallel (whole "
        "experts per tensor-parallel rank, or per rank of every data-parallel engine, "
        "all-to-all, the engines in lock-step) with --enable-eplb",
    ]


def _quantization_lines(registry: PluginRegistry, platform: Platform) -> list[str]:
    """Each installed quantization method: where it comes from, whether this platform runs
    it, which layers it keeps quantized and which kernel multiplies them (and why not)."""
    from core.ops import REFERENCE, provider
    from core.plugins.groups import QUANTIZATION
    from core.quantization.interface import QuantizationConfig
    from core.quantization.selector import PROVIDERS

    lines = ["quantization methods (--quantization):"]
    installed = {entry.name: entry for entry in registry.entries(QUANTIZATION)}
    for name, entry in sorted(installed.items()):
        origin = f"{entry.distribution} {entry.version}"
        try:
            cls = registry.require(QUANTIZATION, name, QuantizationConfig)
        except ValueError as exc:
            lines.append(f"  {name} ({origin}): cannot be used: {exc}")
            continue
        supported = name in platform.supported_quantization
        where = f"runs on {platform.name}" if supported else f"not supported on {platform.name}"
        keeps = "linear layers"
        if cls.get_embedding_method is not QuantizationConfig.get_embedding_method:
            keeps += ", embeddings and LM head"
        lines.append(f"  {name} ({origin}): {where}; keeps {keeps} quantized")
    lines += [f"  {name}: not installed (pip install {dist})" for name, dist in
              sorted(PROVIDERS.items()) if name not in installed]  # fmt: skip
    kernel = provider("quant_linear", platform.device_type) or (
        f"{REFERENCE} (dequantize, then torch matmul): no kernel registered for "
        f"{platform.device_type}"
        + (" — pip install core-cpu-kernels" if platform.device_type == "cpu" else "")
    )
    lines.append(
        "  packed 4/8-bit weights (awq on cpu, gguf, gptq, compressed-tensors W4A16 / W8A16) "
        "multiply via core::quant_linear: " + kernel
    )
    return lines


def _kernel_op_lines(registry: PluginRegistry, device_type: str) -> list[str]:
    """Which provider's kernel serves each core op on `device_type` tensors."""
    from core.ops import REFERENCE, providers

    registry.run_general_plugins()  # where plugins register their kernels
    from core.models import layer_stack

    served = sorted(
        (op, by_device.get(device_type, REFERENCE)) for op, by_device in providers().items()
    )
    stacks = ", ".join(layer_stack.providers()) or "none: each layer's ops run in turn"
    return [
        f"kernel ops on {device_type}:",
        *(f"  core::{op}: {who}" for op, who in served),
        f"layer stacks (plain decoder layers in one call, where a provider's kernels serve the "
        f"step): {stacks}",
    ]
