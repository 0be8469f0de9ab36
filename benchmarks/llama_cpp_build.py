"""Build llama.cpp's `llama-server` and `llama-bench` from the sources vendored in the PyPI
sdist of llama-cpp-python, once, into a cache directory (PEERS.md says how and why).

    python -m benchmarks.llama_cpp_build            # prints the bin directory

The build takes about 45 minutes on 2 cores; it runs under `nice` and its binaries are
reused by every later run. Never measure anything while it compiles.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from benchmarks.cache import cache_root

VERSION = "0.3.36"
TARGETS = ("llama-server", "llama-bench")
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    # Not GGML_NATIVE: machines of this kind differ (AVX2-only Zen3, AVX-512 Xeons whose
    # advertised extensions the binary then uses and dies on with SIGILL). An AVX2
    # baseline runs on all of them and is what the peers' figures in PEERS.md used.
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
]


def cache_dir() -> Path:
    return cache_root() / f"llama.cpp-{VERSION}-avx2"


def bin_dir() -> Path:
    return cache_dir() / "build" / "bin"


def is_built() -> bool:
    return all((bin_dir() / target).exists() for target in TARGETS)


def build() -> Path:
    """The directory holding the binaries, building them first if needed."""
    if is_built():
        return bin_dir()
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    source = _unpacked_sources(root)
    build_dir = root / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    nice = ["nice", "-n", "19"]
    subprocess.run(
        ["cmake", "-S", str(source), "-B", str(build_dir), *generator, *CMAKE_FLAGS], check=True
    )
    subprocess.run(
        [*nice, "cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 2),
         "--target", *TARGETS],
        check=True,
    )  # fmt: skip
    return bin_dir()


def _unpacked_sources(root: Path) -> Path:
    source = root / "src" / "vendor" / "llama.cpp"
    if source.exists():
        return source
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={VERSION}", "-d", tmp],
            check=True,
        )  # fmt: skip
        (archive,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(root / "unpacked", filter="data")
    (top,) = (root / "unpacked").iterdir()
    shutil.move(str(top), root / "src")
    return source


if __name__ == "__main__":
    print(build())
