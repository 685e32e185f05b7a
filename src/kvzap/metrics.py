"""Benchmark metrics, each as the benchmark's official scorer defines it (scores in [0, 1])."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f]")


def _clean(prediction: str) -> str:
    return _CONTROL.sub("\n", prediction).strip().lower()


def string_match_all(prediction: str, references: list[str]) -> float:
    """RULER: the fraction of references found (case-insensitive substring) in the prediction."""
    text = _clean(prediction)
    return sum(ref.lower() in text for ref in references) / len(references)


def string_match_part(prediction: str, references: list[str]) -> float:
    """RULER qa tasks: 1 if any reference is found in the prediction."""
    text = _clean(prediction)
    return float(any(ref.lower() in text for ref in references))


def ruler_score(task: str, prediction: str, references: list[str]) -> float:
    return (string_match_part if task.startswith("qa") else string_match_all)(prediction, references)
