"""Write repositories into a Hugging Face Hub cache folder, laid out as huggingface_hub itself lays them out.

With HF_HUB_CACHE pointing at that folder and HF_HUB_OFFLINE=1, `snapshot_download`, `hf_hub_download` and
`from_pretrained(<repo id>)` resolve these files exactly as they resolve a real download: the rehearsal of
config/paper.yaml goes through the pipeline's real Hub code path without a network.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

FileSource = bytes | str | Path  # file contents, or a file on disk to copy


def _bytes(source: FileSource) -> bytes:
    return source if isinstance(source, bytes) else Path(source).read_bytes()


def write_repo(
    cache: Path, repo_id: str, files: dict[str, FileSource], repo_type: str = "model", revision: str = "main"
) -> Path:
    """Store `files` (path in repo -> contents) as one commit of `repo_id`; returns the snapshot folder."""
    blobs = {name: _bytes(source) for name, source in files.items()}
    commit = hashlib.sha1(
        repr(sorted((n, hashlib.sha256(b).hexdigest()) for n, b in blobs.items())).encode()
    ).hexdigest()
    root = Path(cache) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    if snapshot.exists():
        shutil.rmtree(snapshot)
    for name, data in blobs.items():
        digest = hashlib.sha256(data).hexdigest()
        blob = root / "blobs" / digest
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(*[".."] * (len(Path(name).parts) + 1), "blobs", digest))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    return snapshot
