"""What the installed torch was built for, read without importing torch.

Platform probes must stay cheap (DESIGN.md section 3): importing torch costs seconds and
may initialise device runtimes. torch records its build in the small, dependency-free
module `torch/version.py`; this reads that file on its own.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["TorchBuild", "torch_build"]


class TorchBuild:
    """torch's version and the device toolkits it was built against (None: not built for)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.version: str = fields.get("__version__", "unknown")
        self.cuda: str | None = fields.get("cuda")
        self.hip: str | None = fields.get("hip")
        self.xpu: str | None = fields.get("xpu")


@functools.cache
def torch_build() -> TorchBuild | None:
    """The installed torch's build, or None when torch is not installed."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "version.py"
    fields: dict[str, Any] = {}
    # version.py holds plain assignments (and a typing import); running it alone is cheap.
    exec(compile(path.read_text(), str(path), "exec"), fields)
    return TorchBuild(fields)
