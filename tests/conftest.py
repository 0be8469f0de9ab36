"""Shared fixtures. `make_distribution` writes real installed-distribution metadata."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from plugin_sources import install_distribution


class SitePackages:
    """A temporary site directory on sys.path holding throw-away distributions.

    Each distribution gets a `<name>-<version>.dist-info` with METADATA and
    entry_points.txt, so `importlib.metadata` discovers it exactly as it would a wheel.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(
        self,
        name: str,
        entry_points: dict[str, dict[str, str]],
        modules: dict[str, str],
        version: str = "1.0",
    ) -> None:
        install_distribution(self.root, name, entry_points, modules, version)
        importlib.invalidate_caches()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SitePackages:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    before = set(sys.modules)
    yield SitePackages(root)
    for name in set(sys.modules) - before:  # forget the throw-away packages
        if not name.startswith(("core", "torch", "_pytest", "pytest")):
            sys.modules.pop(name, None)


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch):
    """Make this process discover plugins anew (the registry is cached per process)."""
    import core.plugins.registry as registry

    monkeypatch.setattr(registry, "_registry", None)
    yield


@pytest.fixture(scope="session")
def default_server():
    """One `core serve` of the default model (server_process.SMALL's settings), shared by
    the slow tests that ask nothing else of it: each start costs seconds of CI."""
    from server_process import SHARED_SERVER_PIDS, ServerProcess

    process = ServerProcess().wait_ready()
    SHARED_SERVER_PIDS.add(process.proc.pid)
    yield process
    process.stop()
    SHARED_SERVER_PIDS.discard(process.proc.pid)
