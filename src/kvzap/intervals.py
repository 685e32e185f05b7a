"""95 % intervals for every score the pipeline reports, so a reader can tell a difference from noise.

- A share of 0/1 outcomes (an accuracy): the Wilson score interval, which stays inside [0, 1] and is sound at
  small n and at 0 % or 100 %, where the normal approximation collapses to a point.
- Any other mean (partial credit, F1, a mean over tasks, R^2): a percentile bootstrap over the independent
  units (samples, stratified by task so every resample keeps each task's size; test prompts for R^2).
Scores on the 0-100 scale come back on that scale. Resampling is seeded, so reruns give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile
N_BOOTSTRAP = 2000
SEED = 0


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion successes / n."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap(
    statistic: Callable[[np.ndarray], float],
    n_units: int,
    strata: np.ndarray | None = None,
    n_resamples: int = N_BOOTSTRAP,
    seed: int = SEED,
) -> tuple[float, float]:
    """Percentile interval of statistic(indices of resampled units); resampled within strata when given."""
    rng = np.random.default_rng(seed)
    groups = [np.arange(n_units)] if strata is None else [np.flatnonzero(strata == s) for s in np.unique(strata)]
    values = np.array(
        [statistic(np.concatenate([rng.choice(g, size=len(g)) for g in groups])) for _ in range(n_resamples)]
    )
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan, math.nan
    return float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975))


def mean_interval(scores) -> tuple[float, float]:
    """95 % interval of the mean of per-sample scores in [0, 1]: Wilson when they are all 0 or 1, else bootstrap."""
    scores = np.asarray(scores, dtype=float)
    if np.isin(scores, (0.0, 1.0)).all():
        return wilson(scores.sum(), len(scores))
    return bootstrap(lambda idx: scores[idx].mean(), len(scores))


def percent_of_total(values: list[float]) -> float:
    """100 x the mean, in the order of operations of kvpress's LongBench scorer (a running total, x100, / n), so
    that a mean on a rounding boundary rounds as the paper's numbers did."""
    total = 0.0
    for value in values:
        total += value
    return 100 * total / len(values)


def task_scores(
    per_row: pd.Series,
    order: list[str] | tuple[str, ...] = (),
    percent: Callable[[list[float]], float] = percent_of_total,
) -> dict:
    """Per-sample scores in [0, 1] indexed by task -> per-task means and their mean over tasks (x100), each with
    its 95 % interval: {"per_task": {t: s}, "per_task_ci": {t: [lo, hi]}, "average": a, "average_ci": [lo, hi]};
    the per-task entries follow `order` (a benchmark's task list), tasks outside it after them, sorted, each
    computed by `percent` from its rows in order (a benchmark's reference arithmetic)."""
    tasks = per_row.index.to_numpy()
    values = per_row.to_numpy(dtype=float)
    per_task = per_row.groupby(level=0, sort=False).agg(lambda group: percent(group.tolist()))
    rank = {task: i for i, task in enumerate(order)}
    per_task = per_task.loc[sorted(per_task.index, key=lambda task: (rank.get(task, len(rank)), task))]
    per_task_ci = {task: _percent(mean_interval(values[tasks == task])) for task in per_task.index}
    names, codes = np.unique(tasks, return_inverse=True)

    def average(idx: np.ndarray) -> float:
        sums = np.bincount(codes[idx], weights=values[idx], minlength=len(names))
        return float((sums / np.bincount(codes[idx], minlength=len(names))).mean())

    average_ci = per_task_ci[names[0]] if len(names) == 1 else _percent(bootstrap(average, len(values), codes))
    return {
        "per_task": {t: round(float(s), 2) for t, s in per_task.items()},
        "per_task_ci": per_task_ci,
        "average": round(float(per_task.mean()), 2),
        "average_ci": average_ci,
    }


def ci_columns(metric: str) -> tuple[str, str]:
    """Where results.csv keeps a score column's interval."""
    return f"ci_low:{metric}", f"ci_high:{metric}"


def mean_over_cells(cells: pd.DataFrame, metric: str) -> tuple[float, float, float]:
    """(mean, low, high) of a score over cells (LongBench's subsets, say): one cell keeps its own interval; a mean
    of k cells gets the normal approximation from theirs, half-width sqrt(sum h_i^2) / k (independent samples)."""
    low, high = ci_columns(metric)
    mean = float(cells[metric].mean())
    if low not in cells or cells[low].isna().any():
        return mean, math.nan, math.nan
    if len(cells) == 1:
        return mean, float(cells[low].iloc[0]), float(cells[high].iloc[0])
    half = float(np.sqrt((((cells[high] - cells[low]) / 2) ** 2).sum()) / len(cells))
    return mean, mean - half, mean + half


def paired_difference(a: np.ndarray, b: np.ndarray, tasks: np.ndarray) -> tuple[float, float, float]:
    """Two methods scored (in [0, 1]) on the same samples: the difference of their task-averaged scores (a - b, x100)
    and its 95 % interval, resampling samples within tasks. Pairing removes what the samples share (a hard needle
    is hard for both), so the interval is far narrower than the two cells' own intervals suggest."""
    names, codes = np.unique(tasks, return_inverse=True)
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)

    def average(idx: np.ndarray) -> float:
        sums = np.bincount(codes[idx], weights=diff[idx], minlength=len(names))
        return float((sums / np.bincount(codes[idx], minlength=len(names))).mean())

    low, high = bootstrap(average, len(diff), codes)
    return round(100 * average(np.arange(len(diff))), 2), round(100 * low, 2), round(100 * high, 2)


def _percent(interval: tuple[float, float]) -> list[float]:
    return [round(100 * float(interval[0]), 2), round(100 * float(interval[1]), 2)]
