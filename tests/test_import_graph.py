"""Core's import graph: no cycle between its modules or between its top-level packages, and
the scheduler reaches the worker only through the scheduler-worker contract.

Imports are read with ast, not by importing: those under `if TYPE_CHECKING:` are left out
(they never run), function-local ones are kept (they still tie the modules together). An
import of `a.b.name` counts as an import of module `a.b.name` when that module exists, else
of `a.b`. A package node is a top-level subpackage or module of core (`core.scheduler`,
`core.request`); the core package's own `__init__` is the node `core`.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import core

Graph = dict[str, set[str]]

CONTRACT = "core.worker.contract"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `root` (named `root.name`...)."""
    files = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    return files


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Import statements of `tree`, skipping the bodies of `if TYPE_CHECKING:` blocks."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def _imported_names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """Dotted names an import statement imports, relative imports made absolute.

    `from a.b import c` names `a.b.c`: module `a.b.c` when there is one, else `a.b`.
    """
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*parts, base] if base else parts)
    return [f"{base}.{alias.name}" for alias in node.names]


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is a module of the tree; None when outside it."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def module_graph(root: Path) -> Graph:
    """Module -> the modules of the same tree it imports at runtime."""
    modules = module_files(root)
    graph: Graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            targets.update(_resolve(n, modules) for n in _imported_names(node, package))
        graph[name] = {target for target in targets if target not in (None, name)}
    return graph


def package_of(module: str) -> str:
    """`core.scheduler.output` -> `core.scheduler`; `core.request` -> itself."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: Graph) -> Graph:
    packages: Graph = {package_of(module): set() for module in graph}
    for module, targets in graph.items():
        source = package_of(module)
        packages[source].update(package_of(t) for t in targets if package_of(t) != source)
    return packages


def find_cycle(graph: Graph) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None when it is acyclic."""
    state: dict[str, str] = {}  # "open" while on the DFS path, "done" once finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def contract_violations(graph: Graph) -> list[str]:
    """Imports that take the scheduler into worker code beyond the contract module.

    Importing `core.worker.contract` runs `core/worker/__init__.py` too, so that package
    module and the contract itself must not import other worker modules either.
    """
    gates = {"core.worker", CONTRACT}
    return [
        f"{source} -> {target}"
        for source, targets in sorted(graph.items())
        if source.startswith("core.scheduler.") or source in gates
        for target in sorted(targets)
        if (target == "core.worker" or target.startswith("core.worker.")) and target != CONTRACT
    ]


def _assert_acyclic(graph: Graph, what: str) -> None:
    cycle = find_cycle(graph)
    assert cycle is None, f"{what} import cycle: " + " -> ".join(cycle or [])


def test_core_modules_import_each_other_without_cycles():
    _assert_acyclic(module_graph(Path(core.__file__).parent), "module")


def test_core_packages_import_each_other_without_cycles():
    _assert_acyclic(package_graph(module_graph(Path(core.__file__).parent)), "package")


def test_scheduler_reaches_worker_only_through_contract():
    assert contract_violations(module_graph(Path(core.__file__).parent)) == []


def _write_tree(root: Path, sources: dict[str, str]) -> Path:
    for relpath, source in sources.items():
        path = root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root / "core"


def test_checks_catch_cycles_and_contract_breaches_in_a_synthetic_tree(tmp_path):
    root = _write_tree(
        tmp_path,
        {
            "core/__init__.py": "",
            "core/request.py": "from core.scheduler import queue\n",
            "core/scheduler/__init__.py": "",
            "core/scheduler/queue.py": "def f():\n    from core.worker import contract\n",
            "core/scheduler/sched.py": "from core.request import Request\n",
            "core/scheduler/uses_runner.py": "from ..worker.runner import Runner\n",
            "core/worker/__init__.py": "from core.worker.runner import Runner\n",
            "core/worker/contract.py": "",
            "core/worker/runner.py": """\
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from core.scheduler.sched import Scheduler
                """,
        },
    )
    graph = module_graph(root)

    # Modules: only request -> scheduler.queue; the worker's back edge is TYPE_CHECKING.
    assert find_cycle(graph) is None
    assert find_cycle(package_graph(graph)) == ["core.request", "core.scheduler", "core.request"]
    assert contract_violations(graph) == [
        "core.scheduler.uses_runner -> core.worker.runner",
        "core.worker -> core.worker.runner",
    ]

    (root / "worker" / "runner.py").write_text("import core.scheduler.uses_runner\n")
    assert find_cycle(module_graph(root)) == [
        "core.scheduler.uses_runner",
        "core.worker.runner",
        "core.scheduler.uses_runner",
    ]
