"""Why KVzap-MLP can score below KVzap-Linear on the demo at equal compression: each candidate cause separated, in
one run on one machine. Surrogates are trained from each oracle collection given (e.g. float32 and bfloat16 data,
or twice the pairs), KVzap-Linear once, KVzap-MLP once per seed and per training setting; then every surrogate, at
every threshold, answers the same RULER rows through the pipeline's shared prefill (kvpress's protocol), for each
model dtype asked and for each row set (the demo's 30 rows, other rows to measure the evaluation's own noise, longer
held-out essays), the surrogates scoring in the first score dtype given, and in the others on the first row set only.
The record holds every cell and, per candidate, its effect on MLP - Linear accuracy.

    python benchmarks/demo_science.py --model results/smollm2-135m/model.json \
        --oracle bf16=results/smollm2-135m/oracle --oracle fp32=/tmp/oracle-fp32 --seeds 42 43 44 \
        --work /tmp/science --out benchmarks/cpu/demo_science.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

import torch

from kvzap import dtypes
from kvzap.atomic import atomic_write_json
from kvzap.evaluation import presses
from kvzap.evaluation.shared_prefill import run_greedy_shared
from kvzap.evaluation.suites import ruler
from kvzap.prepare.models import load
from kvzap.surrogate import model as surrogate_model
from kvzap.training.fit import CHECKPOINT, fit_mlp, fit_ridge, predict, squared_pearson
from records import cpu_flags, output_file, positive_int, print_table

ROW_SETS = {  # name -> (context tokens, samples, seed); "demo" is the demo's own ruler-512 cell
    "demo": (512, 30, 42),
    "demo-other-rows": (512, 30, 7),
    "essays-2k": (2048, 20, 11),
}
# "paper": the demo's training; "short": the same schedule over 8 epochs (the validation loss flattens by the 8th of 15)
MLP_SETTINGS = {"paper": {"epochs": 15, "lr": 5e-3}, "short": {"epochs": 8, "lr": 5e-3}}
EFFECT_COLUMNS = ["rows", "model_dtype", "score_dtype", "data", "setting", "threshold", "mlp_mean", "linear"]
EFFECT_COLUMNS += ["mlp_minus_linear"]
COLUMNS = ["rows", "model_dtype", "score_dtype", "data", "kind", "setting", "seed", "threshold", "ratio", "score"]


def train(oracle: Path, folder: Path, kind: str, seed: int, setting: str) -> dict:
    """One surrogate into `folder` (reused if already there), and its held-out R²."""
    if not (folder / "model.safetensors").exists():
        folder.mkdir(parents=True, exist_ok=True)
        if kind == "linear":
            model = fit_ridge(oracle / "train")
        else:
            model, _ = fit_mlp(oracle / "train", folder, seed=seed, **MLP_SETTINGS[setting])
            (folder / CHECKPOINT).unlink(missing_ok=True)
        model.base_model = json.loads((oracle / "train" / "manifest.json").read_text())["model_id"]
        y_true, y_pred, _ = predict(model, oracle / "test")
        model.save_pretrained(folder)
        (folder / "r2.json").write_text(json.dumps({"r2_mean": float(squared_pearson(y_true, y_pred).mean())}))
    return json.loads((folder / "r2.json").read_text())


def evaluate(model, tokenizer, rows, surrogates: list[dict], thresholds: list[float], batch: int) -> list[dict]:
    """Every surrogate at every threshold, and the full cache, on `rows` (one prefill per row for all of them)."""
    cells = [({"kind": "full"}, None, None)]
    for s, tau in itertools.product(surrogates, thresholds):
        cells.append((s, tau, presses.build(f"kvzap_{s['kind']}", tau, {s["kind"]: s["folder"]})))
    outputs = run_greedy_shared(model, tokenizer, rows, [press for _, _, press in cells], decode_batch=batch)
    results = []
    for (s, tau, _), output in zip(cells, outputs):
        scored = ruler.score(rows.drop(columns=["context"]).merge(output, on="sample_id"))
        info = {k: s.get(k) for k in ("data", "kind", "setting", "seed", "r2_mean")}
        results.append(
            {**info, "threshold": tau, "ratio": float(output["compression_ratio"].mean()), "score": scored["average"]}
        )
        results[-1]["score_ci"] = scored["average_ci"]
    return results


def effects(cells: list[dict]) -> list[dict]:
    """Per (rows, model dtype, score dtype, data, setting, threshold): the MLP's mean score over seeds, its range,
    Linear's, and MLP - Linear; the MLP's mean ratio beside Linear's (equal compression is checked, not assumed)."""
    out = []
    keys = ("rows", "model_dtype", "score_dtype", "data", "setting", "threshold")
    mlps = [c for c in cells if c["kind"] == "mlp"]
    for key in sorted({tuple(c[k] for k in keys) for c in mlps}, key=str):
        group = [c for c in mlps if tuple(c[k] for k in keys) == key]
        match = dict(zip(keys, key))
        linear = next(
            c for c in cells if c["kind"] == "linear" and all(c[k] == match[k] for k in keys if k != "setting")
        )
        scores = [c["score"] for c in group]
        out.append(
            {
                **match,
                "seeds": [c["seed"] for c in group],
                "mlp_scores": scores,
                "mlp_mean": round(statistics.fmean(scores), 2),
                "mlp_ratio": round(statistics.fmean(c["ratio"] for c in group), 3),
                "linear": linear["score"],
                "linear_ratio": round(linear["ratio"], 3),
                "mlp_minus_linear": round(statistics.fmean(scores) - linear["score"], 2),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="model.json of the prepared demo model")
    parser.add_argument("--oracle", action="append", required=True, metavar="NAME=FOLDER", help="an oracle folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument(
        "--settings", nargs="+", choices=list(MLP_SETTINGS), default=["paper"], help="MLP training, on the first data"
    )
    parser.add_argument("--thresholds", type=float, nargs="+", default=[-2.6, -1.6, -1.0])
    parser.add_argument("--rows", nargs="+", choices=list(ROW_SETS), default=list(ROW_SETS))
    parser.add_argument("--model-dtypes", nargs="+", choices=["bfloat16", "float32"], default=["bfloat16", "float32"])
    parser.add_argument("--score-dtypes", nargs="+", choices=["bfloat16", "float32"], default=["float32", "bfloat16"])
    parser.add_argument("--max-new-tokens", type=positive_int, default=12, help="the demo's cap")
    parser.add_argument("--decode-batch", type=positive_int, default=32)
    parser.add_argument("--work", type=Path, required=True, help="where the surrogates are trained (reused)")
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    oracles = dict(item.split("=", 1) for item in args.oracle)

    surrogates = []
    for i, (data, folder) in enumerate(oracles.items()):  # training variants on the first (reference) data only
        settings = args.settings if i == 0 else ["paper"]
        runs = [("linear", 0, "-")] + [("mlp", s, t) for s in args.seeds for t in settings]
        for kind, seed, setting in runs:
            where = args.work / data / kind / setting / str(seed)
            r2 = train(Path(folder), where, kind, seed, setting)
            surrogates.append({"data": data, "kind": kind, "setting": setting, "seed": seed, "folder": where, **r2})

    cells = []
    for model_dtype in args.model_dtypes:
        model, tokenizer = load(args.model, dtype=model_dtype)
        for rows_name, score_dtype in itertools.product(args.rows, args.score_dtypes):
            if score_dtype == "bfloat16" and model_dtype == "float32":
                continue  # the surrogate never scores below its model's precision
            if score_dtype != args.score_dtypes[0] and rows_name != args.rows[0]:
                continue  # the score dtype's effect is measured on the first row set only (it costs a full pass)
            context, n, seed = ROW_SETS[rows_name]
            rows = ruler.load("offline", str(context), tokenizer, n, seed, tasks=["niah_single_2"])
            rows["max_new_tokens"] = rows["max_new_tokens"].clip(upper=args.max_new_tokens)
            surrogate_model.SCORE_DTYPE = dtypes.NAMES[score_dtype]  # what the press computes the scores in
            for cell in evaluate(model, tokenizer, rows, surrogates, args.thresholds, args.decode_batch):
                cells.append({"rows": rows_name, "model_dtype": model_dtype, "score_dtype": score_dtype, **cell})
            print_table([c for c in cells if c["rows"] == rows_name and c["model_dtype"] == model_dtype], COLUMNS)
            write(args.out, oracles, surrogates, cells)  # after each pass: a long run keeps what it measured
        del model
    surrogate_model.SCORE_DTYPE = torch.float32
    print_table(effects(cells), EFFECT_COLUMNS)


def write(out: Path, oracles: dict, surrogates: list[dict], cells: list[dict]) -> None:
    atomic_write_json(
        out,
        {
            "machine": {"cpu_flags": cpu_flags(), "threads": torch.get_num_threads()},
            "oracles": oracles,
            "surrogates": [{k: v for k, v in s.items() if k != "folder"} for s in surrogates],
            "cells": cells,
            "effects": effects(cells),
        },
    )


if __name__ == "__main__":
    main()
