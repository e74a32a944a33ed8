"""A Hugging Face hub stand-in on 127.0.0.1, for `models pull` tests (HF_ENDPOINT points at it).

It answers the requests huggingface_hub 2.x makes, with the headers it reads (checked against
huggingface_hub/file_download.py and utils/_http.py):

- `GET /api/models/{org}/{name}[/revision/{rev}]`: the model info, with `sha` and `siblings`
  (`HfApi.model_info`, which `pull` uses to list the files).
- `HEAD|GET /{org}/{name}/resolve/{rev}/{path}`: a 302 to a second server (the CDN, another
  origin, as the real hub redirects LFS files), carrying `X-Repo-Commit`, `X-Linked-Etag` (the
  sha256 of the bytes, quoted) and `X-Linked-Size`. Errors carry `X-Error-Code` (RepoNotFound,
  EntryNotFound, GatedRepo), which is how the library tells them apart.
- `GET /cdn/{sha256}` on the CDN: the bytes, with `Range: bytes=N-` answered by 206.

Faults for the resume tests: `cut_next` sends only that many bytes of the next CDN GET and then
drops the connection; `refuse_cdn` answers every CDN GET with that status (`refuse_after_cut`
sets it once the cut has happened: a network that stays down). Every request is logged
(method, path, Range, Authorization) so tests can check what was asked, and that nothing was.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RESOLVE_RE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
API_RE = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?/?$")
CHUNK = 1 << 20


@dataclass
class Repo:
    commit: str
    files: dict[str, Path]  # path inside the repo -> the bytes to serve
    gated: bool = False
    listed_only: tuple[str, ...] = ()  # in the file list, but 404 at /resolve/ (a stale listing)


@dataclass
class Logged:
    server: str  # "hub" | "cdn"
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class HubState:
    repos: dict[str, Repo] = field(default_factory=dict)
    token: str | None = None  # what a gated repo accepts
    cut_next: int | None = None
    refuse_cdn: int | None = None
    refuse_after_cut: int | None = None  # after the cut, refuse every CDN GET with this status
    log: list[Logged] = field(default_factory=list)
    blobs: dict[str, Path] = field(default_factory=dict)  # sha256 -> file
    cdn_base: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_repo(self, repo: str, commit: str, files: dict[str, Path], gated: bool = False) -> None:
        self.repos[repo] = Repo(commit, files, gated)
        for path in files.values():
            self.blobs[sha256_of(path)] = path


_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def sha256_of(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(CHUNK), b""):
                digest.update(block)
        _SHA_CACHE[key] = digest.hexdigest()
    return _SHA_CACHE[key]


def _handler(state: HubState, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet test output
            pass

        def _log(self) -> None:
            with state.lock:
                state.log.append(
                    Logged(role, self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization"))
                )

        def _reply(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str, commit: str | None = None) -> None:
            headers = {"X-Error-Code": code, "Content-Type": "application/json"}
            if commit:
                headers["X-Repo-Commit"] = commit
            self._reply(status, headers, json.dumps({"error": code}).encode())

        def do_HEAD(self) -> None:
            self._serve()

        def do_GET(self) -> None:
            self._serve()

        def _serve(self) -> None:
            self._log()
            path = self.path.split("?", 1)[0]
            if role == "cdn":
                return self._cdn(path)
            if (match := API_RE.match(path)) and self.command == "GET":
                return self._api(match.group(1))
            if match := RESOLVE_RE.match(path):
                return self._resolve(match.group(1), match.group(3))
            self._error(404, "RepoNotFound")

        def _api(self, repo_id: str) -> None:
            repo = state.repos.get(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound")
            info = {
                "_id": repo_id,
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "siblings": [{"rfilename": name} for name in ["README.md", *repo.files, *repo.listed_only]],
            }
            self._reply(200, {"Content-Type": "application/json"}, json.dumps(info).encode())

        def _resolve(self, repo_id: str, file: str) -> None:
            repo = state.repos.get(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound")
            if repo.gated and self.headers.get("Authorization") != f"Bearer {state.token}":
                return self._error(401, "GatedRepo")
            source = repo.files.get(file)
            if source is None:
                return self._error(404, "EntryNotFound", repo.commit)
            sha = sha256_of(source)
            self._reply(
                302,
                {
                    "Location": f"{state.cdn_base}/cdn/{sha}",
                    "X-Repo-Commit": repo.commit,
                    "X-Linked-Etag": f'"{sha}"',
                    "X-Linked-Size": str(source.stat().st_size),
                    "ETag": f'"{sha[:40]}"',
                },
            )

        def _cdn(self, path: str) -> None:
            sha = path.rsplit("/", 1)[-1]
            source = state.blobs.get(sha)
            if source is None:
                return self._error(404, "EntryNotFound")
            if self.command == "GET" and state.refuse_cdn:
                return self._error(state.refuse_cdn, "Unavailable")
            size = source.stat().st_size
            start = 0
            wanted = self.headers.get("Range")
            if wanted and (m := re.match(r"bytes=(\d+)-$", wanted)):
                start = int(m.group(1))
            status = 206 if start else 200
            self.send_response(status)
            self.send_header("Content-Length", str(size - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{sha}"')
            if start:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.end_headers()
            if self.command == "HEAD":
                return
            with state.lock:
                cut, state.cut_next = state.cut_next, None
                if cut is not None and state.refuse_after_cut:
                    state.refuse_cdn = state.refuse_after_cut
            limit = size - start if cut is None else min(cut, size - start)
            with open(source, "rb") as f:
                f.seek(start)
                left = limit
                while left:
                    block = f.read(min(CHUNK, left))
                    if not block:
                        break
                    self.wfile.write(block)
                    left -= len(block)
            if cut is not None:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)  # the connection dies mid-body, as a dropped network does

    return Handler


class HubServer:
    """The hub and its CDN, each a threaded HTTP server on a free 127.0.0.1 port."""

    def __init__(self, state: HubState | None = None):
        self.state = state or HubState()
        self.hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state, "hub"))
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state, "cdn"))
        self.hub.daemon_threads = self.cdn.daemon_threads = True
        self.state.cdn_base = f"http://127.0.0.1:{self.cdn.server_address[1]}"
        self._threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self.hub, self.cdn)]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.hub.server_address[1]}"

    def __enter__(self) -> HubServer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()
