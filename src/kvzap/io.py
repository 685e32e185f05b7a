"""Atomic file writes: a killed job never leaves a file that looks complete."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path | str):
    """Yield a temporary path beside `path`; rename it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: Path | str, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: Path | str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
