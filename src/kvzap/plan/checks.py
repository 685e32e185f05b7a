"""Every check a schema cannot express, in config order, before any job: names that become paths, sweep values,
corpora, benchmark subsets and tasks, methods a model cannot run, figures and tables that name what is not swept."""

from __future__ import annotations

import math
import re
from pathlib import Path, PurePosixPath

from kvzap import families
from kvzap.evaluation import duo_patterns, methods, refusals
from kvzap.evaluation.suites import catalog
from kvzap.plan.errors import ConfigError, fail
from kvzap.plan.model_configs import model_config
from kvzap.plan.recipe import recipe
from kvzap.plan.sweep import cells, value_label
from kvzap.prepare.assets import OFFLINE_CORPORA, OFFLINE_MODELS, OFFLINE_PACKAGES, install_fix, missing_packages
from kvzap.report.outputs import FIGURES, METRICS
from kvzap.surrogate.settings import KINDS
from kvzap.training import corpus

SAFE_NAME = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9][A-Za-z0-9._-]*$")  # a path component: no '/', no '..'
# Hub names that config files and docs write as examples: valid names, so only their spelling gives them away.
PUBLISH_PLACEHOLDERS = ("your-hf-namespace", "your-namespace", "your-org", "your-username", "your-hf-username")


def _check_values(key: str, values: list, low: float = -math.inf, high: float = math.inf) -> None:
    seen = {}
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            fail(f"{key}[{i}]", value, "not a finite number", "write a number such as -4 or 0.5")
        if not low <= value < high:
            fail(f"{key}[{i}]", value, f"outside [{low}, {high})", f"use a value in [{low}, {high})")
        label = value_label(value)
        if label in seen:
            fail(
                f"{key}[{i}]", value, f"duplicates entry {seen[label]} ({values[seen[label]]!r})", "remove one of them"
            )
        seen[label] = i


def _check_name(key: str, value) -> None:
    if not isinstance(value, str) or not SAFE_NAME.match(value):
        fail(
            key,
            value,
            "not a safe name (it becomes a path component)",
            "use letters, digits, '.', '_' and '-', starting with a letter or digit",
        )


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
        fail(
            f"{key}.id", model_id, "no such offline model", f"use one of {list(OFFLINE_MODELS)} or a Hub id (org/name)"
        )
    _check_values(f"{key}.thresholds", model["thresholds"])
    for i, method in enumerate(model.get("skip_methods", [])):
        _check_method(f"{key}.skip_methods[{i}]", method)
    _check_asset(f"{key}.id", model_id)
    try:
        family = model_config(model_id, model.get("revision"))
    except ConfigError as refused:  # the Hub refused the repository: name the entry
        raise ConfigError(str(refused).replace("models.*.", f"models.{name}.", 1)) from None
    reason = family and families.out_of_reach(family)
    if reason:
        fail(
            f"{key}.id",
            model_id,
            f"KVzap cannot serve {families.text_config(family).get('model_type')} models: {reason}",
            f"remove models.{name} (every model entry trains KVzap's surrogates from its oracle scores)",
        )


def _check_asset(key: str, asset: str) -> None:
    missing = missing_packages(OFFLINE_PACKAGES.get(asset, ()))
    if missing:
        names = ", ".join(package.replace("_", "-") for package in missing)
        fail(key, asset, f"needs the package{'s' if len(missing) > 1 else ''} {names}", install_fix(missing))


def _check_oracle(oracle: dict, key: str = "oracle") -> None:
    name = oracle["corpus"]
    if name != corpus.NEMOTRON and name not in OFFLINE_CORPORA:
        fail("oracle.corpus", name, "unknown corpus", f"use {corpus.NEMOTRON!r} or one of {list(OFFLINE_CORPORA)}")
    _check_asset("oracle.corpus", name)
    if oracle["min_tokens"] >= oracle["max_tokens"]:
        fail(
            f"{key}.min_tokens",
            oracle["min_tokens"],
            f"not below oracle.max_tokens ({oracle['max_tokens']})",
            "make min_tokens smaller than max_tokens",
        )


def _n_rows(bench: dict) -> int | None:
    """Rows of one subset of a benchmark entry, when the config fixes it (n_samples per task)."""
    if not bench.get("n_samples"):
        return None
    if bench["benchmark"] == "ruler":
        tasks = bench.get("tasks") or (
            catalog.RULER_OFFLINE_TASKS if bench["source"] == "offline" else catalog.RULER_TASKS
        )
        return bench["n_samples"] * len(tasks)
    return bench["n_samples"]


def _check_benchmark(config: dict, name: str, bench: dict) -> None:
    _check_name("evaluation.benchmarks", name)
    key = f"evaluation.benchmarks.{name}"
    kind, source = bench["benchmark"], bench["source"]
    if bench.get("thresholds"):
        _check_values(f"{key}.thresholds", bench["thresholds"])
    if bench.get("ratios"):
        _check_values(f"{key}.ratios", bench["ratios"], 0.0, 1.0)
    if source.startswith("local:") and not Path(source.removeprefix("local:")).is_dir():
        fail(f"{key}.source", source, "the folder does not exist", "point local:<folder> at a folder in the Hub layout")
    if kind == "ruler" and source == "offline":
        _check_asset(f"{key}.source", "offline/ruler")
    if kind == "longbench" and source == "offline":
        fail(f"{key}.source", source, "LongBench has no offline source", "use source: hub or local:<folder>")
    known = {"ruler": None, "longbench": catalog.LONGBENCH_SUBSETS, "aime25": catalog.AIME_SUBSETS}[kind]
    for i, subset in enumerate(bench["subsets"]):
        if kind == "ruler" and not (isinstance(subset, str) and subset.isdigit() and int(subset) > 0):
            fail(
                f"{key}.subsets[{i}]",
                subset,
                "a RULER subset is a context length in tokens",
                'write it as a quoted number, e.g. "4096"',
            )
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
                fail(
                    f"{key}.tasks[{i}]",
                    task,
                    f"not a RULER task{' available offline' if source == 'offline' else ''}",
                    f"use some of {list(allowed)}",
                )
            if bench["tasks"].index(task) != i:
                fail(f"{key}.tasks[{i}]", task, "listed twice", "remove the duplicate")
    if bench.get("rollouts") and kind != "aime25":
        fail(f"{key}.rollouts", bench["rollouts"], "only AIME25 samples several rollouts", "remove rollouts")
    rows = _n_rows(bench)
    if rows is not None and bench["shards"] > rows:
        fail(
            f"{key}.shards",
            bench["shards"],
            f"more shards than the {rows} rows of a subset",
            f"use at most {rows} shards",
        )
    for model in bench.get("models", []):
        if model not in config["models"]:
            fail(f"{key}.models", model, "not defined under models", f"use some of {list(config['models'])}")
    for i, method in enumerate(bench.get("methods", [])):
        _check_method(f"{key}.methods[{i}]", method)


def _check_method(key: str, method) -> None:
    if method not in methods.METHODS:
        fail(key, method, "unknown method", f"use one of {sorted(methods.METHODS)}")


def _check_figure(config: dict, name: str, fig: dict) -> None:
    _check_name("figures", name)
    key = f"figures.{name}"
    for needed in FIGURES[fig["kind"]].needs:
        if needed not in fig:
            fail(f"{key}.{needed}", None, f"a {fig['kind']} figure needs {needed}", f"add {needed} to the figure")
    benches = fig.get("benchmarks", []) + ([fig["benchmark"]] if "benchmark" in fig else [])
    for bench in benches:
        if bench not in config["evaluation"]["benchmarks"]:
            fail(
                f"{key}.benchmark",
                bench,
                "not defined under evaluation.benchmarks",
                f"use one of {list(config['evaluation']['benchmarks'])}",
            )
    for model in fig.get("models", []) + ([fig["model"]] if "model" in fig else []):
        if model not in config["models"]:
            fail(f"{key}.model", model, "not defined under models", f"use one of {list(config['models'])}")
    evaluated = {c.method for c in cells(config) if not benches or c.bench in benches}
    for method in fig.get("methods", []) + ([fig["method"]] if "method" in fig else []):
        _check_method(f"{key}.methods", method)
        if method not in evaluated:
            fail(
                f"{key}.methods",
                method,
                "not evaluated on the figure's benchmarks",
                "add it to the benchmark's methods",
            )
    if "metric" in fig and fig["metric"] not in METRICS:
        fail(f"{key}.metric", fig["metric"], "unknown metric", f"use one of {list(METRICS)}")
    if fig["kind"] == "training_pairs" and not config["ablations"]["training_pairs"]["models"]:
        fail(
            f"{key}.kind",
            "training_pairs",
            "ablations.training_pairs.models is empty, so nothing is ablated",
            "list models under ablations.training_pairs, or remove the figure",
        )
    if fig["kind"] == "surrogate_fit" and set(config["training"]["surrogates"]) != set(KINDS):
        fail(
            "training.surrogates",
            config["training"]["surrogates"],
            f"figure {name} compares both surrogates",
            "train [linear, mlp], or remove the figure",
        )
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
            fail(
                f"{key}.value",
                fixed["value"],
                f"{fixed['method']} is not evaluated at this value for {model}",
                f"use one of {sorted(swept) or 'its thresholds'}, or add it to models.{model}.thresholds",
            )


def _check_training_ablation(config: dict) -> None:
    ablation = config["ablations"]["training_pairs"]
    for i, model in enumerate(ablation["models"]):
        if model not in config["models"]:
            fail(
                f"ablations.training_pairs.models[{i}]",
                model,
                "not defined under models",
                f"use some of {list(config['models'])}",
            )
    if ablation["models"]:
        bench = ablation["benchmark"]
        if bench not in config["evaluation"]["benchmarks"]:
            fail(
                "ablations.training_pairs.benchmark",
                bench,
                "not an evaluation.benchmarks entry",
                f"use one of {list(config['evaluation']['benchmarks'])}",
            )
        if config["evaluation"]["benchmarks"][bench]["benchmark"] != "ruler":
            fail(
                "ablations.training_pairs.benchmark",
                bench,
                "not a RULER entry",
                "use a RULER entry: its accuracy is what matched compression is compared on",
            )
    known = corpus.subsets(config["oracle"]["corpus"])
    for i, source in enumerate(ablation["sources"]):
        for subset in source.partition("=")[2].split(",") if "=" in source else ():
            if subset not in known:
                fail(
                    f"ablations.training_pairs.sources[{i}]",
                    source,
                    f"{subset!r} is not a subset of oracle.corpus",
                    f"name subsets among {list(known)}",
                )
    if len(set(ablation["sources"])) != len(ablation["sources"]) or len(set(ablation["sizes"])) != len(
        ablation["sizes"]
    ):
        fail("ablations.training_pairs", ablation, "repeats a size or a source", "list each once")


def check_publish(publish: dict) -> None:
    """What `snakemake publish` needs besides the schema: a namespace, and no placeholder for it or the dataset."""
    namespace, dataset = publish["namespace"], publish.get("dataset_repo")
    if not namespace:
        fail(
            "publish.namespace",
            "",
            "empty, and `snakemake publish` needs it",
            'set it to your Hub user or organisation (e.g. --config publish="{namespace: me}")',
        )
    for key, name in (("publish.namespace", namespace), ("publish.dataset_repo", (dataset or "").split("/")[0])):
        if name.lower() in PUBLISH_PLACEHOLDERS:
            fail(
                key,
                namespace if key == "publish.namespace" else dataset,
                f"{name!r} is a placeholder, not your Hub user or organisation (the upload would fail or go astray)",
                f"set {key} to yours, e.g. --config 'publish={{namespace: <you>}}'",
            )


def check(config: dict) -> None:
    """Every semantic check, in config order; raises ConfigError on the first bad value."""
    _check_results(config["results"])
    for name, model in config["models"].items():
        _check_model(name, model)
    _check_oracle(config["oracle"])
    for name, model in config["models"].items():
        if "oracle" in model:  # a model's own recipe (kvzap.plan.recipe)
            _check_oracle(recipe(config, name)["oracle"], f"models.{name}.oracle")
    _check_values("evaluation.ratios", config["evaluation"]["ratios"], 0.0, 1.0)
    for i, method in enumerate(config["evaluation"]["methods"]):
        _check_method(f"evaluation.methods[{i}]", method)
    for name, bench in config["evaluation"]["benchmarks"].items():
        _check_benchmark(config, name, bench)
    for model in config["evaluation"]["batch_size"]:
        if model not in config["models"]:
            fail("evaluation.batch_size", model, "not defined under models", f"use some of {list(config['models'])}")
    for cell in cells(config):
        model_id = config["models"][cell.model]["id"]
        if cell.method == "duo_attention" and duo_patterns.duo_pattern_name(model_id) is None:
            fail(
                f"evaluation.benchmarks.{cell.bench}.methods",
                cell.method,
                f"DuoAttention publishes no head pattern for {model_id}",
                f"add duo_attention to models.{cell.model}.skip_methods, or use duo_attention_on_the_fly",
            )
        family = model_config(model_id, config["models"][cell.model].get("revision"))
        reason = family and refusals.refusal(family, cell.method)
        if reason:
            fail(
                f"evaluation.benchmarks.{cell.bench}.methods",
                cell.method,
                f"{methods.label(cell.method)} cannot run on {model_id} (models.{cell.model}): {reason}",
                f"add {cell.method} to models.{cell.model}.skip_methods",
            )
        if methods.METHODS[cell.method].needs_hub and model_id in OFFLINE_MODELS:
            fail(
                f"evaluation.benchmarks.{cell.bench}.methods",
                cell.method,
                f"needs Hub assets that the offline model {model_id} does not have",
                "remove it for offline models (restrict the benchmark with models: or methods:)",
            )
    for name, fig in config.get("figures", {}).items():
        _check_figure(config, name, fig)
    _check_tables(config)
    _check_training_ablation(config)
    for i, model in enumerate(config["ablations"]["kv_input"]["models"]):
        if model not in config["models"]:
            fail(
                f"ablations.kv_input.models[{i}]",
                model,
                "not defined under models",
                f"use some of {list(config['models'])}",
            )
