"""The paper's claims judged on cells (kvzap.claims): paired differences computed by hand, and each verdict
reached from cells built to give it."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvzap import claims
from kvzap.claims import AGREES, DISAGREES, UNTESTABLE, Cell
from kvzap.intervals import paired_difference

TASKS = ["niah_single_1", "vt"]


def cell(method, value, scores, ratio, bench="ruler-4k", per_sample_ratio=None):
    """A cell of len(scores) samples split evenly over TASKS, its metrics as a run writes them."""
    n = len(scores)
    tasks = [TASKS[i * len(TASKS) // n] for i in range(n)]
    ratios = per_sample_ratio if per_sample_ratio is not None else [ratio] * n
    samples = pd.DataFrame(
        {"task": tasks, "score": np.asarray(scores, float), "ratio": ratios}, index=[f"s{i}" for i in range(n)]
    )
    per_task = samples.groupby("task")["score"].mean() * 100
    metrics = {
        "compression_ratio": ratio,
        "average": float(per_task.mean()),
        "average_ci": [0.0, 100.0],
        "per_task": per_task.to_dict(),
        "per_task_ci": {t: [0.0, 100.0] for t in per_task.index},
        "model": "m",
    }
    return Cell(bench, method, value, metrics, samples)


def test_paired_difference_is_the_task_mean_of_the_differences():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 2, 60), rng.integers(0, 2, 60)
    tasks = np.repeat(["x", "y", "z"], [10, 20, 30])
    by_task = [(a[tasks == t] - b[tasks == t]).mean() for t in ("x", "y", "z")]
    diff, low, high = paired_difference(a, b, tasks)
    assert diff == pytest.approx(100 * np.mean(by_task), abs=0.01)
    assert low <= diff <= high
    same, low0, high0 = paired_difference(a, a, tasks)
    assert (same, low0, high0) == (0, 0, 0)  # a method against itself: no difference, no noise


def test_holding_the_full_cache_agrees_disagrees_or_cannot_tell():
    full = cell("full", "none", [1] * 40, 0.0)
    same = cell("kvzap_mlp", "-3", [1] * 40, 0.7)
    assert claims.holds_full_cache([full, same])["verdict"] == AGREES
    worse = cell("kvzap_mlp", "-3", [1] * 10 + [0] * 30, 0.7)
    assert claims.holds_full_cache([full, worse])["verdict"] == DISAGREES
    few = [cell("full", "none", [1, 1, 1, 1], 0.0), cell("kvzap_mlp", "-3", [1, 0, 1, 0], 0.7)]
    assert claims.holds_full_cache(few)["verdict"] == UNTESTABLE
    unsure, lossy = cell("kvzap_mlp", "-3", [1] * 37 + [0] * 3, 0.6), cell("kvzap_linear", "-3", [1, 0] * 20, 0.7)
    mixed = claims.holds_full_cache([full, unsure, lossy])
    assert mixed["verdict"] == UNTESTABLE and mixed["why"].endswith("losses beyond the noise: kvzap_linear -3")
    low_ratio = cell("kvzap_mlp", "-5", [1] * 40, 0.3)
    assert claims.holds_full_cache([full, low_ratio])["verdict"] == UNTESTABLE


def test_references_are_compared_at_matched_ratios_on_the_same_entry():
    kvzip = cell("kvzip", "0.75", [1] * 40, 0.75, bench="few")
    near = cell("kvzap_mlp", "-3", [1] * 40, 0.78, bench="few")
    far = cell("kvzap_linear", "-3", [0] * 40, 0.60, bench="few")  # outside MATCH: not compared
    other_entry = cell("kvzap_linear", "-4", [0] * 40, 0.75)  # other samples: never paired
    result = claims.matches_reference([kvzip, near, far, other_entry], "c", "p", "KVzap", "kvzip", claims.SURROGATES)
    assert result["verdict"] == AGREES and [d["a"] for d in result["comparisons"]] == [near.label]
    none = claims.matches_reference([kvzip, far], "c", "p", "KVzap", "kvzip", claims.SURROGATES)
    assert none["verdict"] == UNTESTABLE and "no KVzap cell" in none["why"]
    absent = claims.matches_reference([near, far], "c", "p", "KVzap", "kvzip", claims.SURROGATES)
    assert absent["verdict"] == UNTESTABLE and absent["why"].startswith("kvzip was not run")


def test_threshold_against_topk_reads_no_gap_as_a_disagreement():
    topk = cell("kvzap_mlp_head", "0.75", [1] * 30 + [0] * 10, 0.75)
    better = cell("kvzap_mlp", "-3", [1] * 40, 0.74)
    assert claims.threshold_beats_topk([topk, better])["verdict"] == AGREES
    equal = cell("kvzap_mlp", "-3", [1] * 30 + [0] * 10, 0.74)
    assert claims.threshold_beats_topk([topk, equal])["verdict"] == DISAGREES
    worse = cell("kvzap_mlp", "-3", [1] * 10 + [0] * 30, 0.74)
    assert claims.threshold_beats_topk([topk, worse])["verdict"] == DISAGREES


def test_window_collapse_and_adaptive_ratios():
    base = cell("kvzap_mlp", "-3", [1] * 40, 0.7)
    w512 = cell("kvzap_mlp_w512", "-3", [1] * 40, 0.7)
    collapsed = cell("kvzap_mlp_w0", "-3", [0] * 40, 0.8)
    assert claims.window_needed([base, w512, collapsed])["verdict"] == AGREES
    kept = cell("kvzap_mlp_w0", "-3", [1] * 40, 0.8)
    assert claims.window_needed([base, w512, kept])["verdict"] == DISAGREES
    assert claims.window_needed([base, w512])["verdict"] == UNTESTABLE
    full = cell("full", "none", [1] * 40, 0.0)
    spread = cell("kvzap_mlp", "-3", [1] * 40, 0.7, per_sample_ratio=[0.6] * 20 + [0.8] * 20)
    assert claims.ratio_adapts([full, spread])["verdict"] == AGREES
    flat = cell("kvzap_mlp", "-3", [1] * 40, 0.7)
    assert claims.ratio_adapts([full, flat])["verdict"] == DISAGREES


def test_accuracy_is_judged_only_where_the_full_cache_scores():
    """A task the full cache fails (0 on every row) would add differences of 0 and pass a loss for agreement.
    Here KVzap-MLP loses 30 points on niah_single_1 only."""
    full = cell("full", "none", [1] * 20 + [0] * 20, 0.0)  # niah_single_1 all right, vt all wrong
    lossy = cell("kvzap_mlp", "-3", [1] * 14 + [0] * 26, 0.7, per_sample_ratio=[0.6] * 20 + [0.8] * 20)
    assert claims.informative_tasks([full, lossy]) == ["niah_single_1"]
    on_both = claims.difference(lossy, full)
    judged = claims.judge([full, lossy], {})[0]
    assert on_both["difference"] == pytest.approx(-15.0, abs=0.01) and on_both["n_samples"] == 40
    assert judged["comparisons"][0]["difference"] == pytest.approx(-30.0, abs=0.01)
    assert judged["comparisons"][0]["n_samples"] == 20 and judged["verdict"] == DISAGREES
    ratios = claims.judge([full, lossy], {})[-1]  # the ratio claim reads every task
    assert "tasks 0.60-0.80" in ratios["measured"]


def test_fit_claim_reads_the_intervals():
    fit = lambda r2, low, high: {"r2_mean": r2, "r2_mean_ci": [low, high], "n_test_pairs": 10}  # noqa: E731
    assert claims.mlp_fits_better({"mlp": fit(0.7, 0.68, 0.72), "linear": fit(0.6, 0.58, 0.62)})["verdict"] == AGREES
    assert claims.mlp_fits_better({"mlp": fit(0.6, 0.5, 0.7), "linear": fit(0.6, 0.55, 0.65)})["verdict"] == UNTESTABLE
    assert claims.mlp_fits_better({"mlp": fit(0.5, 0.48, 0.52), "linear": fit(0.6, 0.58, 0.62)})["verdict"] == DISAGREES


def test_a_run_on_disk_becomes_a_record(tmp_path, monkeypatch):
    """load_cells reads the cells a run wrote (predictions.csv, metrics.json as the job writes them), seeds averaged
    per sample; build names every claim and every cell's tasks."""
    from kvzap.evaluation.predictions import seed_averages, write_predictions
    from kvzap.evaluation.suites import ruler
    from kvzap.plan import paths
    from kvzap.plan.sweep import cells as config_cells
    from plan_helpers import BASE, planned

    monkeypatch.chdir(tmp_path)  # a config's results root lies under results/
    config = planned({**BASE, "results": "results/run"})
    written = 0
    for c in config_cells(config):
        if config["evaluation"]["benchmarks"][c.bench]["benchmark"] != "ruler":
            continue
        correct = c.method in ("full", "kvzap_mlp")  # the others miss every needle
        seeds = [42, 43] if c.method == "kvzap_mlp" else [None]
        rows = pd.DataFrame(
            [
                {
                    "sample_id": f"{task}-{i}",
                    "task": task,
                    "answers": ["4711"],
                    "prediction": "4711" if correct else "no",
                }
                | {"compression_ratio": 0.0 if c.method == "full" else 0.6 + 0.01 * i}
                | ({} if seed is None else {"seed": seed})
                for task in TASKS
                for i in range(6)
                for seed in seeds
            ]
        )
        folder = Path(paths.cell_dir(config["results"], c))
        folder.mkdir(parents=True)
        metrics = ruler.score(rows) | {"compression_ratio": float(rows["compression_ratio"].mean()), "model": c.model}
        metrics["seeds"] = seed_averages(ruler.score, rows)
        metrics["json_columns"] = write_predictions(rows, folder / "predictions.csv")
        (folder / "metrics.json").write_text(json.dumps(metrics))
        written += 1
    loaded = claims.load_cells(config)
    assert len(loaded) == written and all(len(c.samples) == 12 for c in loaded)
    mlp = next(c for c in loaded if c.method == "kvzap_mlp")
    assert mlp.samples["score"].tolist() == [1.0] * 12  # two seeds' rows, one sample each
    by_seed = claims.load_cells(config, by_seed=True)  # each seeded cell, then each of its seeds alone
    seeded = [c for c in by_seed if c.seed is not None]
    assert len(by_seed) == written + len(seeded) and {c.method for c in seeded} == {"kvzap_mlp"}
    assert sorted({c.seed for c in seeded}) == [42, 43]
    assert len(seeded) == 2 * sum(c.method == "kvzap_mlp" for c in loaded)
    assert all(len(c.samples) == 12 and c.metrics["average"] == 100.0 and f"seed {c.seed}" in c.label for c in seeded)
    (tmp_path / "run.yaml").write_text(json.dumps(config))  # JSON is YAML
    claims.main(["--config", "run.yaml", "--stage-s", "oracle=10", "evaluation=2", "--out", "record.json"])
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["wall_s"] == 12.0 and record["stage_s"] == {"oracle": 10.0, "evaluation": 2.0}
    assert len(record["claims"]) == 9
    assert {r["task"] for r in record["cells"]} == {"average", *TASKS}
    held = record["claims"][0]
    assert held["verdict"] == AGREES and "kvzap_mlp" in held["measured"]
