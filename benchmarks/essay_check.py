"""A demo run's surrogates on held-out rows it never saw: RULER-style needles in Paul Graham essays at 2k tokens
(20 samples, their own seed), the full cache, KVzap-Linear and every KVzap-MLP seed at the demo's thresholds, through
the pipeline's shared prefill, in the dtype the run used. Two demo runs (a bfloat16 machine, a float32 / AVX2 one)
give two records to set side by side.

    python benchmarks/essay_check.py --results results --out benchmarks/cpu/essay_check_bf16.json
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import yaml

from demo_science import evaluate
from kvzap.atomic import atomic_write_json
from kvzap.evaluation.suites import ruler
from kvzap.prepare.models import load
from records import cpu_flags, output_file, positive_int, print_table

MODEL = "smollm2-135m"
COLUMNS = ["kind", "seed", "threshold", "ratio", "score"]


def trained(results: Path) -> list[dict]:
    """The demo's surrogates: linear, and one MLP folder per training seed (surrogates/mlp, mlp-seed<s>)."""
    found = []
    for folder in sorted((results / MODEL / "surrogates").iterdir()):
        kind = folder.name.split("-")[0]
        metrics = json.loads((folder / "metrics.json").read_text())
        found.append({"kind": kind, "seed": metrics["seed"], "folder": folder, "r2_mean": metrics["r2_mean"]})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="a finished demo run's results root")
    parser.add_argument("--config", type=Path, default=Path("config/config.yaml"), help="its thresholds")
    parser.add_argument("--context", type=positive_int, default=2048)
    parser.add_argument("--n-samples", type=positive_int, default=20)
    parser.add_argument("--seed", type=int, default=11, help="the rows' seed (the demo's rows use 42)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=12)
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    for needed in ("model.json", "oracle/train/manifest.json", "surrogates"):
        if not (args.results / MODEL / needed).exists():
            parser.error(f"--results {args.results}: no {MODEL}/{needed} there; give a finished `make demo`'s results")
    record = json.loads((args.results / MODEL / "model.json").read_text())
    dtype = json.loads((args.results / MODEL / "oracle" / "train" / "manifest.json").read_text())["dtype"]
    thresholds = yaml.safe_load(args.config.read_text())["models"][MODEL]["thresholds"]
    model, tokenizer = load(args.results / MODEL / "model.json", dtype=dtype)
    rows = ruler.load("offline", str(args.context), tokenizer, args.n_samples, args.seed, tasks=["niah_single_2"])
    rows["max_new_tokens"] = rows["max_new_tokens"].clip(upper=args.max_new_tokens)
    cells = evaluate(model, tokenizer, rows, trained(args.results), thresholds, batch=32)
    print_table(cells, COLUMNS)
    atomic_write_json(
        args.out,
        {
            "machine": {"cpu_flags": cpu_flags(), "processor": platform.processor()},
            "model_id": record["model_id"],
            "dtype": dtype,
            "rows": {"context": args.context, "n_samples": args.n_samples, "seed": args.seed},
            "cells": cells,
        },
    )


if __name__ == "__main__":
    main()
