"""Collect every evaluation cell and surrogate into the paper's tables (CSV for machines, Markdown for people).

results.csv    one row per cell: model, benchmark, subset, method, value, compression ratio, scores, per-task
surrogates.csv Table 1: mean R^2 per model and surrogate kind
best.csv       Table 2: per model, the KVzap configuration with the highest mean compression ratio whose score
               stays within `tolerance` points of the full cache on every benchmark
results.md     all three as Markdown tables
provenance.json  the code version and the provenance hash of every cell and surrogate aggregated
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvzap.io import atomic_path, atomic_write_json, atomic_write_text
from kvzap.provenance import stamp

SCORE_KEYS = ("average", "average_without_trec", "pass@1", "pass@4")
KVZAP_METHODS = ("kvzap_linear", "kvzap_mlp")


def cell_row(path: Path) -> dict:
    """results/<model>/eval/<bench>/<subset>/<method>/<value>/metrics.json -> one flat row."""
    metrics = json.loads(path.read_text())
    model, _, bench, subset, method, value = path.parts[-7:-1]
    row = {
        "model": model, "model_id": metrics["provenance"].get("model_id"), "benchmark": bench,
        "benchmark_type": metrics["benchmark"], "subset": subset, "method": method,
        "value": None if value == "none" else float(value),
        "compression_ratio": metrics["compression_ratio"], "n_samples": metrics["n_samples"],
    }
    row.update({k: metrics[k] for k in SCORE_KEYS if metrics.get(k) is not None})
    row.update({f"task:{task}": score for task, score in metrics.get("per_task", {}).items()})
    return row


def surrogate_row(path: Path) -> dict:
    metrics = json.loads(path.read_text())
    return {"model": path.parts[-4], "model_id": metrics["model_id"], "surrogate": metrics["kind"],
            "r2_mean": round(metrics["r2_mean"], 4), "n_train_pairs": metrics["n_train_pairs"],
            "n_test_pairs": metrics["n_test_pairs"]}


def best_configurations(results: pd.DataFrame, tolerance: float = 1.0) -> pd.DataFrame:
    """Table 2: full-cache score -> KVzap score (compression ratio) per benchmark, for each model's best config."""
    results = results.assign(score=results["average"].fillna(results.get("pass@4", results["average"])))
    rows = []
    for model, group in results.groupby("model"):
        full = group[group["method"] == "full"].set_index(["benchmark", "subset"])["score"]
        kvzap = group[group["method"].isin(KVZAP_METHODS)]
        if full.empty or kvzap.empty:
            continue
        candidates = []
        for (method, value), config in kvzap.groupby(["method", "value"]):
            config = config.set_index(["benchmark", "subset"])
            drop = (full.reindex(config.index) - config["score"]).max()
            candidates.append((drop <= tolerance, config["compression_ratio"].mean(), -drop, method, value, config))
        ok, ratio, _, method, value, config = max(candidates, key=lambda c: c[:3])
        for (bench, subset), cell in config.iterrows():
            rows.append({"model": model, "method": method, "value": value, "benchmark": bench, "subset": subset,
                         "full": full.get((bench, subset)), "kvzap": cell["score"],
                         "compression_ratio": cell["compression_ratio"], "within_tolerance": bool(ok),
                         "mean_compression_ratio": ratio})
    return pd.DataFrame(rows)


def aggregate(cell_files: list[Path], surrogate_files: list[Path], out: Path) -> pd.DataFrame:
    out.mkdir(parents=True, exist_ok=True)
    results = pd.DataFrame([cell_row(p) for p in cell_files]).sort_values(
        ["model", "benchmark", "subset", "method", "value"], na_position="first")
    surrogates = pd.DataFrame([surrogate_row(p) for p in surrogate_files])
    best = best_configurations(results)
    sections = []
    for name, table in (("results", results), ("surrogates", surrogates), ("best", best)):
        with atomic_path(out / f"{name}.csv") as tmp:
            table.to_csv(tmp, index=False)
        sections.append(f"## {name}\n\n{table.to_markdown(index=False, floatfmt='.3g') if len(table) else '(empty)'}\n")
    atomic_write_text(out / "results.md", "\n".join(sections))
    sources = {str(p): json.loads(p.read_text())["provenance"]["params_hash"] for p in cell_files}
    sources.update({str(p): json.loads(p.read_text())["params_hash"] for p in surrogate_files})
    atomic_write_json(out / "provenance.json", stamp({"sources": sources}))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=Path, nargs="+", required=True, help="cell metrics.json files")
    parser.add_argument("--surrogates", type=Path, nargs="*", default=[], help="surrogate metrics.json files")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = aggregate(args.cells, args.surrogates, args.out)
    print(f"{len(results)} cells -> {args.out}/results.csv")


if __name__ == "__main__":
    main()
