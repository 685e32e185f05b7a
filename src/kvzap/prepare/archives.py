"""An archive extracted once per content, atomically, outside the Hub cache.

Several first jobs of a cluster run read the same downloaded archive at once, and a shared Hub cache may be
read-only: so the archive is extracted into kvzap's own cache, in a folder named by the archive's content hash,
through a private temporary folder that is renamed into place when complete. A reader sees the whole folder or
none; when two processes race, the first rename wins and the other drops its copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

ENV_DIR = "KVZAP_EXTRACT_DIR"


def extract_root() -> Path:
    """$KVZAP_EXTRACT_DIR, else $XDG_CACHE_HOME (or ~/.cache)/kvzap/extracted."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvzap" / "extracted"


def content_key(archive: Path) -> str:
    """The Hub cache names a blob by its sha256; any other file is hashed here."""
    blob = Path(archive).resolve()
    if blob.parent.name == "blobs" and len(blob.name) == 64:
        return blob.name
    digest = hashlib.sha256()
    with blob.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def extracted(archive: Path, root: Path | None = None) -> Path:
    """The folder holding `archive`'s extracted members, extracting it first if no process has yet."""
    root = Path(root or extract_root())
    target = root / f"{Path(archive).stem}-{content_key(archive)[:16]}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(partial)
        os.rename(partial, target)  # atomic; fails if another process renamed its copy first
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target
