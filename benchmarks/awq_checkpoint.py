"""The AWQ checkpoint core-awq and the quality section run: the default GGUF quantized by
`core quantize awq` with groups of 64 inputs, made once and cached (`cache.cache_root`).

Made in a directory beside its final place and renamed when `core quantize` succeeds,
so an interrupted run never leaves a partial checkpoint where later runs look.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.cache import cache_root

# Not 128: SmolLM2-135M's hidden size, 576 = 9 x 64, is no multiple of it (q/k/v and gate/up
# read 576 inputs). 64 is the largest AWQ group size that divides every linear's inputs.
GROUP_SIZE = 64


def checkpoint_dir(gguf_path: Path) -> Path:
    """Where the AWQ checkpoint of `gguf_path` is cached: awq-<GGUF stem>-g64."""
    return cache_root() / f"awq-{gguf_path.stem}-g{GROUP_SIZE}"


def is_built(gguf_path: Path) -> bool:
    return (checkpoint_dir(gguf_path) / "config.json").is_file()


def quantize_command(gguf_path: Path, out_dir: Path) -> list[str]:
    """`core quantize awq GGUF OUT_DIR --group-size 64`, run by this interpreter."""
    entry = "from core.entrypoints.cli import main; main()"
    return [sys.executable, "-c", entry, "quantize", "awq", str(gguf_path), str(out_dir),
            "--group-size", str(GROUP_SIZE)]  # fmt: skip


def build(gguf_path: Path, env: dict[str, str]) -> Path:
    """Run `quantize_command` (in a child with environment `env`, its progress on this
    terminal) into `checkpoint_dir`; the directory. Callers check `is_built` first.
    CalledProcessError when `core quantize` fails."""
    target = checkpoint_dir(gguf_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as work:
        out_dir = Path(work) / target.name
        subprocess.run(quantize_command(gguf_path, out_dir), env=env, check=True)
        if target.exists():  # a stale, incomplete one: no config.json
            shutil.rmtree(target)
        out_dir.rename(target)
    return target


__all__ = ["GROUP_SIZE", "build", "checkpoint_dir", "is_built", "quantize_command"]
