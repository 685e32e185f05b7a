"""The cluster resources of each stage's jobs: a model's `resources.<stage>` over one set of defaults."""

from __future__ import annotations

# The one default of every cluster resource (a stage's keys in models.<name>.resources override them).
RESOURCE_DEFAULTS = {"gpu": 0, "cpus": 1, "mem_mb": 8000, "runtime": 120}


def resource(config: dict, model: str, stage: str, key: str, attempt: int = 1):
    """A model's resource for a stage; runtime and memory grow with each retry."""
    value = config["models"][model].get("resources", {}).get(stage, {}).get(key, RESOURCE_DEFAULTS[key])
    return value * attempt if key in ("runtime", "mem_mb") else value
