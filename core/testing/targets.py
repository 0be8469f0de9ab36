"""What `--core-conformance=KIND:NAME` names: a kind of component and one installed value.

Import-light at module level (the pytest plugin parses options before anything heavy is
needed); `resolve` imports the component.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

KINDS: dict[str, tuple[str | None, str | None]] = {
    "platform": ("core.platforms", None),
    "attention": ("core.attention_backends", "core.attention.interface:AttentionBackend"),
    "sampler": ("core.samplers", "core.sample.interface:Sampler"),
    "quantization": ("core.quantization", "core.quantization.interface:QuantizationConfig"),
    "kv_connector": ("core.kv_connectors", "core.kv_transfer.interface:KVConnector"),
    "model": ("core.models", "torch.nn:Module"),
    "spec_proposer": ("core.spec_proposers", "core.spec_decode.interface:Proposer"),
    "lora": ("core.lora", "core.lora.interface:LoRAManager"),
    "io_processor": ("core.io_processors", "core.io_processors.interface:IOProcessor"),
    "logits_processor": (
        "core.logits_processors",
        "core.sample.logits_processor:LogitsProcessor",
    ),
    # A general plugin's registration callable: the kit checks the kernels it registers.
    "kernels": ("core.general", None),
    # Core's own, behind an ABC so a platform can bring a fused kernel: no plugin group.
    "rejection_sampler": (None, "core.spec_decode.interface:RejectionSampler"),
}
"""kind -> (entry-point group, None for a kind named only by reference; base class the
value must subclass, None: any callable)."""


@dataclass(frozen=True)
class TargetSpec:
    """One `KIND:NAME` of the command line, parsed but not loaded."""

    kind: str
    name: str  # an entry name, or "module.path:Attr"

    @property
    def is_reference(self) -> bool:
        """Whether `name` is an object reference rather than an entry name."""
        return ":" in self.name

    @property
    def id(self) -> str:
        """The name test ids carry: the entry name, or the reference's attribute."""
        return self.name.rpartition(":")[2] if self.is_reference else self.name


@dataclass(frozen=True)
class Target:
    """A component under test: its spec and the loaded value (class or probe)."""

    spec: TargetSpec
    value: Any

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def id(self) -> str:
        return self.spec.id


def parse_targets(options: list[str]) -> list[TargetSpec]:
    """Specs of every `KIND:NAME` in `options` (each repeatable or comma-separated).

    Raises ValueError naming the bad item and the known kinds.
    """
    specs: list[TargetSpec] = []
    for option in options:
        for item in filter(None, (part.strip() for part in option.split(","))):
            kind, sep, name = item.partition(":")
            if not sep or not name:
                raise ValueError(f"--core-conformance {item!r}: expected KIND:NAME")
            if kind not in KINDS:
                raise ValueError(
                    f"--core-conformance {item!r}: unknown kind {kind!r}; kinds: {', '.join(KINDS)}"
                )
            spec = TargetSpec(kind, name)
            if KINDS[kind][0] is None and not spec.is_reference:
                raise ValueError(
                    f"--core-conformance {item!r}: {kind} components have no entry-point "
                    "group; name one as module.path:Attr"
                )
            if spec not in specs:
                specs.append(spec)
    return specs


def resolve(spec: TargetSpec) -> Target:
    """Load the component `spec` names and check its shape.

    Raises ValueError (core.plugins.PluginLookupError for an entry name) saying why it
    cannot be had: not installed, not loadable, or not of the kind's type.
    """
    from core.plugins import get_registry
    from core.plugins.registry import shape_error

    group, base_path = KINDS[spec.kind]
    base = _import_object(base_path) if base_path else None
    if not spec.is_reference:
        return Target(spec, get_registry().require(group, spec.name, base))
    try:
        value = _import_object(spec.name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{spec.kind} {spec.name!r} cannot be imported: {exc}") from exc
    wrong = shape_error(value, base)
    if wrong is not None:
        raise ValueError(f"{spec.kind} {spec.name!r}: {wrong}")
    return Target(spec, value)


def _import_object(reference: str) -> Any:
    """The object `module.path:Attr.sub` names."""
    module_name, _, attributes = reference.partition(":")
    value = importlib.import_module(module_name)
    for attribute in attributes.split("."):
        value = getattr(value, attribute)
    return value
