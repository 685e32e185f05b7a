"""The files each rule reads, named from the config (kvzap.plan.paths lays them out)."""

from __future__ import annotations

from kvzap.plan import paths
from kvzap.plan.sweep import cells
from kvzap.surrogate.settings import KINDS


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


def cell_metrics(config: dict) -> list[str]:
    return [f"{paths.cell_dir(config['results'], cell)}/metrics.json" for cell in cells(config)]


def surrogate_metrics(config: dict) -> list[tuple[str, str]]:
    """Every trained surrogate's metrics.json, with the config name of the model it serves."""
    return [
        (model, f"{paths.surrogate_dir(config['results'], model, kind)}/metrics.json")
        for model in config["models"]
        for kind in config["training"]["surrogates"]
    ]


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


def training_ablation_files(config: dict) -> list[str]:
    return [
        paths.ablation_file(config["results"], m, "training_pairs")
        for m in config["ablations"]["training_pairs"]["models"]
    ]


def kv_ablation_files(config: dict) -> list[str]:
    return [paths.ablation_file(config["results"], m, "kv_ablation") for m in config["ablations"]["kv_input"]["models"]]
