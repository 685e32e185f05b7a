"""Provenance stamped into every output: which code, which settings, which model, which seed."""

from __future__ import annotations

import hashlib
import json
import subprocess
from functools import lru_cache
from pathlib import Path

import kvzap


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The checkout's commit (with '+dirty' when it has uncommitted changes), or 'unknown' outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def params_hash(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]


def stamp(params: dict, model_record: dict | None = None, seed: int | None = None) -> dict:
    """A dict to store beside (or inside) an output."""
    return {
        "kvzap_version": kvzap.__version__,
        "git_commit": git_commit(),
        "params": params,
        "params_hash": params_hash(params),
        "model_id": (model_record or {}).get("model_id"),
        "model_revision": (model_record or {}).get("revision"),
        "seed": seed,
    }
