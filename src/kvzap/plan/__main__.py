"""`python -m kvzap.plan CONFIG [OVERLAY ...]`: the start-up checks of a run, without Snakemake's YAML loader (which
names no line for a syntax error); with --forecast, what the run will cost (kvzap.plan.forecast)."""

import argparse
from pathlib import Path

from snakemake.utils import validate as fill_defaults

from kvzap.plan import forecast, overlays
from kvzap.plan.checks import check
from kvzap.plan.schema import SCHEMA, validate
from kvzap.plan.sweep import cells
from kvzap.refusal import entry_point


@entry_point
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Check a kvzap config as a run would, before any job.")
    parser.add_argument("config", type=Path, nargs="+", help="a config and the overlays merged on it, as --configfile")
    parser.add_argument("--forecast", action="store_true", help="print jobs, tokens and GPU-hours per stage and model")
    parser.add_argument("--throughput", type=Path, default=None, help="JSON replacing forecast throughput defaults")
    args = parser.parse_args(argv)
    if args.throughput is not None and not args.forecast:
        raise SystemExit(f"--throughput {args.throughput} is read by the forecast only: add --forecast.")
    try:
        config = overlays.load(args.config)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    validate(config)
    fill_defaults(config, str(SCHEMA))
    check(config)
    print(f"{' + '.join(map(str, args.config))}: valid, {len(cells(config))} evaluation cells")
    if args.forecast:
        from tabulate import tabulate

        rows = forecast.forecast(config, forecast.read_throughput(args.throughput))
        print(tabulate(rows, headers="keys", floatfmt=",.2f", intfmt=","))


if __name__ == "__main__":
    main()
