"""Load one platform probe and call it in a fresh interpreter; print what happened as JSON.

    python -m core.testing.probe_child NAME      # an entry name of core.platforms
    python -m core.testing.probe_child module.path:attr

The platform checks run this in a subprocess so that `modules` lists exactly what loading
the entry point and probing imported. It imports only the standard library and
core.plugins (both light) before the probe.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def load_probe(name: str) -> Any:
    if ":" in name:
        module, _, attribute = name.partition(":")
        return getattr(importlib.import_module(module), attribute)
    from core.plugins import get_registry
    from core.plugins.groups import PLATFORMS

    return get_registry().require(PLATFORMS, name)


def probe_report(name: str) -> dict[str, Any]:
    """{"path": ...} or {"unavailable": reason} or {"error": ...}, plus "modules"."""
    probe = load_probe(name)
    report: dict[str, Any] = {}
    try:
        report["path"] = probe()
    except Exception as exc:  # the parent judges which exceptions the contract allows
        from core.platforms.unavailable import Unavailable

        if isinstance(exc, Unavailable):
            report["unavailable"] = exc.reason
        else:
            report["error"] = f"{type(exc).__name__}: {exc}"
    report["modules"] = sorted(sys.modules)
    return report


if __name__ == "__main__":
    print(json.dumps(probe_report(sys.argv[1]), default=repr))
