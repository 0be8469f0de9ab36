"""Discovery, filtering, version checks and lazy loading of entry points.

Every component — core's own defaults included — is found here through the entry-point
groups of `core.plugins.groups`, so first- and third-party code take the same path.
Nothing is imported until a value is needed (`PluginRegistry.load`), and a plugin that
fails to import, probe or register is recorded with its reason and skipped: a broken
plugin never stops the engine.
"""

from __future__ import annotations

import enum
import importlib
import importlib.metadata as metadata
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from core import envs
from core.plugins.groups import ALL_GROUPS, ENDPOINTS, GENERAL, NOUNS

logger = logging.getLogger(__name__)

PLUGIN_API_VERSION = "1.0"
"""The plugin contract core implements; plugins declare `CORE_PLUGIN_API` against it."""

CORE_DISTRIBUTION = "core"


class EntryState(str, enum.Enum):
    AVAILABLE = "available"  # admitted, not loaded yet
    LOADED = "loaded"
    FAILED = "failed"
    FILTERED = "filtered"  # excluded by CORE_PLUGINS or the endpoint allowlist
    REFUSED = "refused"  # incompatible CORE_PLUGIN_API


@dataclass
class PluginEntry:
    """One entry point of one distribution, and what became of it."""

    group: str
    name: str
    distribution: str
    version: str
    entry_point: metadata.EntryPoint
    state: EntryState = EntryState.AVAILABLE
    reason: str | None = None
    api_spec: str | None = None
    warning: str | None = None
    value: Any = field(default=None, repr=False)

    @property
    def is_core(self) -> bool:
        return canonical_name(self.distribution) == CORE_DISTRIBUTION

    @property
    def top_level_package(self) -> str:
        return self.entry_point.module.split(".")[0]


class PluginLookupError(ValueError):
    """A named component cannot be had: not installed, not loadable, or the wrong type.

    The message names the group's noun and the entry ("sampler 'x' is not installed;
    installed: ..."). `reason` is the short cause a selector reports beside other
    candidates ("not installed", "failed: ..."); `entry` is None when nothing is installed
    under that name.
    """

    def __init__(self, message: str, reason: str, entry: PluginEntry | None) -> None:
        super().__init__(message)
        self.reason = reason
        self.entry = entry


def canonical_name(distribution: str) -> str:
    """PEP 503 normalisation, so `core_cuda`, `Core-CUDA` and `core-cuda` are one name."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


class PluginRegistry:
    """The entry points of this process, admitted or filtered, loaded on demand.

    `allowlist` follows CORE_PLUGINS: None admits every plugin distribution except
    endpoint plugins; a list admits only the named distributions (endpoint plugins
    included). Core's own entry points are always admitted.
    """

    def __init__(
        self,
        entry_points: Iterable[metadata.EntryPoint],
        allowlist: list[str] | None,
    ) -> None:
        self._allowlist = None if allowlist is None else {canonical_name(n) for n in allowlist}
        self._entries: dict[str, dict[str, PluginEntry]] = {group: {} for group in ALL_GROUPS}
        self._duplicates: list[PluginEntry] = []
        self._api_checks: dict[str, _ApiVerdict] = {}
        self._general_loaded = False
        for entry_point in entry_points:
            self._add(entry_point)

    @classmethod
    def from_environment(cls) -> PluginRegistry:
        points = [ep for group in ALL_GROUPS for ep in metadata.entry_points(group=group)]
        return cls(points, envs.plugins_allowlist())

    # -- discovery -----------------------------------------------------------------------

    def _add(self, entry_point: metadata.EntryPoint) -> None:
        dist = entry_point.dist
        entry = PluginEntry(
            group=entry_point.group,
            name=entry_point.name,
            distribution=dist.metadata["Name"] if dist else "unknown",
            version=dist.version if dist else "unknown",
            entry_point=entry_point,
        )
        group = self._entries[entry.group]
        existing = group.get(entry.name)
        if existing is not None:
            if existing.distribution == entry.distribution:
                return  # the same distribution seen twice on sys.path
            # Core's own entries win a name clash; otherwise the first one found does.
            if entry.is_core and not existing.is_core:
                group[entry.name], entry, existing = entry, existing, entry
            entry.state = EntryState.FAILED
            entry.reason = f"entry name already registered by {existing.distribution}"
            logger.warning(
                "plugin %s (%s, %s) skipped: %s",
                entry.name,
                entry.distribution,
                entry.group,
                entry.reason,
            )
            self._duplicates.append(entry)
            return
        filtered = self._filter_reason(entry)
        if filtered is not None:
            entry.state, entry.reason = EntryState.FILTERED, filtered
        group[entry.name] = entry

    def _filter_reason(self, entry: PluginEntry) -> str | None:
        if entry.is_core:
            return None
        if self._allowlist is None:
            if entry.group == ENDPOINTS:
                return "endpoint plugins load only when CORE_PLUGINS names their distribution"
            return None
        if canonical_name(entry.distribution) not in self._allowlist:
            return f"{entry.distribution} is not in CORE_PLUGINS"
        return None

    # -- queries -------------------------------------------------------------------------

    def entries(self, group: str) -> list[PluginEntry]:
        """Every entry of `group`, whatever its state."""
        return list(self._entries[group].values())

    def all_entries(self) -> list[PluginEntry]:
        return [e for g in ALL_GROUPS for e in self._entries[g].values()] + self._duplicates

    def admitted(self, group: str) -> list[PluginEntry]:
        """Entries of `group` that may be loaded (not filtered, refused or failed)."""
        ok = (EntryState.AVAILABLE, EntryState.LOADED)
        return [e for e in self._entries[group].values() if e.state in ok]

    def get(self, group: str, name: str) -> PluginEntry | None:
        return self._entries[group].get(name)

    def describe_installed(self, group: str) -> str:
        """The entry names of `group`, each one that cannot be loaded with its state and why."""
        entries = sorted(self._entries[group].values(), key=lambda e: e.name)
        ok = (EntryState.AVAILABLE, EntryState.LOADED)
        names = [e.name if e.state in ok else f"{e.name} ({_state_reason(e)})" for e in entries]
        return ", ".join(names) or "none"

    def require(self, group: str, name: str, base: type | None = None) -> Any:
        """The value of entry `name` of `group`, loaded on first use and checked for shape.

        With `base` the value must be a subclass of it, otherwise callable; a value of the
        wrong shape marks the entry failed. Raises PluginLookupError saying why the value
        cannot be had: not installed (listing what is), filtered, refused, failed, or the
        wrong shape.
        """
        noun = NOUNS[group]
        entry = self.get(group, name)
        if entry is None:
            installed = self.describe_installed(group)
            message = f"{noun} {name!r} is not installed; installed: {installed}"
            raise PluginLookupError(message, "not installed", None)
        value = self.load(entry)
        if value is not None and (wrong := shape_error(value, base)) is not None:
            self.mark_failed(entry, wrong)
        if entry.state is not EntryState.LOADED:
            reason = _state_reason(entry)
            raise PluginLookupError(f"{noun} {name!r} cannot be used: {reason}", reason, entry)
        return entry.value

    # -- loading -------------------------------------------------------------------------

    def load(self, entry: PluginEntry) -> Any | None:
        """The entry's value, importing it on first use; None when it cannot be had."""
        if entry.state is EntryState.LOADED:
            return entry.value
        if entry.state is not EntryState.AVAILABLE:
            return None
        if not entry.is_core and not self._check_api(entry):
            return None
        try:
            entry.value = entry.entry_point.load()
        except Exception as exc:  # a plugin's import error must never stop the engine
            self.mark_failed(entry, f"import failed: {type(exc).__name__}: {exc}")
            return None
        entry.state = EntryState.LOADED
        return entry.value

    def use_each(self, group: str, use: Callable[[PluginEntry, Any], None], action: str) -> None:
        """Load every admitted entry of `group` and hand it to `use(entry, value)`.

        For groups where every entry takes part (registrars, routers, hook modules, general
        callables): an entry that fails to load, or whose `use` raises, is marked failed
        ("`action` raised ...") and skipped, so a broken plugin never stops core.
        """
        for entry in self.admitted(group):
            value = self.load(entry)
            if value is None:
                continue
            try:
                use(entry, value)
            except Exception as exc:
                self.mark_failed(entry, f"{action} raised {type(exc).__name__}: {exc}")

    def mark_failed(self, entry: PluginEntry, reason: str) -> None:
        """Record that `entry` failed (to import, probe or register) and log why."""
        entry.state, entry.reason, entry.value = EntryState.FAILED, reason, None
        logger.warning(
            "plugin %s from distribution %s (group %s) failed: %s",
            entry.name,
            entry.distribution,
            entry.group,
            reason,
        )

    def check_all_api_versions(self) -> None:
        """Run the version check for every admitted entry (used by `core plugins`)."""
        for group in ALL_GROUPS:
            for entry in self.admitted(group):
                if not entry.is_core:
                    self._check_api(entry)

    def _check_api(self, entry: PluginEntry) -> bool:
        """Apply the distribution's CORE_PLUGIN_API to `entry`; False when not loadable.

        The top-level package is imported for this (plugins keep it import-light); the
        verdict is cached per distribution.
        """
        key = canonical_name(entry.distribution)
        if key not in self._api_checks:
            self._api_checks[key] = _api_verdict(entry)
        verdict = self._api_checks[key]
        entry.api_spec = verdict.spec
        if verdict.state is None:
            if verdict.spec is None:
                entry.warning = "declares no CORE_PLUGIN_API; loaded without a version check"
            return True
        if verdict.state is EntryState.REFUSED:
            entry.state, entry.reason = EntryState.REFUSED, verdict.reason
            logger.warning(
                "plugin %s (%s) refused: %s", entry.name, entry.distribution, verdict.reason
            )
        else:
            self.mark_failed(entry, str(verdict.reason))
        return False

    # -- general plugins -----------------------------------------------------------------

    def run_general_plugins(self) -> None:
        """Call every `core.general` entry once for this registry (re-entrant callables)."""
        if self._general_loaded:
            return
        # Set before running: a failing plugin is reported once, not retried forever.
        self._general_loaded = True
        self.use_each(GENERAL, lambda _, func: func(), "the callable")


def shape_error(value: Any, base: type | None) -> str | None:
    """Why `value` is not a subclass of `base` (or, with no base, not callable); else None."""
    if base is None:
        if callable(value):
            return None
        wanted = "callable"
    elif isinstance(value, type) and issubclass(value, base):
        return None
    else:
        wanted = f"a subclass of {base.__name__}"
    name = getattr(value, "__qualname__", None) or f"a value of type {type(value).__name__}"
    return f"{name} is not {wanted}"


def _state_reason(entry: PluginEntry) -> str:
    return f"{entry.state.value}: {entry.reason}"


@dataclass(frozen=True)
class _ApiVerdict:
    """A distribution's declared CORE_PLUGIN_API and, when it cannot load, why."""

    spec: str | None
    state: EntryState | None = None  # REFUSED or FAILED; None when loadable
    reason: str | None = None


def _api_verdict(entry: PluginEntry) -> _ApiVerdict:
    try:
        package = importlib.import_module(entry.top_level_package)
    except Exception as exc:
        return _ApiVerdict(None, EntryState.FAILED, f"import failed: {type(exc).__name__}: {exc}")
    spec = getattr(package, "CORE_PLUGIN_API", None)
    if spec is None:
        logger.warning("plugin distribution %s declares no CORE_PLUGIN_API", entry.distribution)
        return _ApiVerdict(None)
    try:
        accepted = SpecifierSet(spec).contains(PLUGIN_API_VERSION, prereleases=True)
    except InvalidSpecifier:
        return _ApiVerdict(spec, EntryState.FAILED, f"invalid CORE_PLUGIN_API {spec!r}")
    if accepted:
        return _ApiVerdict(spec)
    reason = f"requires core plugin API {spec}, core provides {PLUGIN_API_VERSION}"
    return _ApiVerdict(spec, EntryState.REFUSED, reason)


def plugin_distributions_without_entries(registry: PluginRegistry) -> list[tuple[str, str]]:
    """(name, version) of installed distributions that depend on core but register nothing.

    `core plugins` lists them so an installed plugin is never invisible.
    """
    with_entries = {canonical_name(e.distribution) for e in registry.all_entries()}
    found: dict[str, tuple[str, str]] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name or canonical_name(name) in with_entries | {CORE_DISTRIBUTION}:
            continue
        if any(_requirement_name(req) == CORE_DISTRIBUTION for req in dist.requires or ()):
            found[canonical_name(name)] = (name, dist.version)
    return sorted(found.values())


def _requirement_name(requirement: str) -> str:
    return canonical_name(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0])


_registry: PluginRegistry | None = None


def get_registry() -> PluginRegistry:
    """This process's registry, discovered once (loading is idempotent per process)."""
    global _registry
    if _registry is None:
        _registry = PluginRegistry.from_environment()
    return _registry
