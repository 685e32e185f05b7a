"""The paper's claims judged on one run's RULER cells: each with the paper's number, the run's, and a verdict
(agrees, disagrees or not testable, and why). docs/results.md's verdict table and benchmarks/cpu/paper_small.json.

Every comparison is paired: two methods of one benchmark entry run on the same samples, so their difference is taken
sample by sample, with a 95 % interval resampling samples within tasks (kvzap.intervals.paired_difference). Two cells
are compared "at the same compression" when their measured ratios are within MATCH. A claim that A keeps B's accuracy
agrees when the interval rules out a loss of DELTA points or more, disagrees when A is worse beyond the noise by a
margin the interval cannot exclude from DELTA, and is not testable when the interval is too wide to tell. Accuracy
claims are judged on the tasks where the full cache scores FLOOR points or more: where it scores 0, every method
scores 0 and their differences of 0 would narrow the interval and pass for agreement.

    python -m kvzap.claims --config config/paper_small.yaml --wall-s 5100 --out paper_small.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from kvzap import dtypes
from kvzap.atomic import atomic_write_json
from kvzap.evaluation.metrics import ruler_score
from kvzap.evaluation.predictions import read_predictions
from kvzap.intervals import paired_difference
from kvzap.plan import overlays, paths
from kvzap.plan.sweep import cells as config_cells
from kvzap.refusal import Refusal, entry_point

DELTA = 5.0  # points: the smallest loss a verdict calls a loss (the paper's Table 2 gaps are all below 1 point)
MATCH = 0.06  # two cells are at the same compression when their ratios differ by at most this
FLOOR = 20.0  # points: below this on the full cache, a task cannot show what pruning loses
AGREES, DISAGREES, UNTESTABLE = "agrees", "disagrees", "not testable"
SURROGATES = {"kvzap_mlp": "KVzap-MLP", "kvzap_linear": "KVzap-Linear"}


@dataclass
class Cell:
    """One evaluated cell and its per-sample scores (in [0, 1], the mean over surrogate seeds) and ratios."""

    bench: str
    method: str
    value: str
    metrics: dict
    samples: pd.DataFrame  # sample_id (index), task, score, ratio
    seed: int | None = None  # one surrogate seed's runs of a seeded cell (load_cells(by_seed=True)); None: all

    @property
    def ratio(self) -> float:
        return float(self.metrics["compression_ratio"])

    @property
    def label(self) -> str:
        seed = "" if self.seed is None else f" seed {self.seed}"
        return f"{self.method} {self.value}{seed} (ratio {self.ratio:.2f})"


def load_cells(config: dict, by_seed: bool = False) -> list[Cell]:
    """Every RULER cell of the config that exists under its results root (a run may be partial); by_seed: a seeded
    cell also as one Cell per surrogate seed, after the cell itself (whose per-sample score is the seeds' mean)."""
    out = []
    for cell in config_cells(config):
        if config["evaluation"]["benchmarks"][cell.bench]["benchmark"] != "ruler":
            continue
        folder = Path(paths.cell_dir(config["results"], cell))
        if not (folder / "metrics.json").is_file():
            continue
        metrics = json.loads((folder / "metrics.json").read_text())
        rows = read_predictions(folder / "predictions.csv", metrics["json_columns"])
        rows = rows.assign(
            score=[ruler_score(t, p, list(a)) for t, p, a in zip(rows["task"], rows["prediction"], rows["answers"])],
            ratio=rows["compression_ratio"],
        )
        out.append(Cell(cell.bench, cell.method, cell.value, metrics, _per_sample(rows)))
        if by_seed and "seed" in rows:
            for seed, own in rows.groupby("seed", sort=True):
                ratio = float(own["ratio"].mean())
                seed_metrics = metrics | {"compression_ratio": ratio, "average": metrics["seeds"][str(seed)]}
                seed_metrics |= {"average_ci": None, "per_task": None, "per_task_ci": None}  # not the seed's: unset
                out.append(Cell(cell.bench, cell.method, cell.value, seed_metrics, _per_sample(own), int(seed)))
    return out


def _per_sample(rows: pd.DataFrame) -> pd.DataFrame:
    """sample_id (index), task, score and ratio, each the mean over the sample's rows (one per surrogate seed)."""
    samples = rows.groupby("sample_id", sort=False).agg(task=("task", "first"), score=("score", "mean"))
    samples["ratio"] = rows.groupby("sample_id", sort=False)["ratio"].mean()
    return samples


def record_cells(cells: list[Cell], context: dict) -> list[dict]:
    """The record's cells: per cell, its average and each task's score with 95 % interval, ratio and sample count."""
    out = []
    for cell in cells:
        per_task = cell.samples.groupby("task", sort=False)
        seeds = sorted(int(s) for s in cell.metrics.get("seeds") or {})
        common = {
            "benchmark": cell.bench,
            "context": context[cell.bench],
            "method": cell.method,
            "value": None if cell.value == "none" else float(cell.value),
            "seed": seeds or None,
        }
        out.append(
            common
            | {"task": "average", "ratio": round(cell.ratio, 4), "score": cell.metrics["average"]}
            | dict(zip(("ci_low", "ci_high"), cell.metrics["average_ci"]))
            | {"n_samples": len(cell.samples)}
        )
        for task, group in per_task:
            low, high = cell.metrics["per_task_ci"][task]
            out.append(
                common
                | {"task": task, "ratio": round(float(group["ratio"].mean()), 4)}
                | {"score": cell.metrics["per_task"][task], "ci_low": low, "ci_high": high, "n_samples": len(group)}
            )
    return out


def difference(a: Cell, b: Cell) -> dict:
    """a - b on the samples both scored, in points, with its 95 % interval."""
    shared = a.samples.index.intersection(b.samples.index)
    x, y = a.samples.loc[shared], b.samples.loc[shared]
    diff, low, high = paired_difference(x["score"].to_numpy(), y["score"].to_numpy(), x["task"].to_numpy())
    return {
        "a": a.label,
        "b": b.label,
        "ratio": round(a.ratio, 4),
        "difference": diff,
        "ci": [low, high],
        "n_samples": len(shared),
    }


def keeps(d: dict) -> str:
    """The verdict on "a keeps b's accuracy" from one paired difference."""
    low, high = d["ci"]
    if low >= -DELTA:
        return AGREES
    if high < 0:
        return DISAGREES
    return UNTESTABLE


def of(cells: list[Cell], method: str, bench: str | None = None) -> list[Cell]:
    return [c for c in cells if c.method == method and (bench is None or c.bench == bench)]


def widest(cells: list[Cell]) -> Cell | None:
    """The cell with the most samples: where the cheap methods ran on every row."""
    return max(cells, key=lambda c: len(c.samples), default=None)


def nearest(cells: list[Cell], ratio: float) -> Cell | None:
    close = [c for c in cells if abs(c.ratio - ratio) <= MATCH]
    return min(close, key=lambda c: abs(c.ratio - ratio)) if close else None


def _main_bench(cells: list[Cell]) -> str | None:
    """The entry with the most full-cache samples: where the cheap methods ran on every row."""
    full = widest(of(cells, "full"))
    return full.bench if full else None


def informative_tasks(cells: list[Cell]) -> list[str]:
    """The tasks on which the full cache (of the main entry) scores FLOOR points or more."""
    full = of(cells, "full", _main_bench(cells))
    if not full:
        return sorted({task for c in cells for task in c.samples["task"]})
    per_task = full[0].samples.groupby("task")["score"].mean() * 100
    return sorted(per_task[per_task >= FLOOR].index)


def on_tasks(cells: list[Cell], tasks: list[str]) -> list[Cell]:
    return [replace(c, samples=c.samples[c.samples["task"].isin(tasks)]) for c in cells]


def _text(diffs: list[dict]) -> str:
    return "; ".join(
        f"{d['a']} - {d['b']}: {d['difference']:+.1f} [{d['ci'][0]:+.1f}, {d['ci'][1]:+.1f}] (n {d['n_samples']})"
        for d in diffs
    )


def _claim(claim: str, paper: str, verdict: str, why: str, diffs: list[dict] | None = None, measured=None) -> dict:
    return {
        "claim": claim,
        "paper": paper,
        "measured": measured if measured is not None else _text(diffs or []),
        "verdict": verdict,
        "why": why,
        **({"comparisons": diffs} if diffs else {}),
    }


def holds_full_cache(cells: list[Cell]) -> dict:
    claim = "KVzap keeps the full cache's RULER accuracy at 2-4x compression (ratio 0.5-0.75)"
    paper = "RULER 4k: Qwen3-8B 95.32 -> 95.09 at 0.74 (MLP, tau -4); Llama-3.1-8B 95.69 -> 95.55 at 0.68 (Linear, -7)"
    bench = _main_bench(cells)
    full = of(cells, "full", bench)
    diffs = [difference(c, full[0]) for m in SURROGATES for c in of(cells, m, bench) if c.ratio >= 0.5] if full else []
    if not diffs:
        return _claim(claim, paper, UNTESTABLE, "no KVzap cell reached ratio 0.5 beside a full-cache cell")
    held = [d for d in diffs if keeps(d) == AGREES]
    if held:
        best = max(held, key=lambda d: d["ratio"])
        why = f"the interval rules out a loss of {DELTA:g} points up to {best['a']}"
        return _claim(claim, paper, AGREES, why, diffs)
    at_2_4x = [d for d in diffs if d["ratio"] <= 0.75 + MATCH]
    if at_2_4x and all(keeps(d) == DISAGREES for d in at_2_4x):
        why = "every KVzap cell at ratio 0.5-0.75 loses accuracy beyond the noise"
        return _claim(claim, paper, DISAGREES, why, diffs)
    lost = [d["a"].split(" (")[0] for d in at_2_4x if keeps(d) == DISAGREES]
    why = f"no interval rules out a {DELTA:g}-point loss"
    if lost:
        why += f"; losses beyond the noise: {', '.join(lost)}"
    return _claim(claim, paper, UNTESTABLE, why, diffs)


def matches_reference(cells: list[Cell], claim: str, paper: str, method: str, reference: str, which: dict) -> dict:
    """`which` methods (one row each) against `reference` at the reference's ratios, on the entry where both ran."""
    diffs = []
    for ref in of(cells, reference):
        for m in which:
            match = nearest(of(cells, m, ref.bench), ref.ratio)
            if match is not None:
                diffs.append(difference(match, ref))
    if not of(cells, reference):
        return _claim(claim, paper, UNTESTABLE, f"{reference} was not run (not among the config's methods)")
    if not diffs:
        return _claim(claim, paper, UNTESTABLE, f"no {method} cell at the ratio of a {reference} cell (within {MATCH})")
    verdicts = [keeps(d) for d in diffs]
    if AGREES in verdicts and DISAGREES not in verdicts:
        return _claim(claim, paper, AGREES, f"the intervals rule out a loss of {DELTA:g} points", diffs)
    if DISAGREES in verdicts:
        return _claim(claim, paper, DISAGREES, "a loss beyond the noise at a matched ratio", diffs)
    why = f"{diffs[0]['n_samples']} paired samples: too few to rule out a {DELTA:g}-point loss"
    return _claim(claim, paper, UNTESTABLE, why, diffs)


def mlp_fits_better(surrogates: dict) -> dict:
    claim = "KVzap-MLP predicts the KVzip+ scores better than KVzap-Linear (held-out R^2)"
    paper = "Table 1: Qwen3-8B 0.711 vs 0.671; Llama-3.1-8B 0.772 vs 0.743; Qwen3-32B 0.668 vs 0.629"
    if not {"mlp", "linear"} <= set(surrogates):
        return _claim(claim, paper, UNTESTABLE, "both surrogates are needed", measured="")
    mlp, linear = surrogates["mlp"], surrogates["linear"]
    measured = (
        f"MLP {mlp['r2_mean']:.3f} [{mlp['r2_mean_ci'][0]:.3f}, {mlp['r2_mean_ci'][1]:.3f}], "
        f"Linear {linear['r2_mean']:.3f} [{linear['r2_mean_ci'][0]:.3f}, {linear['r2_mean_ci'][1]:.3f}] "
        f"({mlp['n_test_pairs']} held-out pairs)"
    )
    if mlp["r2_mean_ci"][0] > linear["r2_mean_ci"][1]:
        return _claim(claim, paper, AGREES, "the intervals do not overlap", measured=measured)
    if mlp["r2_mean_ci"][1] < linear["r2_mean_ci"][0]:
        return _claim(claim, paper, DISAGREES, "Linear's interval lies above the MLP's", measured=measured)
    return _claim(claim, paper, UNTESTABLE, "the intervals overlap", measured=measured)


def threshold_beats_topk(cells: list[Cell]) -> dict:
    claim = "Thresholding beats fixed top-k per head and per layer at the same compression"
    paper = "Fig 5 right (RULER 4k inferred): the threshold curve lies above both top-k curves"
    diffs = []
    for topk in ("kvzap_mlp_head", "kvzap_mlp_layer"):
        for cell in of(cells, topk):
            match = nearest(of(cells, "kvzap_mlp", cell.bench), cell.ratio)
            if match is not None:
                diffs.append(difference(match, cell))
    if not diffs:
        return _claim(claim, paper, UNTESTABLE, f"no KVzap-MLP cell within {MATCH} of a top-k cell's ratio")
    if any(d["ci"][1] < 0 for d in diffs):
        return _claim(claim, paper, DISAGREES, "top-k is better beyond the noise at a matched ratio", diffs)
    if any(d["ci"][0] > 0 for d in diffs):
        return _claim(claim, paper, AGREES, "thresholding is better beyond the noise at a matched ratio", diffs)
    if all(-DELTA < d["ci"][0] and d["ci"][1] < DELTA for d in diffs):
        return _claim(claim, paper, DISAGREES, f"no gap: every interval lies within +-{DELTA:g} points", diffs)
    return _claim(claim, paper, UNTESTABLE, "intervals include 0 and reach past the smallest gap of interest", diffs)


def window_needed(cells: list[Cell]) -> dict:
    claim = "Without the 128-token window accuracy collapses; 512 tokens add nothing"
    paper = "LongBench LCC, Qwen3-8B, MLP tau -4: w=0 28.37, w=128 62.51, w=512 62.37"
    diffs = []
    for base in of(cells, "kvzap_mlp"):
        for method in ("kvzap_mlp_w0", "kvzap_mlp_w512"):
            diffs += [difference(c, base) for c in of(cells, method, base.bench) if c.value == base.value]
    w0 = [d for d in diffs if d["a"].startswith("kvzap_mlp_w0 ")]
    w512 = [d for d in diffs if d["a"].startswith("kvzap_mlp_w512 ")]
    if not w0 or not w512:
        return _claim(claim, paper, UNTESTABLE, "windows 0 and 512 were not run beside window 128 at one tau", diffs)
    collapse = all(d["ci"][1] < -DELTA for d in w0)
    if collapse and all(keeps(d) == AGREES for d in w512):
        return _claim(claim, paper, AGREES, f"w=0 loses more than {DELTA:g} points beyond the noise; w=512 none", diffs)
    if all(keeps(d) == AGREES for d in w0):
        return _claim(claim, paper, DISAGREES, f"w=0 keeps accuracy within {DELTA:g} points here", diffs)
    return _claim(claim, paper, UNTESTABLE, "the intervals cannot tell a collapse from a small loss", diffs)


def ratio_adapts(cells: list[Cell]) -> dict:
    claim = "One threshold gives each task and prompt its own compression (the ratio adapts)"
    paper = "Fig 5 left: per-prompt ratios vary by up to 20 %; same tau, lower ratio on LongBench than on RULER"
    bench = _main_bench(cells)
    spreads = []
    for cell in of(cells, "kvzap_mlp", bench):
        per_task = cell.samples.groupby("task")["ratio"].mean()
        p5, p95 = np.quantile(cell.samples["ratio"], [0.05, 0.95])
        spreads.append((cell, float(per_task.max() - per_task.min()), float(p95 - p5), per_task))
    if not spreads:
        return _claim(claim, paper, UNTESTABLE, "no KVzap-MLP cell", measured="")
    measured = "; ".join(
        f"tau {c.value}: tasks {t.min():.2f}-{t.max():.2f} (range {r:.2f}), prompts p5-p95 spread {p:.2f}"
        for c, r, p, t in spreads
    )
    if max(r for _, r, _, _ in spreads) >= 0.05:
        return _claim(claim, paper, AGREES, "task means differ by 0.05 or more at one tau", measured=measured)
    return _claim(claim, paper, DISAGREES, "every task gets the same ratio within 0.05", measured=measured)


def not_testable_on_this_model(claim: str, paper: str, why: str) -> dict:
    return _claim(claim, paper, UNTESTABLE, why, measured="")


def judge(cells: list[Cell], surrogates: dict) -> list[dict]:
    """Every claim; those on accuracy on the informative tasks' samples, the ratio's on every task's."""
    every_task, cells = cells, on_tasks(cells, informative_tasks(cells))
    return [
        holds_full_cache(cells),
        matches_reference(
            cells,
            "KVzap is about as accurate as KVzip+, the oracle whose scores it learns, at the same compression",
            "Fig 2: KVzap's curves lie close to KVzip's and KVzip+'s on RULER 4k",
            "KVzap",
            "kvzip_plus",
            SURROGATES,
        ),
        matches_reference(
            cells,
            "KVzip+ matches or exceeds KVzip",
            "Section 3: KVzip+ matches or exceeds KVzip on RULER and LongBench",
            "KVzip+",
            "kvzip",
            {"kvzip_plus": "KVzip+"},
        ),
        mlp_fits_better(surrogates),
        matches_reference(
            cells,
            "On Llama (SmolLM2 is a Llama), KVzap-Linear is as accurate as KVzap-MLP",
            "Llama-3.1-8B: Linear excels despite its lower R^2 (Table 2 uses Linear, tau -7)",
            "KVzap-Linear",
            "kvzap_mlp",
            {"kvzap_linear": "KVzap-Linear"},
        ),
        not_testable_on_this_model(
            "On Qwen3, KVzap-MLP is clearly better than KVzap-Linear at high compression",
            "Qwen models: MLP > Linear; Linear degrades sharply at high compression",
            "no offline Qwen3 checkpoint: Qwen3 runs here only as tiny random models, whose accuracy means nothing",
        ),
        threshold_beats_topk(cells),
        window_needed(cells),
        ratio_adapts(every_task),
    ]


def surrogate_fits(config: dict, model: str) -> dict:
    out = {}
    for kind in config["training"]["surrogates"]:
        path = Path(paths.surrogate_dir(config["results"], model, kind)) / "metrics.json"
        if path.is_file():
            metrics = json.loads(path.read_text())
            out[kind] = {k: metrics[k] for k in ("r2_mean", "r2_mean_ci", "n_train_pairs", "n_test_pairs")}
    return out


def build(config: dict, model: str, wall_s: float | None, stage_s: dict | None = None) -> dict:
    benches = config["evaluation"]["benchmarks"]
    context = {name: int(b["subsets"][0]) for name, b in benches.items() if b["benchmark"] == "ruler"}
    cells = [c for c in load_cells(config) if c.metrics["model"] == model]
    if not cells:
        raise Refusal(f"No RULER cell of {model} under {config['results']}: run the config first.")
    surrogates = surrogate_fits(config, model)
    return {
        "wall_s": wall_s,
        **({"stage_s": stage_s} if stage_s else {}),
        "cpu_flags": dtypes.matmul_flags(),
        "model": model,
        "delta_points": DELTA,
        "match_ratio": MATCH,
        "floor_points": FLOOR,
        "judged_tasks": informative_tasks(cells),
        "surrogates": surrogates,
        "cells": record_cells(cells, context),
        "claims": judge(cells, surrogates),
    }


def markdown(record: dict) -> str:
    lines = ["| claim | paper | measured | verdict | why |", "| --- | --- | --- | --- | --- |"]
    for c in record["claims"]:
        lines.append(f"| {c['claim']} | {c['paper']} | {c['measured']} | **{c['verdict']}** | {c['why']} |")
    return "\n".join(lines)


@entry_point
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Judge the paper's claims on a run's RULER cells.")
    parser.add_argument("--config", type=Path, nargs="+", required=True, help="the run's config and its overlays")
    parser.add_argument("--model", help="the config's model name (default: its first)")
    parser.add_argument("--wall-s", type=float, default=None, help="the run's measured wall time, for the record")
    parser.add_argument(
        "--stage-s",
        nargs="+",
        default=[],
        metavar="STAGE=SECONDS",
        help="stages run apart; --wall-s defaults to their sum",
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON record")
    args = parser.parse_args(argv)
    stage_s = {}
    for item in args.stage_s:
        name, _, seconds = item.partition("=")
        try:
            stage_s[name] = float(seconds)
        except ValueError:
            raise Refusal(f"--stage-s {item}: write STAGE=SECONDS, e.g. oracle=1360.") from None
    wall_s = args.wall_s if args.wall_s is not None or not stage_s else sum(stage_s.values())
    config = overlays.planned(args.config)
    model = args.model or next(iter(config["models"]))
    if model not in config["models"]:
        raise Refusal(f"--model {model}: not a model of {args.config[0]}; use one of {list(config['models'])}.")
    record = build(config, model, wall_s, stage_s)
    atomic_write_json(args.out, record)
    print(markdown(record))


if __name__ == "__main__":
    main()
