"""A config and the overlays on it, merged as `snakemake --configfile BASE OVERLAY ...` merges them (key by key,
Snakemake's own function), so every reader of a run's config sees what the run sees; `planned` also checks and
completes it as the Snakefile does."""

from __future__ import annotations

from pathlib import Path

import yaml
from snakemake.utils import update_config
from snakemake.utils import validate as fill_defaults

from kvzap.plan.checks import check
from kvzap.plan.schema import SCHEMA, validate
from kvzap.refusal import Refusal


def load(paths: list[Path]) -> dict:
    """The merged config of `paths` (the first is the base); a file that cannot be read as a YAML mapping is refused,
    naming it."""
    config: dict = {}
    for path in paths:
        try:
            with Path(path).open(encoding="utf-8") as stream:  # a stream: a syntax error names the file and line
                layer = yaml.safe_load(stream)
        except (OSError, UnicodeDecodeError) as err:
            raise Refusal(
                f"Configuration file {path}: not a readable text file ({err}). Fix: pass a YAML file."
            ) from None
        except yaml.YAMLError as err:
            raise Refusal(f"Invalid configuration file {path}: {err}") from None
        if not isinstance(layer, dict):
            raise Refusal(
                f"Configuration file {path}: a config is a YAML mapping of keys to values, got {type(layer).__name__}."
            )
        update_config(config, layer)
    return config


def planned(paths: list[Path]) -> dict:
    """The merged config of `paths`, checked and completed (`checked`)."""
    return checked(load(paths))


def checked(config: dict) -> dict:
    """`config` validated against the schema, its defaults filled in and every plan check passed, in place."""
    validate(config)
    fill_defaults(config, str(SCHEMA))
    check(config)
    return config
