"""A local HTTP server standing in for the Hugging Face Hub (tests/test_pull_hf.py points HF_ENDPOINT at it).

It answers what huggingface_hub 0.3x calls for `model_info(files_metadata=True)` and `hf_hub_download`:

    GET  /api/models/OWNER/REPO/revision/REV?blobs=True   {"id", "sha", "siblings": [{rfilename, size, blobId,
                                                          lfs?: {size, sha256, pointerSize}}]}
    HEAD /OWNER/REPO/resolve/REV/FILE                     X-Repo-Commit, ETag (LFS: the sha256; else the git blob id),
    GET  (same)                                           X-Linked-Etag / X-Linked-Size (LFS), Content-Length;
                                                          GET honours `Range: bytes=N-` with 206 + Content-Range
Errors carry the X-Error-Code header huggingface_hub maps to its exceptions (RepoNotFound, RevisionNotFound,
EntryNotFound, GatedRepo). Knobs: `cut` (serve only the first N bytes of the next GET of a file, then drop the
connection), `corrupt` (serve altered bytes under the real hashes), `gated` repos (need `Authorization: Bearer
TOKEN`), `offline` (every request fails with 503 -- used only to prove that nothing was asked).
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".gguf", ".safetensors")
TOKEN = "hf_test_token"


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    gated: bool = False


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    log: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Range header)
    cut: dict[str, int] = field(default_factory=dict)  # file -> bytes to send before dropping the connection (once)
    corrupt: set[str] = field(default_factory=set)

    def add(self, repo_id: str, files: dict[str, bytes], *, gated: bool = False) -> Repo:
        content = b"".join(n.encode() + files[n] for n in sorted(files))
        commit = hashlib.sha1(repo_id.encode() + content).hexdigest()
        self.repos[repo_id] = Repo(files, commit, gated)
        return self.repos[repo_id]

    def requests(self, method: str | None = None) -> list[tuple[str, str, str | None]]:
        return [r for r in self.log if method is None or r[0] == method]


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _sibling(name: str, data: bytes) -> dict:
    out = {"rfilename": name, "size": len(data), "blobId": _blob_id(data)}
    if name.endswith(LFS_SUFFIXES):
        out["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
    return out


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _error(self, status: int, code: str, commit: str | None = None) -> None:
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", code)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _repo(self, repo_id: str, rev: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound")
            elif rev not in ("main", repo.commit):
                self._error(404, "RevisionNotFound")
                return None
            return repo

        def _route(self, method: str) -> None:
            url = urlsplit(self.path)
            hub.log.append((method, unquote(url.path), self.headers.get("Range")))
            parts = [unquote(p) for p in url.path.strip("/").split("/")]
            if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "revision":
                return self._info(f"{parts[2]}/{parts[3]}", parts[5])
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._file(method, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
            self._error(404, "RepoNotFound")

        def _info(self, repo_id: str, rev: str) -> None:
            repo = self._repo(repo_id, rev)
            if repo is None:
                return
            body = json.dumps({"id": repo_id, "sha": repo.commit, "private": False, "gated": repo.gated and "auto",
                               "siblings": [_sibling(n, d) for n, d in sorted(repo.files.items())]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _file(self, method: str, repo_id: str, rev: str, name: str) -> None:
            repo = self._repo(repo_id, rev)
            if repo is None:
                return
            if repo.gated and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._error(401, "GatedRepo")
            if name not in repo.files:
                return self._error(404, "EntryNotFound", repo.commit)
            data = repo.files[name]
            sibling = _sibling(name, data)
            etag = sibling["lfs"]["sha256"] if "lfs" in sibling else sibling["blobId"]
            start = 0
            rng = self.headers.get("Range")
            if method == "GET" and rng and rng.startswith("bytes=") and rng.endswith("-"):
                start = int(rng[len("bytes="):-1])
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{etag}"')
            if "lfs" in sibling:
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            if method == "HEAD":
                return
            if name in hub.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            body = data[start:]
            if name in hub.cut:
                body = body[:hub.cut.pop(name)]
                self.wfile.write(body)
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def do_GET(self):
            self._route("GET")

        def do_HEAD(self):
            self._route("HEAD")

    return Handler


def serve(hub: FakeHub) -> tuple[ThreadingHTTPServer, str]:
    """Start the server on a free local port in a daemon thread; returns (server, endpoint URL)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
