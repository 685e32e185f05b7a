# The plan (checks, sweep, paths, command lines) lives in kvzap.plan; these are its Snakemake bindings, and every
# function the rules call is here.
import os
import re

from kvzap.evaluation import methods
from kvzap.plan import checks, cluster, commands, errors, inputs, jobs, paths, sweep
from kvzap.report import outputs

RESULTS = config["results"]
ENV = "../envs/kvzap.yaml"  # every rule's conda environment (used only with --sdm conda)
# Jobs import kvzap from this checkout whatever the environment (the conda env holds only the dependencies);
# envvars hands the variable on to cluster jobs.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [f"{workflow.basedir}/../src", os.environ.get("PYTHONPATH")]))


envvars:
    "PYTHONPATH",


try:
    checks.check(config)
except errors.ConfigError as err:
    raise SystemExit(str(err)) from None


wildcard_constraints:
    model="[^/]+",
    method="[^/]+",
    value="[^/]+",
    kind="linear|mlp",
    seed=r"\d+",
    shard=r"\d+",
    n_shards=r"\d+",


def model_resource(stage, key, model=None):
    """A rule's resource from models.<model>.resources.<stage> (kvzap.plan.cluster.RESOURCE_DEFAULTS otherwise);
    the model is the rule's wildcard unless the rule serves one model (a prefill group). cpus "all" is --cores."""

    def value(wildcards, attempt=1):
        chosen = cluster.resource(config, model or wildcards.model, stage, key, attempt)
        return workflow.cores if chosen == "all" else chosen

    return value


def slurm_placement():
    """Config slurm.partition/account; unset keys leave the profile's $KVZAP_SLURM_* defaults."""
    return {f"slurm_{k}": v for k, v in config.get("slurm", {}).items() if v}


def stage_resources(stage, model=None):
    """A per-model rule's cluster resources for its stage (models.<model>.resources.<stage>) and placement."""
    return {**slurm_placement(), **{key: model_resource(stage, key, model) for key in ("gpu", "mem_mb", "runtime")}}


def report_resources():
    """The resources of the report rules (tables, figures): no GPU, whatever the models."""
    return {**slurm_placement(), "gpu": 0, "mem_mb": 4000, "runtime": 30}


def log_file(*parts):
    return paths.log(RESULTS, *parts)


# ------------------------------------------------------------------ evaluation


EVAL_JOBS = sweep.eval_jobs(config)


def rule_id(name):
    """A config name as part of a rule name (letters, digits and '_')."""
    return re.sub(r"\W", "_", name)


def _inputs(model, cell_methods):
    """The prepared model and every surrogate the cells' methods read."""
    kinds = sorted({methods.METHODS[m].surrogate for m in cell_methods} - {None})
    surrogates = {
        f"surrogate_{k}": [f"{d}/metrics.json" for d in inputs.surrogate_dirs(config, model, k)] for k in kinds
    }
    return {"model": paths.model_json(RESULTS, model), **surrogates}


def evaluate_inputs(wc):
    return _inputs(wc.model, [wc.method])


def group_inputs(job):
    return _inputs(job.model, [m for m, _ in job.cells])


def job_spec(bench, n_shards, job=None):
    """An evaluation rule's spec param: the job of a prefill group, or the cell alone its wildcards name, as JSON."""

    def spec(wc):
        chosen = job or sweep.EvalJob(wc.model, bench, None, ((wc.method, wc.value),))
        return jobs.evaluate_spec(config, chosen, int(wc.get("shard", 0)), n_shards).to_json()

    return spec


def group_files(job, n_shards):
    """Every file of a prefill group's cells: each cell's own folder, as a job of that cell alone writes it."""
    return [
        f
        for method, value in job.cells
        for name in ("metrics.json", "predictions.csv")
        for f in cell_files(job.bench, name, n_shards=n_shards, model=job.model, method=method, value=value)
    ]


def cell_files(bench, name, shard="{shard}", n_shards=1, model="{model}", method="{method}", value="{value}"):
    """Per-subset files of one evaluation job (its shard folders, or the cells themselves)."""
    subsets = config["evaluation"]["benchmarks"][bench]["subsets"]
    cells = [sweep.Cell(model, bench, subset, method, value) for subset in subsets]
    return [f"{paths.shard_dir(RESULTS, cell, shard, n_shards)}/{name}" for cell in cells]


CELL = paths.cell_dir(RESULTS, sweep.Cell("{model}", "{bench}", "{subset}", "{method}", "{value}"))


def sharded_entries():
    """The benchmark entries split into shards, as a wildcard pattern ("(?!)" matches nothing)."""
    names = [name for name, entry in config["evaluation"]["benchmarks"].items() if entry["shards"] > 1]
    return "|".join(map(re.escape, names)) or "(?!)"


def shard_files(wc, name):
    """What one merge reads: a file of every shard of its cell."""
    n_shards = config["evaluation"]["benchmarks"][wc.bench]["shards"]
    cell = sweep.Cell(wc.model, wc.bench, wc.subset, wc.method, wc.value)
    return [f"{paths.shard_dir(RESULTS, cell, k, n_shards)}/{name}" for k in range(n_shards)]


# ------------------------------------------------------------------ report


def all_cell_metrics(wc=None):
    """Every cell; with tables.allow_missing (after a `--keep-going` run) only those that exist now."""
    cells = inputs.cell_metrics(config)
    return [c for c in cells if os.path.exists(c)] if config["tables"]["allow_missing"] else cells


def surrogate_metrics(wc=None):
    return [metrics for _, metrics in inputs.surrogate_metrics(config)]


def figure_predictions(wc):
    files = inputs.figure_inputs(config, wc.name)["predictions"]
    return [f for f in files if os.path.exists(f)] if config["tables"]["allow_missing"] else files


def table_outputs():
    """Every table as a report item: the Snakemake report shows each CSV with its title."""
    return {
        name: report(
            paths.table(RESULTS, name),
            caption="../workflow/report/table.rst",
            category="Tables",
            labels={"table": name, "title": title.format(tolerance=config["tables"]["tolerance"])},
        )
        for name, title in outputs.TABLES.items()
    }


# ------------------------------------------------------------------ publish


def published_surrogates(wc=None):
    """Folders of every trained surrogate; an empty or placeholder namespace fails when publish is requested."""
    checks.check_publish(config["publish"])
    return [paths.surrogate_dir(RESULTS, m, k) for m in config["models"] for k in config["training"]["surrogates"]]
