"""How far the demo moves between two runs of its DAG, e.g. float32 and bfloat16 on the same machine: the oracle's
held-out log KVzip+ scores (same prompts, same tokens), the surrogates' held-out R², and every cell's score and
compression ratio. Either root may come from `snakemake --cores N --config results=results/<name>` with another
models.<name>.dtype.

    python benchmarks/demo_dtypes.py --a results/float32 --b results/bf16 --out benchmarks/cpu/demo_dtypes.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch

from kvzap.atomic import atomic_write_json
from kvzap.surrogate.settings import KINDS
from kvzap.training.shards import read_shard
from records import output_file, print_table

MODEL = "smollm2-135m"
CELL_COLUMNS = ["method", "value", "score_a", "score_b", "ratio_a", "ratio_b"]


def oracle_agreement(a: Path, b: Path) -> dict:
    """Held-out oracle scores of both roots, pair by pair (the same prompts and positions: checked)."""
    ya, yb = (
        torch.cat([read_shard(p)["y"] for p in sorted((r / MODEL / "oracle" / "test").glob("shard-*"))]) for r in (a, b)
    )
    if ya.shape != yb.shape:
        raise SystemExit(
            f"The two oracle test splits hold {tuple(ya.shape)} and {tuple(yb.shape)} pairs: not the same prompts."
        )
    da, db = ya.double().flatten() - ya.double().mean(), yb.double().flatten() - yb.double().mean()
    pearson = float((da * db).sum() / (da.norm() * db.norm()))
    return {
        "pairs": int(ya.shape[0]),
        "pearson_log_kvzip_plus": pearson,
        "mean_abs_diff": float((ya - yb).abs().mean()),
        "max_abs_diff": float((ya - yb).abs().max()),
        "dtypes": [json.loads((r / MODEL / "oracle" / "test" / "manifest.json").read_text())["dtype"] for r in (a, b)],
    }


def r2(root: Path) -> dict:
    return {
        kind: json.loads((root / MODEL / "surrogates" / kind / "metrics.json").read_text())["r2_mean"] for kind in KINDS
    }


def cells(a: Path, b: Path) -> list[dict]:
    keys = ["method", "value"]
    frames = [pd.read_csv(r / "tables" / "results.csv")[keys + ["average", "compression_ratio"]] for r in (a, b)]
    merged = frames[0].merge(frames[1], on=keys, suffixes=("_a", "_b"))
    merged = merged.rename(
        columns={
            "average_a": "score_a",
            "average_b": "score_b",
            "compression_ratio_a": "ratio_a",
            "compression_ratio_b": "ratio_b",
        }
    )
    return merged[CELL_COLUMNS].to_dict("records")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="a results root of the demo config")
    parser.add_argument("--b", type=Path, required=True)
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    oracle = oracle_agreement(args.a, args.b)
    fits = {"a": r2(args.a), "b": r2(args.b)}
    table = cells(args.a, args.b)
    print(json.dumps(oracle, indent=1), json.dumps(fits))
    print_table(table, CELL_COLUMNS)
    atomic_write_json(args.out, {"a": str(args.a), "b": str(args.b), "oracle": oracle, "r2_mean": fits, "cells": table})


if __name__ == "__main__":
    main()
