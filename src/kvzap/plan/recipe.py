"""A model's oracle and training settings: the config's, with the model's own `oracle` and `training` keys over them.
One config can then compare training recipes on one model, each under its own model name (config/paper_small.yaml:
the paper's recipe beside the demo's)."""

from __future__ import annotations

RECIPE_KEYS = ("oracle", "training")


def recipe(config: dict, model: str) -> dict:
    """`config` as `model`'s jobs see it: its `oracle` and `training` sections with the model's overrides merged."""
    spec = config["models"][model]
    return {**config, **{key: {**config[key], **spec.get(key, {})} for key in RECIPE_KEYS}}
