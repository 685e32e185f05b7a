"""Every press signature docs/library.md and kvzap.pruning's docstring document is the code's, and calls as written."""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path

import pytest
import torch

import kvzap.pruning
from kvzap.pruning import KVzapPress, PrecomputedScorerPress, TopKPerHeadPress, TopKPerLayerPress

ROOT = Path(__file__).resolve().parents[1]
PRESSES = {cls.__name__: cls for cls in (KVzapPress, TopKPerHeadPress, TopKPerLayerPress)}
DOCUMENTED = re.compile(r"\b(KVzapPress|TopKPer(?:Head|Layer)Press)\((scorer, [^)]*)\)")


def rendered(cls) -> str:
    """The signature as the docs write it: names and defaults, '*' before the keyword-only ones."""
    words, star = [], False
    for p in inspect.signature(cls).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            words.append("*")
            star = True
        words.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return ", ".join(words)


def documented() -> list[tuple[str, str, str]]:
    sources = {"docs/library.md": (ROOT / "docs" / "library.md").read_text(), "kvzap.pruning": kvzap.pruning.__doc__}
    text = {name: re.sub(r"`\s*/?\s*\n\s*`?|\n\s+", " ", body) for name, body in sources.items()}
    return [(where, m.group(1), m.group(2)) for where, body in text.items() for m in DOCUMENTED.finditer(body)]


def test_every_press_is_documented_in_both_places():
    found = {(where, name) for where, name, _ in documented()}
    assert found == {(where, name) for where in ("docs/library.md", "kvzap.pruning") for name in PRESSES}


@pytest.mark.parametrize("where, name, signature", documented())
def test_documented_signature_is_the_code(where, name, signature):
    assert signature == rendered(PRESSES[name]), f"{where} documents {name}({signature})"


def _scorer():
    return PrecomputedScorerPress(scores=torch.zeros(1, 1, 4))


def test_positional_calls_as_kvpress_users_write_them():
    press = KVzapPress(_scorer(), -4.0, 64, True)  # DMSPress(press, threshold, sliding_window_size, decoding)
    assert (press.threshold, press.window, press.decoding, press.evict) == (-4.0, 64, True, True)
    head = TopKPerHeadPress(_scorer(), 0.5, 0)
    layer = TopKPerLayerPress(_scorer(), 0.25, 16, safeguard=0.1)
    assert (head.ratio, head.window, layer.ratio, layer.window, layer.safeguard) == (0.5, 0, 0.25, 16, 0.1)
    assert KVzapPress(_scorer(), -math.inf).window == 128


def test_keyword_only_parameters_refuse_positions():
    with pytest.raises(TypeError):
        KVzapPress(_scorer(), -4.0, 128, False, False)  # evict is keyword-only
    with pytest.raises(TypeError, match="threshold"):
        KVzapPress(_scorer())
    with pytest.raises(TypeError, match="decoding"):
        TopKPerHeadPress(_scorer(), 0.5, decoding=True)  # top-k judges a batch of tokens: prefill only
