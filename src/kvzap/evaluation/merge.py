"""Join the shards of one evaluation cell and score them together: the cell's predictions.csv and metrics.json.

Light on purpose (pandas and the benchmark's scorer, no model code): the rule merge runs it once per cell on the
submit host.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from kvzap.atomic import atomic_write_json
from kvzap.evaluation import attention_record, long_samples
from kvzap.evaluation.predictions import measured_means, read_predictions, seed_averages, write_predictions
from kvzap.evaluation.suites import benchmark_module
from kvzap.provenance import stamp
from kvzap.refusal import Refusal, entry_point

PER_SHARD = ("shard", "n_shards", "out")  # arguments that differ between the shards of one cell


def merge(parts: list[Path], out: Path) -> dict:
    for part in parts:
        if missing := [f for f in ("metrics.json", "predictions.csv") if not (part / f).is_file()]:
            raise Refusal(f"Shard {part} has no {' or '.join(missing)}. Fix: run that shard's evaluation job first.")
    shards = [json.loads((p / "metrics.json").read_text()) for p in parts]
    first = shards[0]
    if sorted(s["shard"] for s in shards) != list(range(first["n_shards"])):
        raise Refusal(f"Shards of {out} are incomplete: got {[s['shard'] for s in shards]} of {first['n_shards']}.")
    predictions = pd.concat(
        [read_predictions(p / "predictions.csv", s["json_columns"]) for p, s in zip(parts, shards)], ignore_index=True
    )
    params = {k: v for k, v in first["provenance"]["params"].items() if k not in PER_SHARD}
    bench, departures = benchmark_module(first["benchmark"]), frozenset(params.get("departures", []))
    score = lambda rows: bench.score(rows, departures)  # noqa: E731
    metrics = {**score(predictions), "seeds": seed_averages(score, predictions)}
    long = first["long_samples"]
    metrics.update(
        {
            **measured_means(predictions),
            "n_samples": sum(s["n_samples"] for s in shards),
            "long_samples": long_samples.summary(predictions, long["policy"], long["max_positions"]),
            **{k: first.get(k) for k in ("model", "bench", "benchmark", "subset", "method", "value")},
            "provenance": {
                **stamp(
                    params,
                    {"model_id": first["provenance"]["model_id"], "revision": first["provenance"]["model_revision"]},
                    first["provenance"]["seed"],
                ),
                "shards": [s["provenance"]["params_hash"] for s in shards],
            },
            # what served any shard served the cell
            attention_record.FIELD: attention_record.union([s.get(attention_record.FIELD) for s in shards]),
        }
    )
    metrics["json_columns"] = write_predictions(predictions, out / "predictions.csv")
    atomic_write_json(out / "metrics.json", metrics)
    return metrics


@entry_point
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=Path, nargs="+", required=True, help="the cell's shard folders")
    parser.add_argument("--out", type=Path, required=True, help="the cell's folder")
    args = parser.parse_args()
    metrics = merge(args.shards, args.out)
    print(f"{len(args.shards)} shard(s), {metrics['n_samples']} samples -> {args.out}")


if __name__ == "__main__":
    main()
