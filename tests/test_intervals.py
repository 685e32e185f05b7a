"""95 % intervals (kvzap.intervals), each checked against an independent computation."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from kvzap import intervals
from kvzap.training import fit


def _wilson_by_inversion(k: int, n: int) -> tuple[float, float]:
    """The Wilson interval as its definition: every p whose score test |k/n - p| <= z sqrt(p (1-p) / n) accepts."""
    grid = np.linspace(0, 1, 2_000_001)
    accepted = grid[np.abs(k / n - grid) <= intervals.Z95 * np.sqrt(grid * (1 - grid) / n)]
    return accepted.min(), accepted.max()


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (17, 60), (1, 1)])
def test_wilson_matches_the_inverted_score_test(k, n):
    low, high = intervals.wilson(k, n)
    ref_low, ref_high = _wilson_by_inversion(k, n)
    assert low == pytest.approx(ref_low, abs=2e-6) and high == pytest.approx(ref_high, abs=2e-6)


def test_accuracies_use_wilson_and_partial_credit_the_bootstrap():
    assert intervals.mean_interval([1, 0, 1, 1]) == intervals.wilson(3, 4)
    low, high = intervals.mean_interval([0.5, 0.5, 0.5])
    assert low == high == 0.5  # no spread, no uncertainty left to resample


def test_stratified_bootstrap_keeps_each_task_size():
    seen = []
    tasks = np.array([0] * 3 + [1] * 7)
    intervals.bootstrap(lambda idx: seen.append(np.bincount(tasks[idx], minlength=2)) or 0.0, 10, tasks, n_resamples=50)
    assert all(list(counts) == [3, 7] for counts in seen)


def test_task_scores_average_interval_covers_the_average():
    per_row = pd.Series([1, 0, 1, 1, 0, 1, 0.5, 1.0], index=["a"] * 4 + ["b"] * 4)
    scores = intervals.task_scores(per_row)
    assert scores["average"] == pytest.approx(100 * (0.75 + 0.625) / 2)
    low, high = scores["average_ci"]
    assert low < scores["average"] < high
    assert scores["per_task_ci"]["a"] == [round(100 * v, 2) for v in intervals.wilson(3, 4)]


def test_mean_over_cells_combines_half_widths():
    cells = pd.DataFrame({"average": [50.0, 70.0], "ci_low:average": [40.0, 64.0], "ci_high:average": [60.0, 76.0]})
    mean, low, high = intervals.mean_over_cells(cells, "average")
    half = math.sqrt(10**2 + 6**2) / 2
    assert (mean, low, high) == pytest.approx((60.0, 60.0 - half, 60.0 + half))
    assert intervals.mean_over_cells(cells.iloc[:1], "average") == (50.0, 40.0, 60.0)


def test_r2_resamples_whole_prompts(monkeypatch):
    """The per-prompt sums give exactly the R^2 of the resampled pairs, duplicates included."""
    gen = torch.Generator().manual_seed(0)
    y_true = torch.randn(60, 2, 3, generator=gen)
    y_pred = y_true + torch.randn(60, 2, 3, generator=gen)
    prompts = torch.arange(60) // 10  # 6 prompts of 10 pairs
    statistics = []
    monkeypatch.setattr(fit, "bootstrap", lambda statistic, n: statistics.append(statistic) or (0.0, 0.0))
    fit.r2_interval(y_true, y_pred, prompts)
    for chosen in (np.arange(6), np.array([0, 0, 3, 5, 5, 5])):
        rows = torch.cat([torch.arange(p * 10, p * 10 + 10) for p in chosen])
        expected = fit.squared_pearson(y_true[rows], y_pred[rows]).mean().item()
        assert statistics[0](chosen) == pytest.approx(expected, rel=1e-6)  # squared_pearson is float32


def test_task_scores_follow_the_benchmarks_task_order():
    per_row = pd.Series([1.0, 0.0, 1.0, 1.0], index=["b", "a", "c", "a"])
    scores = intervals.task_scores(per_row, ("c", "a"))
    assert list(scores["per_task"]) == list(scores["per_task_ci"]) == ["c", "a", "b"]
    assert scores["per_task"] == {"c": 100.0, "a": 50.0, "b": 100.0}
