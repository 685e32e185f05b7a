"""The argument lists of the rules' commands, each value a quoted word (`shlex.join`); an evaluation job is handed a
typed spec instead (kvzap.plan.jobs)."""

from __future__ import annotations

import json
import shlex

from kvzap.plan import paths
from kvzap.plan.inputs import cell_metrics, surrogate_metrics, surrogate_seeds, training_ablation_files
from kvzap.plan.recipe import recipe
from kvzap.surrogate.settings import TRAINING_KEYS

ORACLE_KEYS = ("min_tokens", "max_tokens", "n_test", "n_train", "tokens_per_prompt", "shard_tokens")


def flags(**settings) -> list[str]:
    """`--key value` words in the order given (key_name as --key-name): a list gives several words, True a bare flag;
    None, False and an empty list give nothing."""
    words = []
    for key, value in settings.items():
        if value is None or value is False or (isinstance(value, list | tuple) and not value):
            continue
        words.append(f"--{key.replace('_', '-')}")
        if value is not True:
            words += [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]
    return words


def training_settings(config: dict, model: str, kind: str) -> dict:
    """The training settings one surrogate kind of one model depends on (its rule's params: nothing else reruns it)."""
    return {key: recipe(config, model)["training"][key] for key in TRAINING_KEYS[kind]}


def train_args(config: dict, model: str, kind: str, seed: int | None = None) -> str:
    """The training of one surrogate: `seed` (default the kind's first) picks which of training.seeds."""
    seed = surrogate_seeds(config, kind)[0] if seed is None else seed
    return shlex.join(flags(kind=kind, seed=seed, **training_settings(config, model, kind)))


def oracle_args(config: dict, model: str, kv_ablation: bool = False) -> str:
    """The oracle collection; for the (k, v)-input ablation, its own smaller collection that also stores k and v."""
    oracle = {key: recipe(config, model)["oracle"][key] for key in ORACLE_KEYS}
    if kv_ablation:
        oracle["n_train"] = config["ablations"]["kv_input"]["n_train"]
    return shlex.join(
        flags(
            corpus=config["oracle"]["corpus"],
            dtype=config["models"][model]["dtype"],
            seed=config["seed"],
            corpus_revision=config["oracle"].get("revision") or None,
            store_kv=kv_ablation,
            **oracle,
        )
    )


def training_ablation_args(config: dict, model: str) -> str:
    """kvzap.ablations.training_data's flags: the ablation's and training settings, its benchmark entry's data."""
    ablation, training = config["ablations"]["training_pairs"], recipe(config, model)["training"]
    entry = config["evaluation"]["benchmarks"][ablation["benchmark"]]
    return shlex.join(
        flags(
            dtype=config["models"][model]["dtype"],
            sizes=ablation["sizes"],
            sources=ablation["sources"],
            **{key: training[key] for key in ("alpha", "epochs", "lr", "batch_size", "valid_split", "keep")},
            benchmark=entry["benchmark"],
            source=entry["source"],
            subset=entry["subsets"][0],
            n_samples=ablation["n_samples"],
            target_ratio=ablation["target_ratio"],
            seed=config["seed"],
            max_new_tokens=entry["max_new_tokens"] or None,
            tasks=entry.get("tasks"),
        )
    )


def prepare_args(config: dict, model: str) -> str:
    spec = config["models"][model]
    return shlex.join(["--model-id", spec["id"], f"--revision={spec.get('revision') or ''}"])


def publish_args(config: dict, surrogates: list[str]) -> str:
    publish = config["publish"]
    return shlex.join(
        flags(
            namespace=publish["namespace"],
            license=publish["license"],
            dataset_repo=publish["dataset_repo"] or None,
            dry_run=publish["dry_run"],
            private=publish["private"],
            surrogates=surrogates,
        )
    )


def figure_args(config: dict, name: str, predictions: list[str]) -> str:
    """Flags of one figure; `predictions` are the cells that exist (all of them unless tables.allow_missing)."""
    spec = config["figures"][name]
    args = flags(
        results=paths.table(config["results"], "results"),
        spec=json.dumps(spec, sort_keys=True),
        predictions=predictions,
    )
    if spec["kind"] == "surrogate_fit":
        for model in spec.get("models") or config["models"]:
            args += [
                "--surrogate",
                model,
                paths.surrogate_dir(config["results"], model, "linear"),
                paths.surrogate_dir(config["results"], model, "mlp"),
            ]
    training_ablations = training_ablation_files(config) if spec["kind"] == "training_pairs" else []
    return shlex.join(args + flags(training_ablations=training_ablations))


def aggregate_args(config: dict) -> str:
    """Every expected cell (missing ones are named, or refused), every surrogate with its model's name, Table 2's
    fixed configurations, the tolerance."""
    tables = config["tables"]
    args = flags(
        cells=cell_metrics(config), table2=json.dumps(tables["best"], sort_keys=True), tolerance=tables["tolerance"]
    )
    for model, metrics in surrogate_metrics(config):
        args += ["--surrogate", model, metrics]
    return shlex.join(args + flags(allow_missing=tables["allow_missing"]))
