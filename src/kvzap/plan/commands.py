"""The argument lists of the rules' commands (each value a quoted word, `shlex.join`), the files each rule reads,
and the cluster resources of each stage."""

from __future__ import annotations

import json
import shlex

from kvzap.evaluation import methods
from kvzap.evaluation.spec import CellSpec, JobSpec
from kvzap.plan import paths
from kvzap.plan.sweep import Cell, EvalJob, cells
from kvzap.surrogate.settings import KINDS, TRAINING_KEYS

STAGES = ("prepare", "oracle", "train", "evaluate")
# The one default of every cluster resource (a stage's keys in models.<name>.resources override them).
RESOURCE_DEFAULTS = {"gpu": 0, "cpus": 1, "mem_mb": 8000, "runtime": 120}


def training_settings(config: dict, kind: str) -> dict:
    """The training settings one surrogate kind depends on (its rule's params: nothing else reruns it)."""
    return {key: config["training"][key] for key in TRAINING_KEYS[kind]}


def surrogate_seeds(config: dict, kind: str) -> list[int]:
    """The seeds a surrogate kind is trained with: every training.seeds for the MLP (default: the run's seed), the
    first alone for the ridge, which has no randomness."""
    seeds = config["training"].get("seeds") or [config["seed"]]
    return list(seeds) if kind == "mlp" else seeds[:1]


def surrogate_dirs(config: dict, model: str, kind: str) -> list[str]:
    """One folder per training seed, the first seed's first (paths.surrogate_dir)."""
    first, *others = surrogate_seeds(config, kind)
    results = config["results"]
    return [paths.surrogate_dir(results, model, kind)] + [paths.surrogate_dir(results, model, kind, s) for s in others]


def train_args(config: dict, kind: str, seed: int | None = None) -> str:
    """The training of one surrogate: `seed` (default the kind's first) picks which of training.seeds."""
    settings = training_settings(config, kind)
    seed = surrogate_seeds(config, kind)[0] if seed is None else seed
    args = ["--kind", kind, "--seed", str(seed)]
    for key, value in settings.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(args)


def oracle_args(config: dict, model: str, kv_ablation: bool = False) -> str:
    """The oracle collection; for the (k, v)-input ablation, its own smaller collection that also stores k and v."""
    oracle = dict(config["oracle"])
    args = ["--corpus", oracle["corpus"], "--dtype", config["models"][model]["dtype"], "--seed", str(config["seed"])]
    args += ["--corpus-revision", oracle["revision"]] if oracle.get("revision") else []
    if kv_ablation:
        oracle["n_train"] = config["ablations"]["kv_input"]["n_train"]
        args.append("--store-kv")
    for key in ("min_tokens", "max_tokens", "n_test", "n_train", "tokens_per_prompt", "shard_tokens"):
        args += [f"--{key.replace('_', '-')}", str(oracle[key])]
    return shlex.join(args)


def training_ablation_args(config: dict, model: str) -> str:
    """kvzap.ablations.training_data's flags: the ablation's and training settings, its benchmark entry's data."""
    ablation, training = config["ablations"]["training_pairs"], config["training"]
    entry = config["evaluation"]["benchmarks"][ablation["benchmark"]]
    args = [
        "--dtype",
        config["models"][model]["dtype"],
        "--sizes",
        *map(str, ablation["sizes"]),
        "--sources",
        *ablation["sources"],
        "--alpha",
        str(training["alpha"]),
        "--epochs",
        str(training["epochs"]),
        "--lr",
        str(training["lr"]),
        "--batch-size",
        str(training["batch_size"]),
        "--benchmark",
        entry["benchmark"],
        "--source",
        entry["source"],
        "--subset",
        str(entry["subsets"][0]),
        "--n-samples",
        str(ablation["n_samples"]),
        "--target-ratio",
        str(ablation["target_ratio"]),
        "--seed",
        str(config["seed"]),
    ]
    args += ["--max-new-tokens", str(entry["max_new_tokens"])] if entry["max_new_tokens"] else []
    return shlex.join(args + (["--tasks", *entry["tasks"]] if entry.get("tasks") else []))


def prepare_args(config: dict, model: str) -> str:
    spec = config["models"][model]
    return shlex.join(["--model-id", spec["id"], f"--revision={spec.get('revision') or ''}"])


def evaluate_spec(config: dict, job: EvalJob, shard: int, n_shards: int) -> JobSpec:
    """One evaluation job: its cells (one, or a prefill group) over every subset of its entry, one shard, each
    (cell, subset) writing to its folder (paths.shard_dir)."""
    bench = config["evaluation"]["benchmarks"][job.bench]
    results, evaluation = config["results"], config["evaluation"]
    kinds = {methods.METHODS[m].surrogate for m, _ in job.cells} - {None}
    batch_size = evaluation["batch_size"].get(job.model, 1)
    batches = (job.group is not None or bench["benchmark"] == "aime25") and batch_size > 1
    cells = [
        CellSpec(
            method,
            None if value == "none" else float(value),
            {
                s: paths.shard_dir(results, Cell(job.model, job.bench, s, method, value), shard, n_shards)
                for s in bench["subsets"]
            },
        )
        for method, value in job.cells
    ]
    return JobSpec(
        model=paths.model_json(results, job.model),
        benchmark=bench["benchmark"],
        subsets=tuple(bench["subsets"]),
        cells=tuple(cells),
        model_name=job.model,
        bench_name=job.bench,
        source=bench["source"],
        tasks=tuple(bench["tasks"]) if bench.get("tasks") else None,
        revision=bench.get("revision") or None,
        long_samples=evaluation["long_samples"],
        departures=tuple(evaluation["departures"]),
        **{f"surrogate_{kind}": tuple(surrogate_dirs(config, job.model, kind)) for kind in sorted(kinds)},
        n_samples=bench.get("n_samples") or None,
        max_new_tokens=bench.get("max_new_tokens") or None,
        rollouts=bench.get("rollouts") or None,
        decode_batch=evaluation["decode_batch"] if job.group is not None else None,
        batch_size=batch_size if batches else 1,
        dtype=config["models"][job.model]["dtype"],
        seed=config["seed"],
        shard=shard,
        n_shards=n_shards,
    )


def resource(config: dict, model: str, stage: str, key: str, attempt: int = 1):
    """A model's resource for a stage; runtime and memory grow with each retry."""
    value = config["models"][model].get("resources", {}).get(stage, {}).get(key, RESOURCE_DEFAULTS[key])
    return value * attempt if key in ("runtime", "mem_mb") else value


def merge_args(config: dict, model: str, bench_name: str, method: str, value: str) -> str:
    """Flags of one merge: for each subset, the cell folder followed by its shard folders."""
    bench = config["evaluation"]["benchmarks"][bench_name]
    args = []
    for subset in bench["subsets"]:
        cell = Cell(model, bench_name, subset, method, value)
        args += ["--cell", paths.cell_dir(config["results"], cell)]
        args += [paths.shard_dir(config["results"], cell, k, bench["shards"]) for k in range(bench["shards"])]
    return shlex.join(args)


def publish_args(config: dict, surrogates: list[str]) -> str:
    publish = config["publish"]
    args = ["--namespace", publish["namespace"], "--license", publish["license"]]
    if publish["dataset_repo"]:
        args += ["--dataset-repo", publish["dataset_repo"]]
    args += ["--dry-run"] * publish["dry_run"] + ["--private"] * publish["private"]
    return shlex.join(args + ["--surrogates", *surrogates])


def cell_metrics(config: dict) -> list[str]:
    return [f"{paths.cell_dir(config['results'], cell)}/metrics.json" for cell in cells(config)]


def figure_inputs(config: dict, name: str) -> dict[str, list[str]]:
    """What one figure reads besides results.csv, by role: cells' predictions (ratio_distribution, every value of the
    method: the spec picks one by its metrics.json), surrogate folders (surrogate_fit) and the training-data
    ablation's results (training_pairs)."""
    spec = config["figures"][name]
    inputs = {"predictions": [], "surrogates": [], "ablations": []}
    if spec["kind"] == "ratio_distribution":
        inputs["predictions"] = [
            f"{paths.cell_dir(config['results'], c)}/predictions.csv"
            for c in cells(config)
            if c.method == spec["method"] and (not spec.get("model") or c.model == spec["model"])
        ]
    if spec["kind"] == "surrogate_fit":
        inputs["surrogates"] = [
            f"{paths.surrogate_dir(config['results'], m, k)}/{f}"
            for m in spec.get("models") or config["models"]
            for k in KINDS
            for f in ("metrics.json", "test_predictions.safetensors")
        ]
    if spec["kind"] == "training_pairs":
        inputs["ablations"] = training_ablation_files(config)
    return inputs


def figure_args(config: dict, name: str, predictions: list[str]) -> str:
    """Flags of one figure; `predictions` are the cells that exist (all of them unless tables.allow_missing)."""
    spec = config["figures"][name]
    args = ["--results", paths.table(config["results"], "results"), "--spec", json.dumps(spec, sort_keys=True)]
    if predictions:
        args += ["--predictions", *predictions]
    if spec["kind"] == "surrogate_fit":
        for model in spec.get("models") or config["models"]:
            args += [
                "--surrogate",
                model,
                paths.surrogate_dir(config["results"], model, "linear"),
                paths.surrogate_dir(config["results"], model, "mlp"),
            ]
    if spec["kind"] == "training_pairs":
        args += ["--training-ablations", *training_ablation_files(config)]
    return shlex.join(args)


def surrogate_metrics(config: dict) -> list[tuple[str, str]]:
    """Every trained surrogate's metrics.json, with the config name of the model it serves."""
    return [
        (model, f"{paths.surrogate_dir(config['results'], model, kind)}/metrics.json")
        for model in config["models"]
        for kind in config["training"]["surrogates"]
    ]


def aggregate_args(config: dict) -> str:
    """Every expected cell (missing ones are named, or refused), every surrogate with its model's name, Table 2's
    fixed configurations, the tolerance."""
    tables = config["tables"]
    args = [
        "--cells",
        *cell_metrics(config),
        "--table2",
        json.dumps(tables["best"], sort_keys=True),
        "--tolerance",
        str(tables["tolerance"]),
    ]
    for model, metrics in surrogate_metrics(config):
        args += ["--surrogate", model, metrics]
    return shlex.join(args + ["--allow-missing"] * tables["allow_missing"])


def training_ablation_files(config: dict) -> list[str]:
    return [
        paths.ablation_file(config["results"], m, "training_pairs")
        for m in config["ablations"]["training_pairs"]["models"]
    ]


def kv_ablation_files(config: dict) -> list[str]:
    return [paths.ablation_file(config["results"], m, "kv_ablation") for m in config["ablations"]["kv_input"]["models"]]
