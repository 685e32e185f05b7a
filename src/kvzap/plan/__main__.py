"""`python -m kvzap.plan CONFIG [OVERLAY ...]`: the start-up checks of a run, without Snakemake's YAML loader (which
names no line for a syntax error); with --targets, the files that make one benchmark entry's cells (to run that entry
alone: `snakemake $(python -m kvzap.plan CONFIG --targets ENTRY) --configfile CONFIG`); with --forecast, what the run
will cost (kvzap.plan.forecast), and with --calibrate, at this machine's measured speed, stage by stage on its cores
(kvzap.plan.calibrate, .schedule)."""

import argparse
import json
import os
from pathlib import Path

from kvzap.atomic import atomic_write_json
from kvzap.plan import forecast, overlays, paths, schedule
from kvzap.plan.sweep import cells
from kvzap.refusal import Refusal, entry_point


@entry_point
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Check a kvzap config as a run would, before any job.")
    parser.add_argument("config", type=Path, nargs="+", help="a config and the overlays merged on it, as --configfile")
    parser.add_argument(
        "--targets",
        metavar="ENTRY",
        help="print only the metrics.json of every cell of this benchmark entry, one per line: Snakemake targets",
    )
    parser.add_argument("--forecast", action="store_true", help="print jobs, tokens and GPU-hours per stage and model")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--throughput", type=Path, default=None, help="JSON replacing forecast throughput defaults")
    source.add_argument(
        "--calibrate",
        type=Path,
        default=None,
        metavar="OUT",
        help="measure the config's models here (about a minute each), write the throughput table to OUT and "
        "forecast with it, stage by stage on this machine",
    )
    parser.add_argument("--cores", type=int, default=None, help="also give each stage's wall time on this many cores")
    args = parser.parse_args(argv)
    if args.cores is not None and args.cores < 1:
        parser.error(f"--cores {args.cores}: give the machine's cores, a whole number of at least 1")
    given = {"--throughput": args.throughput, "--calibrate": args.calibrate, "--cores": args.cores}
    for flag, value in given.items():
        if value is not None and not args.forecast:
            raise SystemExit(f"{flag} {value} is read by the forecast only: add --forecast.")
    if args.targets and args.forecast:
        parser.error("--targets prints Snakemake targets only: run --forecast separately")
    config = overlays.planned(args.config)
    if args.targets:
        print("\n".join(entry_targets(config, args.targets)))
        return
    print(f"{' + '.join(map(str, args.config))}: valid, {len(cells(config))} evaluation cells")
    if not args.forecast:
        return
    from tabulate import tabulate

    if args.calibrate:
        from kvzap.plan.calibrate import calibrate

        table = calibrate(config)
        atomic_write_json(args.calibrate, table)
        print(f"measured on this machine ({args.calibrate}):\n{json.dumps(table, indent=1)}")
        args.cores = args.cores or os.cpu_count()
    else:
        table = forecast.read_throughput(args.throughput)
    print(tabulate(forecast.forecast(config, table), headers="keys", floatfmt=",.2f", intfmt=","))
    print(tabulate(forecast.scaling(config, table), headers="keys"))
    if args.cores:
        spans = schedule.stage_spans(forecast.jobs(config, table), args.cores)
        print(f"\nEach stage's wall time on {args.cores} cores (first job start to last job end; they overlap):")
        print(tabulate([{"stage": k, "seconds": round(v)} for k, v in spans.items()], headers="keys"))


def entry_targets(config: dict, entry: str) -> list[str]:
    entries = config["evaluation"]["benchmarks"]
    if entry not in entries:
        raise Refusal(f"--targets {entry}: no such benchmark entry in this config; it has {', '.join(entries)}")
    return [f"{paths.cell_dir(config['results'], cell)}/metrics.json" for cell in cells(config) if cell.bench == entry]


if __name__ == "__main__":
    main()
