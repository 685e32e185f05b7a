"""Predictions tables on disk: CSV for people and pandas, list-valued columns (answers, classes) as JSON; and the
per-sample measurements a cell's metrics.json averages."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from kvzap.atomic import atomic_path


def write_predictions(predictions: pd.DataFrame, path: Path) -> list[str]:
    """Write atomically; returns the names of the columns stored as JSON."""
    json_columns = [c for c in predictions if predictions[c].map(lambda v: isinstance(v, (list, tuple, dict))).any()]
    encoded = predictions.assign(**{c: predictions[c].map(json.dumps) for c in json_columns})
    with atomic_path(path) as tmp:
        encoded.to_csv(tmp, index=False)
    return json_columns


def read_predictions(path: Path, json_columns: list[str]) -> pd.DataFrame:
    """Inverse of write_predictions (empty predictions stay empty strings, not NaN)."""
    frame = pd.read_csv(path, keep_default_na=False, dtype={"sample_id": str, "prediction": str})
    return frame.assign(**{c: frame[c].map(json.loads) for c in json_columns})


# Per-sample measurements, averaged into metrics.json under the same names: the compression ratio (a hybrid model's:
# over its full-attention layers), and the KV bytes held after the prefill over every layer and the full cache's
# (greedy cells; sampled rollouts do not measure them).
KV_MEMORY = ("kv_bytes", "full_kv_bytes")
MEASUREMENTS = ("compression_ratio", *KV_MEMORY)


def measured_means(predictions: pd.DataFrame) -> dict:
    return {key: float(predictions[key].mean()) for key in MEASUREMENTS if key in predictions}


def mean_over_seeds(per_row: pd.Series, predictions: pd.DataFrame) -> pd.Series:
    """Per-row scores (indexed by task) of a cell evaluated with several surrogate seeds (a `seed` column) -> one
    score per sample, its mean over the seeds, so that intervals resample samples (the independent units) and the
    average is the mean of the seeds' averages. Without seeds, the scores as they are, in row order."""
    if "seed" not in predictions:
        return per_row
    frame = pd.DataFrame(
        {"sample": predictions["sample_id"].to_numpy(), "task": per_row.index, "score": per_row.values}
    )
    means = frame.groupby(["sample", "task"], sort=False)["score"].mean()
    return pd.Series(means.to_numpy(), index=means.index.get_level_values("task"))


def seed_averages(score, predictions: pd.DataFrame) -> dict[str, float]:
    """Each surrogate seed's own average, {seed: score(its rows)["average"]}; {} for a cell without seeds."""
    if "seed" not in predictions:
        return {}
    return {str(seed): score(rows)["average"] for seed, rows in predictions.groupby("seed", sort=True)}
