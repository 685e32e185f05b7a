"""Training recipes compared on one model: every surrogate's R^2 on each recipe's held-out text and on the
benchmark's own contexts, and its accuracy against the other recipe and the full cache at matched compression.

Each recipe is a model entry of the config with its own oracle and training settings (kvzap.plan.recipe), trained and
evaluated by the DAG; this reads what the DAG wrote, and runs the oracle on the first context of each benchmark task
(`--n-contexts`, every token scored), since a fit that holds on held-out training text need not carry over to the text
being pruned. Cells are paired by sample id: the entries generate the same rows for the same task, length and seed.

    python -m kvzap.ablations.recipes --config config/paper_small.yaml config/paper_small_recipes.yaml --out ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from kvzap import dtypes
from kvzap.ablations.training_data import benchmark_pairs
from kvzap.atomic import atomic_write_json
from kvzap.claims import FLOOR, Cell, difference, informative_tasks, load_cells, nearest, of, on_tasks, widest
from kvzap.evaluation.suites import benchmark_module
from kvzap.plan import overlays, paths
from kvzap.plan.inputs import surrogate_seeds
from kvzap.plan.recipe import recipe
from kvzap.prepare import models
from kvzap.refusal import Refusal, entry_point
from kvzap.surrogate.model import Surrogate
from kvzap.training import fit


def surrogates(config: dict, model: str) -> dict[str, Path]:
    """{"linear": folder, "mlp 42": folder, ...}: every surrogate the DAG trained for this model entry."""
    out = {}
    for kind in config["training"]["surrogates"]:
        seeds = surrogate_seeds(config, kind)
        for i, seed in enumerate(seeds):
            name = kind if kind == "linear" else f"{kind} {seed}"
            out[name] = Path(paths.surrogate_dir(config["results"], model, kind, None if i == 0 else seed))
    return out


def r2(y_true: torch.Tensor, y_pred: torch.Tensor, units: torch.Tensor) -> dict:
    """Mean R^2 over (layer, head) and its 95 % interval over the independent units (prompts or contexts)."""
    low, high = fit.r2_interval(y_true, y_pred, units)
    return {"r2": round(float(fit.squared_pearson(y_true, y_pred).mean()), 4), "ci": [round(low, 4), round(high, 4)]}


def held_out_fits(config: dict) -> list[dict]:
    """Every recipe's surrogates on every recipe's held-out prompts."""
    rows = []
    for model in config["models"]:
        for name, folder in surrogates(config, model).items():
            surrogate = Surrogate.from_pretrained(folder)
            for text in config["models"]:
                test = Path(paths.oracle_dir(config["results"], text)) / "test"
                y_true, y_pred, prompts = fit.predict(surrogate, test)
                rows.append(
                    {"recipe": model, "surrogate": name, "on": f"{text} held-out", **r2(y_true, y_pred, prompts)}
                )
    return rows


def context_fits(config: dict, bench_name: str, n_contexts: int) -> list[dict]:
    """Every surrogate on the oracle's scores of the first row of each of the entry's first `n_contexts` tasks."""
    first = next(iter(config["models"]))
    bench = config["evaluation"]["benchmarks"][bench_name]
    dtype = dtypes.resolve(config["models"][first]["dtype"], "cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = models.load(paths.model_json(config["results"], first), dtype=dtype)
    tasks = {"tasks": bench["tasks"][:n_contexts]} if bench.get("tasks") else {}
    loaded = benchmark_module(bench["benchmark"]).load(
        bench["source"], bench["subsets"][0], tokenizer, 1, config["seed"], **tasks
    )
    contexts = list(loaded["context"][:n_contexts])
    bench_h, bench_y, index = benchmark_pairs(model, tokenizer, contexts)
    rows = []
    for recipe_model in config["models"]:
        for name, folder in surrogates(config, recipe_model).items():
            with torch.no_grad():
                pred = Surrogate.from_pretrained(folder)(bench_h)
            on = f"{len(contexts)} {bench_name} contexts"
            rows.append({"recipe": recipe_model, "surrogate": name, "on": on, **r2(bench_y, pred, index)})
    return rows


def accuracy(cells: list[Cell]) -> list[dict]:
    """Each recipe's KVzap cells (their seeds' mean, and each seed alone) against the full cache of their entry,
    against the other recipes' same method and seed at the nearest ratio, and, for an MLP, against its own recipe's
    Linear at the nearest ratio (within MATCH), on the samples both scored."""
    rows = []
    for cell in cells:
        if cell.method not in ("kvzap_linear", "kvzap_mlp"):
            continue
        model = cell.metrics["model"]
        row = {"recipe": model, "bench": cell.bench, "method": cell.method, "value": cell.value, "seed": cell.seed}
        row |= {"ratio": round(cell.ratio, 4), "n_samples": len(cell.samples), "score": cell.metrics["average"]}
        full = widest(of(cells, "full", cell.bench)) or widest(of(cells, "full"))
        if full is not None:
            row["vs_full"] = difference(cell, full)
        others = [c for c in of(cells, cell.method) if c.seed == cell.seed and c.metrics["model"] != model]
        other = nearest(others, cell.ratio)
        if other is not None:
            row["vs_other_recipe"] = {"recipe": other.metrics["model"], **difference(cell, other)}
        if cell.method == "kvzap_mlp":
            own = [c for c in of(cells, "kvzap_linear", cell.bench) if c.metrics["model"] == model]
            linear = nearest(own, cell.ratio)
            if linear is not None:
                row["vs_linear"] = difference(cell, linear)
        rows.append(row)
    return rows


def settings(config: dict) -> dict:
    out = {}
    for model in config["models"]:
        own = recipe(config, model)
        out[model] = {
            "oracle": {k: own["oracle"][k] for k in ("min_tokens", "max_tokens", "n_train", "tokens_per_prompt")},
            "training": {k: own["training"][k] for k in ("valid_split", "keep", "epochs", "lr", "batch_size")},
        }
    return out


@entry_point
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, nargs="+", required=True, help="the run's config and its overlays")
    parser.add_argument("--bench", help="the RULER entry whose contexts R^2 is measured on (default: the first)")
    parser.add_argument("--n-contexts", type=int, default=8, help="contexts the oracle scores (one per task)")
    parser.add_argument("--out", type=Path, required=True, help="JSON record")
    args = parser.parse_args(argv)
    config = overlays.planned(args.config)
    if len(config["models"]) < 2:
        raise Refusal(
            f"{args.config[0]}: one model entry, so one recipe. Fix: add an overlay with a second entry of the model "
            "under its own recipe, e.g. config/paper_small_recipes.yaml."
        )
    ruler = [n for n, b in config["evaluation"]["benchmarks"].items() if b["benchmark"] == "ruler"]
    bench = args.bench or ruler[0]
    if bench not in ruler:
        raise Refusal(f"--bench {bench}: not a RULER entry of the config; use one of {ruler}.")
    cells = load_cells(config, by_seed=True)
    tasks = informative_tasks(cells)  # as kvzap.claims judges: where the full cache scores FLOOR points or more
    record = {
        "cpu_flags": dtypes.matmul_flags(),
        "recipes": settings(config),
        "r2": held_out_fits(config) + context_fits(config, bench, args.n_contexts),
        "floor_points": FLOOR,
        "judged_tasks": tasks,
        "accuracy": accuracy(on_tasks(cells, tasks)),
    }
    atomic_write_json(args.out, record)
    for row in record["r2"]:
        print(f"{row['recipe']:>28} {row['surrogate']:>10} on {row['on']:<40} R^2 {row['r2']:.3f} {row['ci']}")
    for row in record["accuracy"]:
        print({k: row[k] for k in ("recipe", "bench", "method", "value", "seed", "ratio", "score", "n_samples")})


if __name__ == "__main__":
    main()
