# The plan (checks, sweep, paths, command lines) lives in kvzap.plan; these are its Snakemake bindings.
import os
import re

from kvzap import plan, registry

RESULTS = config["results"]
PYTHON = "python"  # the environment's interpreter: the venv's, or envs/kvzap.yaml's with --sdm conda
ENV = "../envs/kvzap.yaml"  # every rule's conda environment (used only with --sdm conda)
# Jobs import kvzap from this checkout whatever the environment (the conda env holds only the dependencies).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [f"{workflow.basedir}/../src", os.environ.get("PYTHONPATH")]))
LOGS = f"{RESULTS}/logs"

try:
    plan.check(config)
except plan.ConfigError as err:
    raise SystemExit(str(err)) from None


wildcard_constraints:
    model="[^/]+",
    method="[^/]+",
    value="[^/]+",
    kind="linear|mlp",
    shard=r"\d+",
    n_shards=r"\d+",


def model_resource(stage, key):
    """A rule's resource from models.<model>.resources.<stage> (kvzap.plan.RESOURCE_DEFAULTS otherwise)."""
    return lambda wildcards, attempt=1: plan.resource(config, wildcards.model, stage, key, attempt)


def slurm_placement():
    """Config slurm.partition/account; unset keys leave the profile's $KVZAP_SLURM_* defaults."""
    return {f"slurm_{k}": v for k, v in config.get("slurm", {}).items() if v}


def surrogate_dir(model, kind):
    return plan.surrogate_dir(RESULTS, model, kind)
