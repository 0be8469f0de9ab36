"""Hub downloads: fetch the files a hub model's load needs into the Hugging Face cache.

A hub id names a model repository on the Hugging Face Hub ("org/name"), or one GGUF file
of a GGUF repository in vLLM's `repo_id:quant_type` notation ("org/name-GGUF:Q4_K_M").
Everything goes through `huggingface_hub.snapshot_download`, so the hub library's own
behaviour holds: its cache layout (`HF_HOME`, `HF_HUB_CACHE`, or `--download-dir`),
`HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE=1` (cache only), resumed partial downloads, file
locks that let concurrent starts on one host share one download, and its progress bars on
a terminal. Only the files a load reads are fetched, never a repository's other weights.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from core.model_loader.safetensors_loader import CONFIG_FILE, INDEX_FILE, SINGLE_FILE

__all__ = ["HubModel", "download_model"]

_HUB_MODEL = re.compile(r"(?P<repo_id>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<quant_type>[\w.-]+))?")

# What a safetensors load reads besides the weights: the architecture, the tokenizer, the
# chat template, sampling defaults, a vision model's image processor and a
# sentence-transformers model's pooling.
_METADATA_FILES = (
    CONFIG_FILE,
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "modules.json",
    "*_Pooling/config.json",
)


@dataclass(frozen=True)
class HubModel:
    """A hub id as `--model` names it: a repository, and for a GGUF repository the quant
    type (e.g. "Q4_K_M") whose single .gguf file is the model."""

    repo_id: str
    quant_type: str | None = None

    @classmethod
    def parse(cls, model: str) -> HubModel | None:
        """The hub id `model` spells ("org/name" or "org/name:QUANT"); None when it is not
        one (a path, a .gguf file name)."""
        match = _HUB_MODEL.fullmatch(model)
        if match is None or match["repo_id"].endswith(".gguf"):
            return None
        return cls(match["repo_id"], match["quant_type"])

    def __str__(self) -> str:
        return self.repo_id if self.quant_type is None else f"{self.repo_id}:{self.quant_type}"


def download_model(model: HubModel, revision: str | None, cache_dir: str | None) -> Path:
    """The local path of `model` at `revision` (a branch, tag or commit; None: main) in the
    Hugging Face cache `cache_dir` (None: the hub library's), fetching what is missing.

    For a repository: its snapshot directory, holding config.json, the safetensors
    weights (model.safetensors, or the index and the shards it names) and whichever
    tokenizer, chat template, generation config and pooling files it has. For
    "org/name:QUANT": the one .gguf file whose name ends in that quant type (any case). Raises
    ValueError, one line naming the cause, when the repository does not exist, is gated and
    HF_TOKEN does not give access, has no weights core loads, or is not cached while offline
    (`HF_HUB_OFFLINE=1`) or with the hub unreachable.
    """
    from huggingface_hub import errors

    try:
        if model.quant_type is not None:
            return _download_gguf(model, revision, cache_dir)
        return _download_safetensors(model, revision, cache_dir)
    except errors.HfHubHTTPError as exc:
        raise ValueError(_http_error_message(model, revision, exc)) from exc
    except errors.LocalEntryNotFoundError as exc:
        raise ValueError(_not_cached_message(model, revision, cache_dir, exc)) from exc


def _download_safetensors(model: HubModel, revision: str | None, cache_dir: str | None) -> Path:
    snapshot = _fetch(model, revision, cache_dir, [*_METADATA_FILES, INDEX_FILE, SINGLE_FILE])
    index = snapshot / INDEX_FILE
    if index.is_file():
        # The index names the shards; a repository may hold other weights besides them
        # (e.g. consolidated.safetensors), which are never fetched. The snapshot's directory
        # name is its commit: the shards come from the same commit as the index.
        _fetch(model, snapshot.name, cache_dir, _shard_names(index))
    elif not (snapshot / SINGLE_FILE).is_file() or not (snapshot / CONFIG_FILE).is_file():
        raise ValueError(
            f"model {model}{_at(revision)}: the repository has no {CONFIG_FILE} with "
            f"safetensors weights ({SINGLE_FILE} or {INDEX_FILE}); for a GGUF repository name "
            f"the quant type of its file, e.g. {model}:Q4_K_M"
        )
    return snapshot


def _download_gguf(model: HubModel, revision: str | None, cache_dir: str | None) -> Path:
    patterns = _gguf_patterns(model.quant_type)
    snapshot = _fetch(model, revision, cache_dir, patterns)
    found = sorted(
        path
        for path in snapshot.rglob("*.gguf")
        if any(fnmatchcase(path.relative_to(snapshot).as_posix(), p) for p in patterns)
    )
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(path.relative_to(snapshot).as_posix() for path in found)
        raise ValueError(f"model {model}: several .gguf files match ({names})")
    raise ValueError(
        f"model {model}{_at(revision)}: the repository has no single .gguf file of quant type "
        f"{model.quant_type} (a file named like name-{model.quant_type}.gguf)"
    )


def _gguf_patterns(quant_type: str) -> list[str]:
    """Glob patterns (case-sensitive, as the hub library matches them) for a file name
    ending in `quant_type` in any case: "x-Q4_K_M.gguf", "x.q4_k_m.gguf", "x_Q4_K_M.gguf".
    Split GGUFs ("x-Q4_K_M-00001-of-00002.gguf") are not matched: core reads one file."""
    any_case = "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in quant_type)
    return [f"*{separator}{any_case}.gguf" for separator in "-._"]


def _fetch(
    model: HubModel, revision: str | None, cache_dir: str | None, patterns: list[str]
) -> Path:
    """The snapshot directory of `revision`, holding the repository's files that match
    `patterns` (those it has), fetched when missing."""
    from huggingface_hub import snapshot_download

    return Path(
        snapshot_download(
            model.repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=patterns
        )
    )


def _shard_names(index: Path) -> list[str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ValueError(f"{index} is not a JSON object with a weight_map") from exc
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: no 'weight_map' naming the shards")
    return sorted(set(map(str, weight_map.values())))


def _http_error_message(model: HubModel, revision: str | None, exc: Exception) -> str:
    from huggingface_hub import constants, errors, get_token

    where = f"on the Hugging Face Hub ({constants.ENDPOINT})"
    if isinstance(exc, errors.GatedRepoError):
        if get_token() is None:
            return (
                f"model {model}: a gated repository {where}; accept its conditions there and "
                "set HF_TOKEN to a token of an account with access"
            )
        return (
            f"model {model}: a gated repository {where}, and the token (HF_TOKEN or the saved "
            "login) does not give access; accept its conditions with that account"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return (
            f"model {model}: no such repository {where} (a private one needs HF_TOKEN set "
            "to a token with access)"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"model {model}: the repository {where} has no revision {revision}"
    failed = f"downloading from {constants.ENDPOINT} failed"
    return f"model {model}{_at(revision)}: {failed}: {_first_line(exc)}"


def _not_cached_message(
    model: HubModel, revision: str | None, cache_dir: str | None, exc: Exception
) -> str:
    from huggingface_hub import constants, errors

    where = constants.HF_HUB_CACHE if cache_dir is None else cache_dir
    state = "only partly in" if isinstance(exc, errors.IncompleteSnapshotError) else "not in"
    missing = f"model {model}{_at(revision)}: {state} the Hugging Face cache {where}"
    if constants.is_offline_mode():
        return f"{missing}, and HF_HUB_OFFLINE=1 forbids downloading it"
    cause = exc.__cause__ or exc
    return f"{missing}, and the hub ({constants.ENDPOINT}) cannot be reached: {_first_line(cause)}"


def _at(revision: str | None) -> str:
    return "" if revision is None else f" at revision {revision}"


def _first_line(exc: BaseException) -> str:
    """The first non-empty line of `exc`'s message: hub errors span several lines, and a
    start error is reported as one."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
