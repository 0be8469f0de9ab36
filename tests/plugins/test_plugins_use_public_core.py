"""Plugins reach core only through public names (DESIGN.md section 5: no private seams).

An ast scan of every plugin's source flags: importing a `_`-name from core (or a module
whose path has one), an attribute `_x` read through a name imported from core, and, in a
class deriving from a core class, defining or reaching (`self._x`, `super()._x`) a
`_`-attribute that the core base class has. Dunders are public. Instance attributes a
core `__init__` sets are invisible to the class, so they are outside this scan.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import pytest

PLUGINS = Path(__file__).parents[2] / "plugins"
Problems = list[tuple[int, str]]  # (line, what)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_core(module: str | None) -> bool:
    return module is not None and (module == "core" or module.startswith("core."))


def _core_object(module: str, name: str) -> Any:
    parent = importlib.import_module(module)
    if hasattr(parent, name):
        return getattr(parent, name)
    return importlib.import_module(f"{module}.{name}")


def _core_imports(tree: ast.Module, problems: Problems) -> dict[str, Any]:
    """Local name -> the core module or object it is bound to; private imports reported."""
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _is_core(alias.name):
                    continue
                if any(_is_private(part) for part in alias.name.split(".")):
                    problems.append((node.lineno, f"import {alias.name}"))
                local = alias.asname or alias.name.split(".")[0]
                names[local] = importlib.import_module(alias.name if alias.asname else "core")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_core(node.module):
            for alias in node.names:
                if any(_is_private(part) for part in [*node.module.split("."), alias.name]):
                    problems.append((node.lineno, f"from {node.module} import {alias.name}"))
                names[alias.asname or alias.name] = _core_object(node.module, alias.name)
    return names


def _resolve(expr: ast.expr, names: dict[str, Any]) -> Any:
    """The core object a Name / dotted Attribute chain rooted at a core import denotes."""
    if isinstance(expr, ast.Name):
        return names.get(expr.id)
    if isinstance(expr, ast.Attribute):
        owner = _resolve(expr.value, names)
        return getattr(owner, expr.attr, None) if owner is not None else None
    return None


def _root(expr: ast.expr) -> ast.expr:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr


def _core_bases(cls: ast.ClassDef, names: dict[str, Any], local: dict[str, list[type]]):
    bases: list[type] = []
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in local:
            bases += local[base.id]  # a plugin class deriving from a core class
        elif isinstance(obj := _resolve(base, names), type):
            bases.append(obj)
    return bases


def _subclass_problems(cls: ast.ClassDef, bases: list[type]) -> Problems:
    def core_has(attr: str) -> bool:
        return _is_private(attr) and any(hasattr(base, attr) for base in bases)

    problems: Problems = []
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and core_has(node.name):
            problems.append((node.lineno, f"{cls.name} overrides core's {node.name}"))
        elif isinstance(node, ast.Attribute) and core_has(node.attr):
            owner = node.value
            is_super = isinstance(owner, ast.Call) and getattr(owner.func, "id", "") == "super"
            if is_super or (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                problems.append((node.lineno, f"{cls.name} uses core's {node.attr}"))
    return problems


def private_core_uses(source: str) -> list[str]:
    """Every use of a private core name in `source`, as "line N: what"."""
    tree = ast.parse(source)
    problems: Problems = []
    names = _core_imports(tree, problems)
    local: dict[str, list[type]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            root = _root(node)
            if isinstance(root, ast.Name) and root.id in names:
                problems.append((node.lineno, f"{root.id}...{node.attr}"))
        elif isinstance(node, ast.ClassDef):
            local[node.name] = _core_bases(node, names, local)
            problems += _subclass_problems(node, local[node.name])
    return [f"line {line}: {what}" for line, what in sorted(problems)]


def plugin_sources() -> list[Path]:
    return sorted(
        path for path in PLUGINS.glob("*/**/*.py") if "build" not in path.relative_to(PLUGINS).parts
    )


@pytest.mark.parametrize("path", plugin_sources(), ids=lambda p: str(p.relative_to(PLUGINS)))
def test_plugin_uses_only_public_core_names(path):
    assert private_core_uses(path.read_text()) == []


def test_the_scan_finds_each_kind_of_private_use():
    source = """
import core.attention.backends.torch_ref as ref
from core.attention.backends.torch_ref import TorchRefImpl, _write_kv
from core.attention.paged_metadata import PagedAttentionMetadataBuilder


class Builder(PagedAttentionMetadataBuilder):
    def _decode_batch(self, common, rows, block_size):
        return super()._decode_batch(common, rows, block_size)


class Deeper(Builder):
    def _own_helper(self):  # a plugin's own private helper is fine
        return self._decode_batch(None, [], 1), self.__class__


class Impl(TorchRefImpl):
    def forward_decode(self, query, kv_cache, decode):
        return ref._gather_pages(kv_cache, decode.block_table)
"""
    assert private_core_uses(source) == [
        "line 3: from core.attention.backends.torch_ref import _write_kv",
        "line 8: Builder overrides core's _decode_batch",
        "line 9: Builder uses core's _decode_batch",
        "line 14: Deeper uses core's _decode_batch",
        "line 19: ref..._gather_pages",
    ]
