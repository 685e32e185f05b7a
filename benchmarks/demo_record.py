"""A `make demo` run as a record: the wall time of each stage, read from Snakemake's log (the span from a stage's
first job start to its last job end), the install time and total the Makefile printed, the machine's CPU flags and
cores, and the demo's table (results/tables/results.csv), with each surrogate seed's score where a cell has several.
With --calibration (the table `python -m kvzap.plan CONFIG --forecast --calibrate FILE` measured on this machine
before the run), the forecast of each stage beside the run's own, and their ratio.

    python -m kvzap.plan config/config.yaml --forecast --calibrate calibration.json
    make demo 2>&1 | tee demo.log
    python benchmarks/demo_record.py --log demo.log --results results --calibration calibration.json \
        --install-s 58 --total-s 880 --out benchmarks/cpu/demo_run.json
"""

from __future__ import annotations

import argparse
import os
import re
from datetime import datetime
from pathlib import Path

import pandas as pd

from kvzap import dtypes
from kvzap.atomic import atomic_write_json
from kvzap.plan import forecast, overlays, schedule
from records import cpu_flags, output_file, print_table, seconds

STAGES = {  # rule name prefix -> stage
    "prepare_model": "prepare",
    "oracle_data": "oracle",
    "train_surrogate": "surrogates",
    "evaluate_": "evaluation",
    "merge": "evaluation",
    "aggregate": "tables and figures",
    "figure": "tables and figures",
}
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
START = re.compile(r"^(?:local)?rule (\w+):$")
END = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")
TABLE = ["method", "value", "compression_ratio", "average", "ci_low:average", "ci_high:average"]
TOLERANCE = 0.3  # a stage's forecast within 30 % of its measured span


def stage_of(rule: str) -> str | None:
    return next((stage for prefix, stage in STAGES.items() if rule.startswith(prefix)), None)


def stage_spans(lines: list[str]) -> dict[str, float]:
    """Seconds from each stage's first job start to its last job end."""
    now, spans = None, {}
    for line in lines:
        if match := STAMP.match(line.strip()):
            now = datetime.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")
        elif (match := START.match(line.strip()) or END.match(line.strip())) and now is not None:
            stage = stage_of(match.groups()[-1])
            if stage:
                first, last = spans.get(stage, (now, now))
                spans[stage] = (min(first, now), max(last, now))
    return {stage: (last - first).total_seconds() for stage, (first, last) in spans.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, required=True, help="the output of make demo")
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--install-s", type=seconds, required=True, help="seconds make setup took (measured outside)")
    parser.add_argument("--total-s", type=seconds, required=True, help="seconds make demo took, install included")
    parser.add_argument("--note", default="", help="how the run was made (clone, caches, environment)")
    parser.add_argument("--calibration", type=Path, default=None, help="a throughput table measured on this machine")
    parser.add_argument("--config", type=Path, nargs="+", default=[Path("config/config.yaml")], help="the run's config")
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    spans = stage_spans(args.log.read_text(errors="replace").splitlines())
    results = pd.read_csv(args.results / "tables" / "results.csv")
    seeds = [c for c in results.columns if c.startswith("seed:")]  # each surrogate seed's own score (MLP cells)
    table = results[TABLE + seeds].to_dict("records")
    surrogates = pd.read_csv(args.results / "tables" / "surrogates.csv")[["surrogate", "r2_mean", "n_train_pairs"]]
    print_table([{"stage": k, "seconds": v} for k, v in spans.items()], ["stage", "seconds"])
    predicted = forecast_check(args.config, args.calibration, spans) if args.calibration else None
    print_table(table, TABLE)
    atomic_write_json(
        args.out,
        {
            "note": args.note,
            "cores": os.cpu_count(),
            "cpu_flags": cpu_flags(),
            "dtype": dtypes.resolve("auto", "cpu"),
            "install_s": args.install_s,
            "total_s": args.total_s,
            "stage_s": spans,
            "cells": table,
            "surrogates": surrogates.to_dict("records"),
            **({"forecast": predicted} if predicted else {}),
        },
    )


def forecast_check(config_files: list[Path], calibration: Path, spans: dict[str, float]) -> dict:
    """Each stage's forecast on this machine's cores from the calibrated table, beside the run's measured span."""
    table = forecast.read_throughput(calibration)
    predicted = schedule.stage_spans(forecast.jobs(overlays.planned(config_files), table), os.cpu_count())
    stages = [
        {"stage": stage, "forecast_s": predicted[stage], "measured_s": measured, "ratio": predicted[stage] / measured}
        for stage, measured in spans.items()
    ]
    print_table(stages, ["stage", "forecast_s", "measured_s", "ratio"])
    return {
        "calibration": table,
        "tolerance": TOLERANCE,
        "stages": stages,
        "within_tolerance": all(abs(s["ratio"] - 1) <= TOLERANCE for s in stages),
    }


if __name__ == "__main__":
    main()
