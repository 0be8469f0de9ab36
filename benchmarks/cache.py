"""Where the benchmarks keep what they make once and reuse: llama.cpp's binaries, the AWQ
checkpoint. `$CORE_BENCH_CACHE`, else ~/.cache/core-bench."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("CORE_BENCH_CACHE") or Path.home() / ".cache" / "core-bench")
