"""DuoAttention head patterns: which published pattern a model uses, and where its two files are read from.

The DuoAttention authors publish one pattern per model on GitHub (mit-han-lab/duo-attention,
attn_patterns/<folder>/config.json and full_attention_heads.tsv). kvpress downloads them by the model's name, with
a table that predates some Hub renames (it knows Llama-3.1 only as "meta-llama/Meta-Llama-3.1-8B-Instruct"). kvzap
reads them itself, by Hub id, so that:

- renamed Hub ids still find their pattern (PATTERNS below maps today's ids);
- a model without a published pattern is refused before any run starts (`duo_pattern_name` returns None);
- an offline run reads the same two files from a local mirror. Set the environment variable KVZAP_DUO_PATTERNS to a
  folder laid out like attn_patterns/ (<folder>/config.json, <folder>/full_attention_heads.tsv), or to another base
  URL. Unset, the files come from GitHub, as in kvpress. The files are parsed as kvpress parses them.

Importing this module imports neither torch nor kvpress: config checks call `duo_pattern_name` cheaply.
"""

from __future__ import annotations

import functools
import json
import os
from io import StringIO
from pathlib import Path
from urllib.parse import quote

import numpy as np

GITHUB_PATTERNS = "https://raw.githubusercontent.com/mit-han-lab/duo-attention/refs/heads/main/attn_patterns"
SOURCE_ENV = "KVZAP_DUO_PATTERNS"
FILES = ("config.json", "full_attention_heads.tsv")

# Hub model id -> pattern folder under attn_patterns/ (the folders kvpress's PATTERNS_DICT points at).
PATTERNS = {
    "togethercomputer/Llama-2-7B-32K-Instruct": "Llama-2-7B-32K-Instruct/lr=0.02-reg=0.05-ctx=1000_32000-multi_passkey10",
    "gradientai/Llama-3-8B-Instruct-Gradient-1048k": "Llama-3-8B-Instruct-Gradient-1048k/lr=0.02-reg=0.05-ctx=1000_32000-multi_passkey10",
    "gradientai/Llama-3-8B-Instruct-Gradient-4194k": "Llama-3-8B-Instruct-Gradient-4194k/lr=0.02-reg=0.05-ctx=1000_32000-multi_passkey10",
    "meta-llama/Llama-3.1-8B-Instruct": "Meta-Llama-3.1-8B-Instruct/lr=0.02-reg=0.05-ctx=1000_128000-multi_passkey10",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "Meta-Llama-3.1-8B-Instruct/lr=0.02-reg=0.05-ctx=1000_128000-multi_passkey10",
    "mistralai/Mistral-7B-Instruct-v0.2": "Mistral-7B-Instruct-v0.2/lr=0.02-reg=0.05-ctx=1000_32000-multi_passkey10",
    "mistralai/Mistral-7B-Instruct-v0.3": "Mistral-7B-Instruct-v0.3/lr=0.02-reg=0.05-ctx=1000_32000-multi_passkey10",
}


def duo_pattern_name(model_id: str) -> str | None:
    """The published DuoAttention pattern folder for `model_id`, or None when the authors published none."""
    return PATTERNS.get(model_id)


def require_pattern(model_id: str) -> str:
    folder = duo_pattern_name(model_id)
    if folder is None:
        raise ValueError(
            f"DuoAttention publishes no head pattern for {model_id!r} (published for: {', '.join(sorted(PATTERNS))}). "
            "Drop duo_attention for this model; duo_attention_on_the_fly computes head scores for any model."
        )
    return folder


def pattern_source() -> str:
    """Base URL or local folder the pattern files are read from (KVZAP_DUO_PATTERNS, else GitHub)."""
    return os.environ.get(SOURCE_ENV) or GITHUB_PATTERNS


def read_pattern(model_id: str) -> tuple[int, int, np.ndarray]:
    """(sink_size, recent_size, head scores of shape (layers, KV heads) clipped to [0, 1]) for `model_id`."""
    return _read_pattern(require_pattern(model_id), pattern_source())


@functools.cache
def _read_pattern(folder: str, source: str) -> tuple[int, int, np.ndarray]:
    # Cached: presses are re-initialised for every sample, and the files never change within a run.
    config, heads = (_read_text(source, folder, name) for name in FILES)
    config = json.loads(config)
    # As duo_attn.utils.load_attn_pattern (and kvpress) read it: tab-separated floats, clipped to [0, 1].
    scores = np.clip(np.loadtxt(StringIO(heads), dtype=float, delimiter="\t", ndmin=2), 0, 1)
    scores.flags.writeable = False
    return config["sink_size"], config["recent_size"], scores


def _read_text(source: str, folder: str, name: str) -> str:
    if source.startswith(("http://", "https://")):
        import requests  # only runs that download need it

        url = f"{source.rstrip('/')}/{quote(folder)}/{name}"
        response = requests.get(url, timeout=60)
        if response.status_code != 200:
            raise RuntimeError(
                f"Could not download the DuoAttention pattern file {url} (HTTP {response.status_code}); "
                f"check the network or point {SOURCE_ENV} at a local mirror."
            )
        return response.text
    path = Path(source) / folder / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: {SOURCE_ENV}={source} must be a folder laid out like "
            f"duo-attention's attn_patterns/ ({folder}/{FILES[0]} and {folder}/{FILES[1]})."
        )
    return path.read_text()
