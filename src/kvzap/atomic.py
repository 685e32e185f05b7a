"""Atomic file writes: a killed job never leaves a file that looks complete.

Outputs get the mode `open()` would give them (0666 & ~umask), so a group-shared project directory
stays readable by the group: tempfile.mkstemp would force 0600, and so do writers that replace the
temporary file with their own (safetensors' save_file does), hence the mode is restored before the rename.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from pathlib import Path


def _create_temporary(path: Path) -> Path:
    """A new, empty, hidden file beside `path`; O_EXCL guarantees it is ours, mode 0666 lets the umask apply."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    return tmp


@contextlib.contextmanager
def atomic_path(path: Path | str):
    """Yield a temporary path beside `path`; rename it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temporary(path)
    mode = stat.S_IMODE(tmp.stat().st_mode)  # what the umask (and any default ACL) gave a new file here
    try:
        yield tmp
        if stat.S_IMODE(tmp.stat().st_mode) != mode:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: Path | str, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: Path | str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
