"""The paper's result tables, computed from the per-cell rows of results.csv (see kvzap.report.aggregate).

Table 2 scores a benchmark entry (a benchmark key of the config: ruler-4k, longbench, aime25, ...) by the mean
over its subsets of each subset's score, and its compression ratio likewise: a RULER entry has one subset, so
it is the cell's average; LongBench is the mean over its 21 subset averages. AIME is scored by pass@4 (pass@1
where the cells hold fewer than 4 rollouts; the `metric` column says which). Every score carries its 95 %
interval (kvzap.intervals.mean_over_cells).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from kvzap.evaluation import methods
from kvzap.evaluation.predictions import read_predictions
from kvzap.evaluation.suites import aime
from kvzap.intervals import ci_columns, mean_over_cells

KVZAP_METHODS = methods.KVZAP_METHODS
AIME_TYPE = "aime25"
TABLE2_COLUMNS = [
    "model",
    "benchmark",
    "metric",
    "n_subsets",
    "full",
    "full_ci_low",
    "full_ci_high",
    "kvzap",
    "kvzap_ci_low",
    "kvzap_ci_high",
    "compression_ratio",
    "method",
    "value",
]
# Window ablation (paper §3.8): KVzap-MLP at the default window and the registry's window variants, each with the
# whole-prompt prefill (a chunked variant would be a second row at window 128).
WINDOWS = {
    name: info.protected_window
    for name, info in methods.METHODS.items()
    if info.parameter == "threshold" and info.surrogate == "mlp" and info.prefill_chunk is None
}
ABLATION_SUBSET = "lcc"


def _metric(group: pd.DataFrame) -> str:
    """One metric per (model, benchmark) entry, so that full cache and KVzap are compared on the same one."""
    if group.get("benchmark_type", pd.Series(dtype=str)).eq(AIME_TYPE).any():
        return "pass@4" if "pass@4" in group and group["pass@4"].notna().all() else "pass@1"
    return "average"


def benchmark_scores(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, benchmark, method, value): score and compression ratio averaged over the subsets."""
    parts = []
    for _, group in results.groupby(["model", "benchmark"], sort=True):
        metric = _metric(group)
        parts.append(group.assign(metric=metric, score=group[metric]))
    rows = []
    for keys, group in pd.concat(parts, ignore_index=True).groupby(
        ["model", "benchmark", "method", "value", "metric"], dropna=False, sort=True
    ):
        score, low, high = mean_over_cells(group, keys[-1])
        rows.append(
            dict(
                zip(["model", "benchmark", "method", "value", "metric"], keys),
                score=score,
                score_ci_low=low,
                score_ci_high=high,
                compression_ratio=group["compression_ratio"].mean(),
                n_subsets=group["subset"].nunique(),
            )
        )
    return pd.DataFrame(rows)


def _is_config(scores: pd.DataFrame, method: str, value: float) -> pd.Series:
    return (scores["method"] == method) & np.isclose(scores["value"].astype(float), float(value))


def _layout(scores: pd.DataFrame, model: str, method: str, value: float) -> list[dict]:
    """The paper's Table 2 rows of one model: full -> KVzap (compression ratio) per benchmark, then the average."""
    mine = scores[scores["model"] == model]
    full = mine[mine["method"] == "full"].set_index("benchmark")
    kvzap = mine[_is_config(mine, method, value)].set_index("benchmark")
    rows = []
    for bench in sorted(set(full.index) | set(kvzap.index)):
        cell = kvzap.loc[bench] if bench in kvzap.index else None
        reference = full.loc[bench] if bench in full.index else None
        rows.append(
            {
                "model": model,
                "benchmark": bench,
                "metric": (cell if cell is not None else reference)["metric"],
                "n_subsets": None if cell is None else int(cell["n_subsets"]),
                **_scored("full", reference),
                **_scored("kvzap", cell),
                "compression_ratio": None if cell is None else cell["compression_ratio"],
                "method": method,
                "value": float(value),
            }
        )
    rows.append(
        {
            "model": model,
            "benchmark": "average",
            "metric": "compression_ratio",
            "n_subsets": None,
            **_scored("full", None),
            **_scored("kvzap", None),
            "compression_ratio": kvzap["compression_ratio"].mean() if len(kvzap) else None,
            "method": method,
            "value": float(value),
        }
    )
    return rows


def _scored(name: str, row) -> dict:
    """A Table 2 score and its 95 % interval (kvzap.intervals), or None where the cell is missing."""
    keys = ("score", "score_ci_low", "score_ci_high")
    return dict(zip((name, f"{name}_ci_low", f"{name}_ci_high"), (None,) * 3 if row is None else map(row.get, keys)))


def _check_choice(model: str, choice) -> tuple[str, float]:
    if not isinstance(choice, dict) or set(choice) != {"method", "value"}:
        raise ValueError(f"Table 2 choice for {model!r} must be {{'method': ..., 'value': ...}}; got {choice!r}.")
    if choice["method"] not in KVZAP_METHODS:
        raise ValueError(f"Table 2 choice for {model!r}: method {choice['method']!r} is not one of {KVZAP_METHODS}.")
    return choice["method"], float(choice["value"])


def table2(results: pd.DataFrame, fixed: dict[str, dict]) -> pd.DataFrame:
    """Table 2 for one fixed KVzap configuration per model, e.g. {"qwen3-8b": {"method": "kvzap_mlp", "value": -4}}."""
    unknown = sorted(set(fixed) - set(results["model"]))
    if unknown:
        raise ValueError(
            f"Table 2 names model(s) {unknown} that have no cells; models with cells: "
            f"{sorted(results['model'].unique())}. Fix the config's tables.best keys."
        )
    scores = benchmark_scores(results)
    rows = [row for model, choice in fixed.items() for row in _layout(scores, model, *_check_choice(model, choice))]
    return pd.DataFrame(rows, columns=TABLE2_COLUMNS)


def _worst_drop(scores: pd.DataFrame, model: str, method: str, value: float) -> float:
    """Largest full-cache minus KVzap score over the model's benchmarks (inf if the config misses one)."""
    mine = scores[scores["model"] == model]
    full = mine[mine["method"] == "full"].set_index("benchmark")["score"]
    kvzap = mine[_is_config(mine, method, value)].set_index("benchmark")["score"]
    drops = full - kvzap.reindex(full.index)
    return float("inf") if drops.isna().any() else float(drops.max())


def best_configurations(results: pd.DataFrame, tolerance: float = 1.0) -> pd.DataFrame:
    """Per model, the KVzap configuration with the highest mean compression ratio whose benchmark scores (as in
    Table 2) all stay within `tolerance` points of the full cache; if none does, the one with the smallest drop."""
    scores = benchmark_scores(results)
    rows = []
    for model in sorted(scores["model"].unique()):
        configs = scores[(scores["model"] == model) & scores["method"].isin(KVZAP_METHODS)]
        if not (scores["model"].eq(model) & scores["method"].eq("full")).any() or configs.empty:
            continue
        candidates = []
        for (method, value), config in configs.groupby(["method", "value"]):
            drop = _worst_drop(scores, model, method, value)
            candidates.append(
                (
                    drop <= tolerance,
                    config["compression_ratio"].mean() if drop <= tolerance else -drop,
                    method,
                    value,
                    drop,
                )
            )
        ok, _, method, value, drop = max(candidates, key=lambda c: c[:2])
        rows += [
            {**row, "worst_drop": drop, "within_tolerance": ok, "tolerance": tolerance}
            for row in _layout(scores, model, method, value)
        ]
    return pd.DataFrame(rows, columns=TABLE2_COLUMNS + ["worst_drop", "within_tolerance", "tolerance"])


def window_ablation(results: pd.DataFrame) -> pd.DataFrame:
    """Paper §3.8: KVzap-MLP on LongBench LCC with sliding windows 0 / 128 / 512 (methods kvzap_mlp[_w<N>])."""
    cells = results[results["method"].isin(WINDOWS) & (results["subset"] == ABLATION_SUBSET)]
    low, high = ci_columns("average")
    table = cells.assign(
        window=cells["method"].map(WINDOWS).astype(int),
        score=cells["average"],
        score_ci_low=cells.get(low),
        score_ci_high=cells.get(high),
    )
    columns = ["model", "window", "value", "score", "score_ci_low", "score_ci_high", "compression_ratio"]
    return table[columns].sort_values(["model", "value", "window"]).reset_index(drop=True)


def rollout_counts(cell: Path) -> tuple[list[int], int]:
    """A cell folder's AIME predictions -> (correct answers per rollout, number of problems)."""
    metrics = json.loads((cell / "metrics.json").read_text())
    predictions = read_predictions(cell / "predictions.csv", metrics["json_columns"])
    scored = aime.score(predictions)
    return [scored["correct_by_rollout"][r] for r in sorted(scored["correct_by_rollout"])], scored["n_problems"]


def aime_rollouts(cells: list[tuple[dict, Path]]) -> pd.DataFrame:
    """Table 4: per AIME cell (its results row and folder), correct answers out of the problems per rollout and
    pass@1 = their sum / (problems x rollouts)."""
    rows = []
    for row, folder in cells:
        correct, n_problems = rollout_counts(folder)
        low, high = ci_columns("pass@1")
        rows.append(
            {
                "model": row["model"],
                "method": row["method"],
                "value": row["value"],
                "correct": correct,
                "pass@1": sum(correct) / (n_problems * len(correct)),
                "pass@1_ci_low": row[low] / 100,
                "pass@1_ci_high": row[high] / 100,
                "n_problems": n_problems,
                "compression_ratio": row["compression_ratio"],
            }
        )
    columns = [
        "model",
        "method",
        "value",
        "correct",
        "pass@1",
        "pass@1_ci_low",
        "pass@1_ci_high",
        "n_problems",
        "compression_ratio",
    ]
    return pd.DataFrame(rows, columns=columns).sort_values(
        ["model", "method", "value"], na_position="first", ignore_index=True
    )
