"""Every environment variable core reads, in one place, each with its meaning.

Values are read at call time, not import time, so tests and subprocesses see changes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

_Number = TypeVar("_Number", int, float)


def plugins_allowlist() -> list[str] | None:
    """CORE_PLUGINS: comma list of plugin distribution names to load.

    Unset -> None (every installed plugin except endpoint plugins); empty -> [] (none).
    Core's own entry points are loaded whatever this says.
    """
    raw = os.environ.get("CORE_PLUGINS")
    if raw is None:
        return None
    return [name.strip() for name in raw.split(",") if name.strip()]


def platform_name() -> str | None:
    """CORE_PLATFORM: entry name of the platform to use when several are available."""
    return os.environ.get("CORE_PLATFORM") or None


def trace_plugins() -> bool:
    """CORE_TRACE_PLUGINS=1: log every hook call and which plugin answered."""
    return os.environ.get("CORE_TRACE_PLUGINS", "") not in ("", "0")


def cache_dir() -> Path:
    """CORE_CACHE_DIR: where core keeps downloads and measurements (default
    $XDG_CACHE_HOME/core, or ~/.cache/core without XDG_CACHE_HOME)."""
    raw = os.environ.get("CORE_CACHE_DIR")
    if raw:
        return Path(raw).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says a relative path there is invalid and to be ignored.
    return (Path(xdg) if Path(xdg).is_absolute() else Path.home() / ".cache") / "core"


def allow_runtime_lora_updating() -> bool:
    """CORE_ALLOW_RUNTIME_LORA_UPDATING=1 (or true): with --enable-lora, `core serve` also
    serves POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's
    VLLM_ALLOW_RUNTIME_LORA_UPDATING). Anyone who can reach /v1 can then make the server
    read an adapter from any path it can see: a development setting."""
    raw = os.environ.get("CORE_ALLOW_RUNTIME_LORA_UPDATING", "")
    return raw.strip().lower() in ("1", "true")


def keep_alive_on_engine_death() -> bool:
    """CORE_KEEP_ALIVE_ON_ENGINE_DEATH=1 (or true): when its engine core dies, `core serve`
    stays up, answering 503 (code "engine_dead") and /health 503, until it is stopped
    (vLLM's VLLM_KEEP_ALIVE_ON_ENGINE_DEATH). Unset, it fails its in-flight requests, then
    exits with code 1 so that a supervisor restarts it."""
    raw = os.environ.get("CORE_KEEP_ALIVE_ON_ENGINE_DEATH", "")
    return raw.strip().lower() in ("1", "true")


KERNEL_CHOICE_ENV = "CORE_KERNEL_CHOICE"


def kernel_choices_forced() -> dict[str, str]:
    """CORE_KERNEL_CHOICE: comma list of `op=kernel` or `op/format=kernel` (e.g.
    "linear=onednn,quant_linear/bfloat16=dequantized"): the kernel that serves every
    problem of that op (and weight format) it takes, instead of the one measured fastest
    (core.kernel_choice; `core info` lists the ops, formats and kernels). An unknown or
    unavailable kernel is refused with a ValueError at the model's first use of the op;
    an entry without "=" is refused at once."""
    raw = os.environ.get("CORE_KERNEL_CHOICE", "")
    forced: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in raw.split(","))):
        target, sep, kernel = (part.strip() for part in entry.partition("="))
        if not sep or not target or not kernel:
            raise ValueError(f"{KERNEL_CHOICE_ENV}: {entry!r} is not op=kernel or op/format=kernel")
        forced[target] = kernel
    return forced


def image_fetch_timeout() -> float:
    """CORE_IMAGE_FETCH_TIMEOUT: seconds an http(s) image URL of a request may take to
    download (default 5, as vLLM's VLLM_IMAGE_FETCH_TIMEOUT). Past it the request is refused
    with a 400 naming the URL's field (core.multimodal.media)."""
    return _positive("CORE_IMAGE_FETCH_TIMEOUT", float, 5.0)


def max_media_bytes() -> int:
    """CORE_MAX_MEDIA_BYTES: the most bytes one image of a request may hold, encoded, whether
    it comes from a URL, a file or a data URL (default 20 MiB). A larger one is refused with
    a 400 naming its field, before it is read to the end (core.multimodal.media)."""
    return _positive("CORE_MAX_MEDIA_BYTES", int, 20 * 1024 * 1024)


def log_stats_interval() -> float:
    """CORE_LOG_STATS_INTERVAL: seconds between two calls of the stat loggers' `log()`
    (core.engine.stat_logger) while an engine runs (default 10, as vLLM's
    VLLM_LOG_STATS_INTERVAL)."""
    return _positive("CORE_LOG_STATS_INTERVAL", float, 10.0)


def engine_heartbeat_timeout() -> float:
    """CORE_ENGINE_HEARTBEAT_TIMEOUT_S: seconds without a word from an engine core (it beats
    every second, busy or idle) after which /health answers 503 (default 10): a frozen
    process (SIGSTOP, a deadlock) is reported while it lasts, not only once it dies."""
    return _positive("CORE_ENGINE_HEARTBEAT_TIMEOUT_S", float, 10.0)


BATCH_INVARIANT_ENV = "CORE_BATCH_INVARIANT"


def batch_invariant() -> bool:
    """CORE_BATCH_INVARIANT=1 (or true): start engines in batch-invariant mode where
    --batch-invariant / LLM(batch_invariant=...) does not say (vLLM's
    VLLM_BATCH_INVARIANT; core.batch_invariant)."""
    return os.environ.get("CORE_BATCH_INVARIANT", "").strip().lower() in ("1", "true")


def _positive(name: str, cast: type[_Number], default: _Number) -> _Number:
    """The number in `name`, or `default` when it is unset or empty; ValueError naming the
    variable for text that is not a finite number > 0."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = cast(raw)
    except ValueError:
        value = cast(0)
    if not 0 < value < float("inf"):  # NaN fails too
        raise ValueError(f"{name}={raw!r}: must be a finite number > 0")
    return value
