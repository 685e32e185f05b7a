# The plan (checks, sweep, paths, command lines) lives in kvzap.plan; these are its Snakemake bindings.
import json
import os
import re

from kvzap import plan, registry

RESULTS = config["results"]
PYTHON = "python"  # the environment's interpreter (the venv's, or a conda env's with --use-conda)
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
