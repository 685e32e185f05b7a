"""Small on-disk evaluation cells, laid out and shaped as kvzap.evaluation.job / kvzap.evaluation.merge write them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

TYPES = {"ruler": "ruler", "longbench": "longbench", "aime25": "aime25"}


def cell_dir(root: Path, model: str, bench: str, subset: str, method: str, value: float | None) -> Path:
    return root / model / "eval" / bench / subset / method / ("none" if value is None else f"{value:g}")


def write_cell(
    root: Path,
    model: str,
    bench: str,
    subset: str,
    method: str,
    value: float | None,
    *,
    ratio: float,
    average: float,
    **scores,
) -> Path:
    """A cell's metrics.json (benchmark type = the key before any '-', e.g. ruler-4k -> ruler)."""
    folder = cell_dir(root, model, bench, subset, method, value)
    folder.mkdir(parents=True, exist_ok=True)
    metrics = {
        "model": model,
        "bench": bench,
        "benchmark": TYPES[bench.split("-")[0]],
        "subset": subset,
        "method": method,
        "value": value,
        "compression_ratio": ratio,
        "n_samples": 10,
        "long_samples": {"policy": "run", "max_positions": 4096, "count": 0, "sample_ids": []},
        "average": average,
        "per_task": {subset: average},
        "provenance": {"model_id": f"org/{model}", "params_hash": f"{model}-{bench}-{subset}-{method}-{value}"},
        "json_columns": ["answers"],
        **scores,
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder / "metrics.json"


def write_aime_cell(
    root: Path, model: str, method: str, value: float | None, correct: list[list[bool]], ratio: float
) -> Path:
    """An AIME cell whose predictions.csv holds `correct[problem][rollout]`; its metrics come from aime.score."""
    from kvzap.evaluation.predictions import write_predictions
    from kvzap.evaluation.suites import aime

    rows = [
        {
            "sample_id": f"aime25-{p}",
            "task": "aime25",
            "question": f"problem {p}",
            "answer_prefix": "",
            "answers": [str(100 + p)],
            "max_new_tokens": 64,
            "rollout": r,
            "prediction": f"so \\boxed{{{100 + p if ok else 7}}}",
            "compression_ratio": ratio,
            "prompt_tokens": 9,
        }
        for p, rollouts in enumerate(correct)
        for r, ok in enumerate(rollouts)
    ]
    predictions = pd.DataFrame(rows)
    path = write_cell(root, model, "aime25", "aime25", method, value, ratio=ratio, **aime.score(predictions))
    write_predictions(predictions, path.parent / "predictions.csv")
    return path
