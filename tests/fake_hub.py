"""A fake Hugging Face Hub on 127.0.0.1: serves a Hub cache folder (the layout huggingface_hub writes, see
tests/rehearsal/hub_cache.py) over HTTP, so that downloads go through the real client code: huggingface_hub's
`snapshot_download` / `hf_hub_download` and `datasets.load_dataset`, with HF_ENDPOINT=<its url> set in a child
process (both libraries read HF_ENDPOINT when they are imported).

Deliberately minimal, and correct for what it serves: repo info, tree listings and paths-info (one page each), and
`resolve` (HEAD and GET, byte ranges included), with the headers the clients read (X-Repo-Commit, ETag,
Content-Length). Every file is a plain git blob (no LFS, no Xet), so its ETag is its git blob id, as the Hub's is for a
small file. Errors carry the Hub's X-Error-Code, which huggingface_hub maps to its exceptions
(`utils/_http.py: hf_raise_for_status`): RepoNotFound, RevisionNotFound, EntryNotFound, and GatedRepo for the repos
named gated: their info and listings are public, their files answer 401 without a token and 403 with one, as the Hub
answers for a licence not yet accepted. `/raw/<path>` serves a plain folder (a stand-in for raw.githubusercontent.com,
where DuoAttention's head patterns live).

    python -m tests.fake_hub --cache DIR [--raw DIR] [--gated ORG/NAME ...] [--port-file FILE]
"""

from __future__ import annotations

import argparse
import email.utils
import hashlib
import json
import os
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

API = re.compile(
    r"^/api/(?P<type>model|dataset|space)s/(?P<repo>[^/]+/[^/]+)"
    r"(?:/(?P<op>revision|tree|paths-info)/(?P<rev>[^/]+)(?P<path>/.*)?)?$"
)
RESOLVE = re.compile(r"^/(?:(?P<type>dataset|space)s/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
LAST_MODIFIED = "2025-01-01T00:00:00.000Z"
# What a child process must not inherit: a token, a token file, the offline switches.
UNSET = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT")


class HubError(Exception):
    """An error answer: HTTP status, the Hub's X-Error-Code and its X-Error-Message."""

    def __init__(self, status: int, code: str, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit

    def answer(self) -> tuple[int, dict, bytes]:
        headers = {"Content-Type": "application/json", "X-Error-Code": self.code, "X-Error-Message": self.message}
        headers |= {"X-Repo-Commit": self.commit} if self.commit else {}
        return self.status, headers, json.dumps({"error": self.message}).encode()


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's contents, which the Hub sends as a small file's oid and ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    """One repository of the cache: `<type>s--<org>--<name>/{refs,snapshots,blobs}`."""

    def __init__(self, cache: Path, repo_type: str, repo_id: str):
        self.type, self.id = repo_type, repo_id
        self.root = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"

    def exists(self) -> bool:
        return (self.root / "snapshots").is_dir()

    def commit(self, revision: str) -> str:
        """The commit a branch, tag or commit id names; RevisionNotFound otherwise."""
        ref = self.root / "refs" / revision
        if ".." not in Path(revision).parts and ref.is_file():
            return ref.read_text().strip()
        if COMMIT.match(revision) and (self.root / "snapshots" / revision).is_dir():
            return revision
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def files(self, commit: str) -> dict[str, Path]:
        """Path in the repository -> file, for every file of the commit's snapshot."""
        snapshot = self.root / "snapshots" / commit
        return {p.relative_to(snapshot).as_posix(): p for p in sorted(snapshot.rglob("*")) if p.is_file()}

    def entries(self, commit: str) -> dict[str, dict]:
        """Tree entries as the Hub lists them: every file and every folder, by path."""
        out = {}
        for path, file in self.files(commit).items():
            out[path] = {"type": "file", "oid": git_blob_id(file.read_bytes()), "size": file.stat().st_size}
            parts = path.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                folder = "/".join(parts[:depth])
                out.setdefault(folder, {"type": "directory", "oid": git_blob_id(folder.encode()), "size": 0})
        return {path: {**entry, "path": path} for path, entry in sorted(out.items())}


class FakeHub:
    """The server: `with FakeHub(cache) as hub: ... hub.url`. `requests` records (method, path, status)."""

    def __init__(self, cache: Path, raw: Path | None = None, gated: tuple[str, ...] = (), port: int = 0):
        self.cache, self.raw, self.gated = Path(cache), Path(raw) if raw else None, set(gated)
        self.requests: list[tuple[str, str, int]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def repo(self, repo_type: str | None, repo_id: str) -> Repo:
        repo = Repo(self.cache, repo_type or "model", repo_id)
        if not repo.exists() and repo_id not in self.gated:
            raise HubError(401, "RepoNotFound", "Repository not found")
        return repo

    def check_access(self, repo: Repo, authorized: bool) -> None:
        """Gated files: 401 without a token, 403 with one (its licence is not accepted)."""
        if repo.id not in self.gated:
            return
        if authorized:
            message = (
                f"Access to {repo.type} {repo.id} is restricted and you are not in the authorized list. "
                f"Visit https://huggingface.co/{repo.id} to ask for access."
            )
            raise HubError(403, "GatedRepo", message)
        message = (
            f"Access to {repo.type} {repo.id} is restricted. You must have access to it and be authenticated to access "
            "it. Please log in."
        )
        raise HubError(401, "GatedRepo", message)


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: the tests read hub.requests
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self._serve(body=True, form=parse_qs(self.rfile.read(length).decode()))

        def _serve(self, body: bool, form: dict | None = None) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            try:
                if (match := API.match(url.path)) and (match["op"] != "paths-info") == (form is None):
                    status, headers, data = self._api(match, query, form or {})
                elif (match := RESOLVE.match(url.path)) and form is None:
                    status, headers, data = self._resolve(match)
                elif url.path.startswith("/raw/") and hub.raw is not None and form is None:
                    status, headers, data = self._raw(unquote(url.path.removeprefix("/raw/")))
                else:
                    raise HubError(404, "NotFound", f"No route for {self.command} {url.path}")
            except HubError as error:
                status, headers, data = error.answer()
            hub.requests.append((self.command, url.path, status))
            self._send(status, headers, data, body)

        def _api(self, match: re.Match, query: dict, form: dict) -> tuple[int, dict, bytes]:
            repo = hub.repo(match["type"], match["repo"])
            if not repo.exists():  # a gated repo named without files here: refused like its files
                hub.check_access(repo, authorized="authorization" in {k.lower() for k in self.headers})
            commit = repo.commit(unquote(match["rev"] or "main"))
            entries = repo.entries(commit)
            if match["op"] in (None, "revision"):
                info = {
                    "id": repo.id,
                    "_id": hashlib.sha1(repo.id.encode()).hexdigest()[:24],
                    "author": repo.id.split("/")[0],
                    "sha": commit,
                    "lastModified": LAST_MODIFIED,
                    "private": False,
                    "gated": "manual" if repo.id in hub.gated else False,
                    "disabled": False,
                    "tags": [],
                    "siblings": [{"rfilename": p} for p, e in entries.items() if e["type"] == "file"],
                }
                return 200, {"Content-Type": "application/json"}, json.dumps(info).encode()
            if match["op"] == "tree":
                folder = unquote(match["path"] or "").strip("/")
                if folder and entries.get(folder, {}).get("type") != "directory":
                    raise HubError(404, "EntryNotFound", f"{folder} does not exist on {commit}", commit)
                recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                prefix = f"{folder}/" if folder else ""
                listed = [
                    e
                    for p, e in entries.items()
                    if p.startswith(prefix) and (recursive or "/" not in p.removeprefix(prefix))
                ]
                return 200, {"Content-Type": "application/json"}, json.dumps(listed).encode()
            asked = [p.strip("/") for p in form.get("paths", [])]
            found = [entries[p] for p in asked if p in entries]
            return 200, {"Content-Type": "application/json"}, json.dumps(found).encode()

        def _resolve(self, match: re.Match) -> tuple[int, dict, bytes]:
            repo = hub.repo(match["type"], match["repo"])
            hub.check_access(repo, authorized="authorization" in {k.lower() for k in self.headers})
            commit = repo.commit(unquote(match["rev"]))
            path = unquote(match["path"])
            file = repo.files(commit).get(path)
            if file is None:
                raise HubError(404, "EntryNotFound", f"{path} does not exist on {commit}", commit)
            data = file.read_bytes()
            headers = {"X-Repo-Commit": commit, "ETag": f'"{git_blob_id(data)}"', "Accept-Ranges": "bytes"}
            return self._ranged(data, headers | {"Content-Type": "application/octet-stream"})

        def _raw(self, path: str) -> tuple[int, dict, bytes]:
            file = (hub.raw / path).resolve()
            if hub.raw.resolve() not in file.parents or not file.is_file():
                raise HubError(404, "NotFound", f"{path} is not served")
            return self._ranged(file.read_bytes(), {"Content-Type": "text/plain; charset=utf-8"})

        def _ranged(self, data: bytes, headers: dict) -> tuple[int, dict, bytes]:
            """The whole file, or the one byte range asked (`Range: bytes=a-b`, `a-`, `-n`) as 206."""
            wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "").strip())
            if not wanted or not any(wanted.groups()):
                return 200, headers, data
            first, last = wanted.groups()
            start = int(first) if first else max(0, len(data) - int(last))
            end = min(int(last), len(data) - 1) if first and last else len(data) - 1
            if start >= len(data):
                raise HubError(416, "RangeNotSatisfiable", f"bytes {start}- of {len(data)}")
            return 206, headers | {"Content-Range": f"bytes {start}-{end}/{len(data)}"}, data[start : end + 1]

        def _send(self, status: int, headers: dict, data: bytes, body: bool) -> None:
            self.send_response(status, HTTPStatus(status).phrase)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.send_header("Date", email.utils.formatdate(usegmt=True))
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler


def client_env(endpoint: str, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a child process that talks to `endpoint` as its Hub: empty caches under `home`, no token,
    offline switches off, this checkout's kvzap first on the path; `extra` adds or replaces variables."""
    import kvzap

    src = Path(kvzap.__file__).resolve().parents[1]
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env |= {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home / "home"),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_DATASETS_CACHE": str(home / "datasets"),
        "KVZAP_EXTRACT_DIR": str(home / "extracted"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": os.pathsep.join([str(src), str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    return env | extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="the Hub cache folder to serve")
    parser.add_argument("--raw", type=Path, default=None, help="a folder served under /raw/")
    parser.add_argument("--gated", nargs="*", default=[], help="repo ids whose files need an accepted licence")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--port-file", type=Path, default=None, help="written with the port once it serves")
    args = parser.parse_args()
    hub = FakeHub(args.cache, args.raw, tuple(args.gated), args.port)
    print(f"fake Hub serving {args.cache} at {hub.url}", flush=True)
    if args.port_file:
        args.port_file.write_text(str(hub.server.server_address[1]))
    hub.server.serve_forever()


if __name__ == "__main__":
    main()
