"""A stand-in for the Hugging Face Hub on 127.0.0.1, for download tests without a network.

It serves repositories a test writes as directories, one per branch, through the
endpoints `huggingface_hub.snapshot_download` calls: the model info
(`/api/models/{repo}/revision/{rev}`: `sha` and `siblings`), the file tree
(`/api/models/{repo}/tree/{rev}`) and the files themselves (`/{repo}/resolve/{rev}/{path}`,
HEAD and GET, with `X-Repo-Commit`, `ETag` and `Content-Length`, and byte ranges for resumed
downloads). Errors carry the `X-Error-Code` the hub library turns into its exceptions:
`RepoNotFound`, `GatedRepo` (a gated repository's files need `Authorization: Bearer TOKEN`),
`RevisionNotFound`, `EntryNotFound`. Every request is logged, so a test can tell which
files were fetched.

Point the hub library at it with `HF_ENDPOINT=url` (a subprocess) or `point_hub_library_at`
(this process: the library reads its environment once, at import).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

__all__ = ["HubRequest", "HubStandIn", "point_hub_library_at"]


@dataclass(frozen=True)
class HubRequest:
    method: str
    path: str  # unquoted, without the query
    authorization: str | None


@dataclass
class _Repo:
    branches: dict[str, Path]  # branch -> the directory holding its files
    token: str | None  # gated: the token its files need

    def commit(self, branch: str) -> str:
        return hashlib.sha1(f"{branch}:{self.branches[branch]}".encode()).hexdigest()

    def branch(self, revision: str) -> str | None:
        """The branch `revision` names, by name or by commit."""
        if revision in self.branches:
            return revision
        return next((b for b in self.branches if self.commit(b) == revision), None)


class _Refusal(Exception):
    """An error response: status, X-Error-Code, and the headers to add."""

    def __init__(self, status: int, code: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(code)
        self.status, self.code, self.headers = status, code, headers or {}


@dataclass
class HubStandIn:
    """The stand-in server: `add_repo`, then use it as a context manager (or `stop` it
    early); `url` is its endpoint and `requests` the log."""

    repos: dict[str, _Repo] = field(default_factory=dict)
    requests: list[HubRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def add_repo(
        self, repo_id: str, branches: dict[str, Path], token: str | None = None
    ) -> HubStandIn:
        """Serve `repo_id`: each branch is the files under its directory; with `token`,
        a gated repository whose files only that token may fetch."""
        self.repos[repo_id] = _Repo(dict(branches), token)
        return self

    def commit(self, repo_id: str, branch: str = "main") -> str:
        return self.repos[repo_id].commit(branch)

    def fetched(self, repo_id: str) -> set[str]:
        """The files of `repo_id` whose content was requested (GET)."""
        prefix = f"/{repo_id}/resolve/"
        return {
            request.path[len(prefix) :].split("/", 1)[1]
            for request in self.requests
            if request.method == "GET" and request.path.startswith(prefix)
        }

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving (later requests are refused); safe to call twice."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def respond(self, method: str, path: str, authorization: str | None) -> tuple[int, dict, bytes]:
        """(status, headers, body) for a request; the body is left out for HEAD by the caller."""
        self.requests.append(HubRequest(method, path, authorization))
        try:
            return self._route(path, authorization)
        except _Refusal as refusal:
            headers = {"X-Error-Code": refusal.code, "X-Error-Message": refusal.code}
            return refusal.status, headers | refusal.headers, b""

    def _route(self, path: str, authorization: str | None) -> tuple[int, dict, bytes]:
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id, rest = "/".join(parts[2:4]), parts[4:]
            repo = self._repo(repo_id, authorization)
            if not rest:
                return self._info(repo_id, repo, "main")
            if rest[0] == "revision" and len(rest) == 2:
                return self._info(repo_id, repo, rest[1])
            if rest[0] == "tree" and len(rest) >= 2:
                return self._tree(repo, rest[1], "/".join(rest[2:]))
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id = "/".join(parts[:2])
            return self._file(repo_id, parts[3], "/".join(parts[4:]), authorization)
        raise _Refusal(404, "NotFound")

    def _repo(self, repo_id: str, authorization: str | None) -> _Repo:
        if repo_id not in self.repos:
            # As the hub: 401 to an anonymous request, 404 to an authenticated one.
            raise _Refusal(404 if authorization else 401, "RepoNotFound")
        return self.repos[repo_id]

    def _branch(self, repo: _Repo, revision: str) -> str:
        branch = repo.branch(revision)
        if branch is None:
            raise _Refusal(404, "RevisionNotFound")
        return branch

    def _info(self, repo_id: str, repo: _Repo, revision: str) -> tuple[int, dict, bytes]:
        branch = self._branch(repo, revision)
        siblings = [{"rfilename": name} for name in _files(repo.branches[branch])]
        info = {
            "id": repo_id,
            "modelId": repo_id,
            "sha": repo.commit(branch),
            "private": False,
            "gated": "manual" if repo.token else False,
            "siblings": siblings,
        }
        return _json(info)

    def _tree(self, repo: _Repo, revision: str, folder: str) -> tuple[int, dict, bytes]:
        root = repo.branches[self._branch(repo, revision)]
        entries = [
            {
                "type": "file",
                "path": name,
                "size": (root / name).stat().st_size,
                "oid": _oid(root / name),
            }
            for name in _files(root)
            if not folder or name.startswith(f"{folder}/")
        ]
        return _json(entries)

    def _file(
        self, repo_id: str, revision: str, name: str, authorization: str | None
    ) -> tuple[int, dict, bytes]:
        repo = self._repo(repo_id, authorization)
        if repo.token is not None and authorization != f"Bearer {repo.token}":
            raise _Refusal(403 if authorization else 401, "GatedRepo")
        branch = self._branch(repo, revision)
        commit = {"X-Repo-Commit": repo.commit(branch)}
        path = repo.branches[branch] / name
        if not path.is_file():
            raise _Refusal(404, "EntryNotFound", commit)
        body = path.read_bytes()
        headers = commit | {"ETag": f'"{_oid(path)}"', "Accept-Ranges": "bytes"}
        return 200, headers, body


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _oid(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _json(value: object) -> tuple[int, dict, bytes]:
    return 200, {"Content-Type": "application/json"}, json.dumps(value).encode()


def _handler_class(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(send_body=True)

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def _answer(self, send_body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            auth = self.headers.get("Authorization")
            status, headers, body = hub.respond(self.command, path, auth)
            status, headers, body = _byte_range(self.headers.get("Range"), status, headers, body)
            self.send_response(status)
            for key, value in (headers | {"Content-Length": str(len(body))}).items():
                self.send_header(key, value)
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: tests read the request log, and some read this process's stderr."""

    return Handler


def _byte_range(
    header: str | None, status: int, headers: dict, body: bytes
) -> tuple[int, dict, bytes]:
    """A resumed download asks for "bytes=START-": answer 206 with the rest."""
    if status != 200 or header is None or not header.startswith("bytes="):
        return status, headers, body
    start = int(header.removeprefix("bytes=").split("-")[0])
    content_range = {"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"}
    return 206, headers | content_range, body[start:]


def point_hub_library_at(
    monkeypatch: pytest.MonkeyPatch, endpoint: str, cache: Path, offline: bool = False
) -> None:
    """Make `huggingface_hub` in this process use `endpoint` and the cache `cache`, with no
    saved token and HF_TOKEN unset, offline when `offline`: what HF_ENDPOINT, HF_HUB_CACHE,
    HF_HOME and HF_HUB_OFFLINE would do, had they been set before it was imported."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(cache / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(cache / "no-stored-tokens"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
