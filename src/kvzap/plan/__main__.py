"""`python -m kvzap.plan CONFIG`: the start-up checks of a run, without Snakemake's YAML loader (which names no line
for a syntax error)."""

import argparse
from pathlib import Path

import yaml
from snakemake.utils import validate as fill_defaults

from kvzap.plan.checks import check
from kvzap.plan.errors import ConfigError
from kvzap.plan.schema import SCHEMA, validate
from kvzap.plan.sweep import cells


def main() -> None:
    parser = argparse.ArgumentParser(description="Check a kvzap config as a run would, before any job.")
    parser.add_argument("config", type=Path)
    args = parser.parse_args()
    try:
        with args.config.open() as stream:
            config = yaml.safe_load(stream)
    except yaml.YAMLError as err:
        raise SystemExit(f"Invalid configuration file {args.config}: {err}") from None
    try:
        validate(config)
        fill_defaults(config, str(SCHEMA))
        check(config)
    except ConfigError as err:
        raise SystemExit(str(err)) from None
    print(f"{args.config}: valid, {len(cells(config))} evaluation cells")


if __name__ == "__main__":
    main()
