"""docs/layout.md names every module of src/kvzap, so the map cannot drift from the tree."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_layout_names_every_module():
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    modules = sorted(p for p in (ROOT / "src" / "kvzap").rglob("*.py") if p.name != "__init__.py")
    named = lambda name: re.search(rf"(?<![\w.]){re.escape(name)}\b", text)  # noqa: E731 - fill.py is not prefill.py
    assert modules
    assert [str(p.relative_to(ROOT)) for p in modules if not named(p.name)] == []
