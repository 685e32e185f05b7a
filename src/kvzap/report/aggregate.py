"""Collect every evaluation cell and surrogate into the paper's tables (CSV for machines, Markdown for people).

results.csv          one row per cell: model, benchmark, subset, method, value, compression ratio, samples and how many
                     were past the model's positions, surrogate seeds (scores are their mean; seed:<seed>, each
                     one's average), the attention that served it (implementation, segment kernels, device;
                     "⚠ no varlen on GPU" where varlen never served a GPU cell), scores, per-task, and each score's
                     95 % interval (ci_low:<score>, ci_high:<score>; kvzap.intervals)
surrogates.csv       Table 1: mean R^2 per model and surrogate kind
best.csv             Table 2: the KVzap configuration fixed per model (--table2), full cache -> KVzap score and
                     compression ratio per benchmark, then the average compression ratio (see kvzap.report.tables)
best_auto.csv        per model, the configuration with the highest mean compression ratio within --tolerance points
                     of the full cache on every benchmark score (as Table 2 scores them)
overhead.csv         Table 3: the surrogates' FLOPs per decoder layer, from each model's config.json (--models)
aime_rollouts.csv    Table 4: AIME25 correct answers per rollout and pass@1
window_ablation.csv  §3.8: KVzap-MLP on LongBench LCC with sliding window 0 / 128 / 512
kv_ablation.csv      App. A: held-out R^2 of ridge surrogates fed (k, v) instead of h (--kv-ablations)
training_pairs.csv   R^2 and accuracy at matched compression vs training pairs and sources (--training-ablations)
missing.csv          expected cells that do not exist (only allowed with --allow-missing); the tables built from
                     cells then carry partial=True and results.md names the missing cells at its top
results.md           every table as Markdown
provenance.json      the code version and the provenance hash of every cell and surrogate aggregated
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvzap.atomic import atomic_path, atomic_write_json, atomic_write_text
from kvzap.evaluation import attention_record
from kvzap.evaluation.predictions import KV_MEMORY
from kvzap.intervals import ci_columns
from kvzap.provenance import stamp
from kvzap.refusal import entry_point
from kvzap.report import tables
from kvzap.report.flops import overhead_table
from kvzap.report.outputs import CELL_TABLES, TABLES
from kvzap.report.tables import best_configurations  # noqa: F401  (part of this module's interface: Table 2 auto)

SCORE_KEYS = ("average", "average_without_trec", "pass@1", "pass@4")
KEY_COLUMNS = ["model", "benchmark", "subset", "method", "value"]


def cell_row(path: Path) -> dict:
    """One cell's metrics.json -> one flat row; the cell says who it is (kvzap.evaluation.job records it)."""
    metrics = json.loads(path.read_text())
    row = {
        "model": metrics["model"],
        "benchmark": metrics["bench"],
        "subset": metrics["subset"],
        "method": metrics["method"],
        "value": metrics["value"],
        "model_id": metrics["provenance"].get("model_id"),
        "benchmark_type": metrics["benchmark"],
        "compression_ratio": metrics["compression_ratio"],
        "n_samples": metrics["n_samples"],
        # samples needing more positions than the model's (run as they are, or cut: metrics.json names the policy)
        "past_positions": metrics["long_samples"]["count"],
        # a cell run with several surrogate seeds: its scores are their mean, and seed:<seed> each one's average
        "n_seeds": max(1, len(metrics.get("seeds") or {})),
        **attention_columns(metrics.get(attention_record.FIELD)),
    }
    row.update({f"seed:{seed}": average for seed, average in (metrics.get("seeds") or {}).items()})
    row.update({k: metrics[k] for k in SCORE_KEYS + KV_MEMORY if metrics.get(k) is not None})
    row.update({f"task:{task}": score for task, score in metrics.get("per_task", {}).items()})
    intervals = {k: metrics.get(f"{k}_ci") for k in SCORE_KEYS}
    intervals.update({f"task:{task}": ci for task, ci in metrics.get("per_task_ci", {}).items()})
    for column, interval in intervals.items():
        if interval is not None:
            row.update(zip(ci_columns(column), interval))
    return row


def attention_columns(record: dict | None) -> dict:
    """What served a cell (kvzap.evaluation.attention_record), and a warning where the fused varlen kernel never
    served it on a GPU; both empty for a cell written before cells recorded it."""
    warning = record is not None and attention_record.varlen_missing_on_gpu(record)
    return {
        "attention": attention_record.describe(record),
        "attention_warning": attention_record.VARLEN_MISSING_ON_GPU if warning else "",
    }


def _r2(record: dict) -> dict:
    """A fit's mean R^2 and its 95 % interval, as Table 1 and the input ablation print them."""
    low, high = record["r2_mean_ci"]
    return {"r2_mean": round(record["r2_mean"], 4), "r2_ci_low": round(low, 4), "r2_ci_high": round(high, 4)}


def surrogate_row(model: str, path: Path) -> dict:
    """One surrogate's metrics.json -> its Table 1 row; `model` is the config's name for the model it serves."""
    metrics = json.loads(path.read_text())
    return {
        "model": model,
        "model_id": metrics["model_id"],
        "surrogate": metrics["kind"],
        **_r2(metrics),
        "n_train_pairs": metrics["n_train_pairs"],
        "n_test_pairs": metrics["n_test_pairs"],
    }


def kv_ablation_table(files: list[Path]) -> pd.DataFrame:
    """One row per (model, input) from kvzap.ablations.kv_input's JSON files (results/<model>/ablations/...)."""
    rows = []
    for path in files:
        result = json.loads(Path(path).read_text())
        rows += [
            {
                "model_id": result["model_id"],
                "input": row["input"],
                **_r2(row),
                "n_train_pairs": result["n_train_pairs"],
                "n_test_pairs": result["n_test_pairs"],
            }
            for row in result["rows"]
        ]
    return pd.DataFrame(
        rows, columns=["model_id", "input", "r2_mean", "r2_ci_low", "r2_ci_high", "n_train_pairs", "n_test_pairs"]
    )


TRAINING_PAIRS_COLUMNS = [
    "model_id",
    "sources",
    "n_pairs",
    "kind",
    "r2_mean",
    "r2_ci_low",
    "r2_ci_high",
    "r2_benchmark",
    "r2_benchmark_ci_low",
    "r2_benchmark_ci_high",
    "threshold",
    "compression_ratio",
    "average",
    "average_ci_low",
    "average_ci_high",
    "best_epoch",
]


def training_pairs_table(files: list[Path]) -> pd.DataFrame:
    """One row per (model, sources, pairs, surrogate) from kvzap.ablations.training_data, plus each full cache."""
    rows = []
    for path in files:
        result = json.loads(Path(path).read_text())
        full = result["full"]
        rows.append(
            {
                "model_id": result["model_id"],
                "kind": "full cache",
                "compression_ratio": 0.0,
                "average": full["average"],
                "average_ci_low": full["average_ci"][0],
                "average_ci_high": full["average_ci"][1],
            }
        )
        rows += [
            {
                **{
                    k: row[k]
                    for k in ("sources", "n_pairs", "kind", "threshold", "compression_ratio", "average", "best_epoch")
                },
                "model_id": result["model_id"],
                **_r2(row),
                "r2_benchmark": round(row["r2_benchmark"], 4),
                "r2_benchmark_ci_low": round(row["r2_benchmark_ci"][0], 4),
                "r2_benchmark_ci_high": round(row["r2_benchmark_ci"][1], 4),
                "average_ci_low": row["average_ci"][0],
                "average_ci_high": row["average_ci"][1],
            }
            for row in result["rows"]
        ]
    return pd.DataFrame(rows, columns=TRAINING_PAIRS_COLUMNS)


def split_missing(cell_files: list[Path], allow_missing: bool) -> tuple[list[Path], list[Path]]:
    """(existing, missing) expected cells; a missing cell is an error unless the caller accepts partial tables."""
    present = [p for p in cell_files if p.exists()]
    missing = [p for p in cell_files if not p.exists()]
    if missing and not allow_missing:
        names = "\n  ".join(map(str, missing))
        raise FileNotFoundError(
            f"{len(missing)} expected cell(s) missing:\n  {names}\nRerun them, or pass "
            "--allow-missing to aggregate the cells that exist (the tables are then marked partial)."
        )
    if not present:
        raise FileNotFoundError(f"None of the {len(cell_files)} expected cells exists: nothing to aggregate.")
    return present, missing


def _markdown(name: str, title: str, table: pd.DataFrame) -> str:
    body = table.to_markdown(index=False, floatfmt=".4g") if len(table) else "(empty)"
    return f"## {name}: {title}\n\n{body}\n"


def _partial_banner(missing: pd.DataFrame, n_expected: int) -> str:
    return (
        f"# PARTIAL RESULTS: {len(missing)} of {n_expected} expected cells are missing\n\n"
        "Every table built from cells below (partial = True) lacks them; they are listed in missing.csv:\n\n"
        f"{missing.to_markdown(index=False)}\n"
    )


def aggregate(
    cell_files: list[Path],
    surrogate_files: list[tuple[str, Path]],
    out: Path,
    *,
    allow_missing: bool = False,
    table2_choice: dict | None = None,
    tolerance: float = 1.0,
    model_records: list[Path] = (),
    kv_ablations: list[Path] = (),
    training_ablations: list[Path] = (),
) -> pd.DataFrame:
    """Write every table under `out`; returns the per-cell results."""
    present, missing_files = split_missing(cell_files, allow_missing)
    rows = {path: cell_row(path) for path in present}
    results = pd.DataFrame(rows.values()).sort_values(KEY_COLUMNS, na_position="first", ignore_index=True)
    aime_cells = [(row, path.parent) for path, row in rows.items() if row["benchmark_type"] == tables.AIME_TYPE]
    missing = pd.DataFrame({"path": [str(p) for p in missing_files]})
    partial = bool(len(missing))
    built = {
        "results": results,
        "best": tables.table2(results, table2_choice or {}),
        "best_auto": tables.best_configurations(results, tolerance),
        "aime_rollouts": tables.aime_rollouts(aime_cells),
        "window_ablation": tables.window_ablation(results),
        "surrogates": pd.DataFrame([surrogate_row(model, path) for model, path in surrogate_files]),
        "overhead": overhead_table(list(model_records)),
        "kv_ablation": kv_ablation_table(kv_ablations),
        "training_pairs": training_pairs_table(training_ablations),
        "missing": missing,
    }
    sections = [_partial_banner(missing, len(cell_files))] if partial else []
    for name, title in TABLES.items():
        table, title = built[name], title.format(tolerance=tolerance)
        if name in CELL_TABLES:
            table = table.assign(partial=partial)
            title += " (PARTIAL)" if partial else ""
        with atomic_path(out / f"{name}.csv") as tmp:
            table.to_csv(tmp, index=False)
        sections.append(_markdown(name, title, table))
    atomic_write_text(out / "results.md", "\n".join(sections))
    sources = {str(p): json.loads(p.read_text())["provenance"]["params_hash"] for p in present}
    sources.update({str(p): json.loads(p.read_text())["params_hash"] for _, p in surrogate_files})
    atomic_write_json(out / "provenance.json", stamp({"sources": sources, "missing": [str(p) for p in missing_files]}))
    return results


@entry_point
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=Path, nargs="+", required=True, help="every expected cell metrics.json")
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="aggregate the expected cells that exist; the others go to missing.csv, tables say partial",
    )
    parser.add_argument(
        "--surrogate",
        nargs=2,
        action="append",
        default=[],
        metavar=("MODEL", "METRICS"),
        help="a surrogate's metrics.json and the config name of its model, once per surrogate",
    )
    parser.add_argument(
        "--table2",
        type=json.loads,
        default=None,
        help='Table 2 configuration per model, JSON: {"<model>": {"method": "kvzap_mlp", "value": -4}}',
    )
    parser.add_argument("--tolerance", type=float, default=1.0, help="best_auto.csv: allowed score drop in points")
    parser.add_argument("--models", type=Path, nargs="*", default=[], help="results/<model>/model.json (Table 3)")
    parser.add_argument("--kv-ablations", type=Path, nargs="*", default=[], help="kvzap.ablations.kv_input JSON files")
    parser.add_argument(
        "--training-ablations", type=Path, nargs="*", default=[], help="kvzap.ablations.training_data JSON files"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    surrogates = [(model, Path(path)) for model, path in args.surrogate]
    results = aggregate(
        args.cells,
        surrogates,
        args.out,
        allow_missing=args.allow_missing,
        table2_choice=args.table2,
        tolerance=args.tolerance,
        model_records=args.models,
        kv_ablations=args.kv_ablations,
        training_ablations=args.training_ablations,
    )
    print(f"{len(results)} cells -> {args.out}/results.csv")


if __name__ == "__main__":
    main()
