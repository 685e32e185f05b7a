"""The README's numbers are its records' numbers: the demo table, the stage times and the evaluation's floor ratios
are read back from the committed JSON records (a README edited by hand, or a record replaced, fails here)."""

import json
import re
from pathlib import Path

import pytest

from kvzap.evaluation import methods

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RECORDS = ROOT / "benchmarks" / "cpu"
LABELS = {info.label.lower(): name for name, info in methods.METHODS.items()}
MINUS = str.maketrans({"−": "-"})


def table_rows(heading: str) -> list[list[str]]:
    """The cells of the first Markdown table after `heading`, header and rule rows dropped."""
    text = README.split(heading, 1)[1]
    block = re.search(r"((?:^\|.*\|\n)+)", text, re.MULTILINE).group(1)
    rows = [[cell.strip().strip("*") for cell in line.strip("|").split("|")] for line in block.splitlines()]
    return rows[2:]


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) <= 200


DEMO_RUNS = ("demo_seeds_bf16.json", "demo_seeds_avx2.json")  # the demo table's machines, left to right


def recorded_cells(name: str) -> dict:
    """A demo record's cells by (method, value)."""
    record = json.loads((RECORDS / name).read_text())
    return {(c["method"], None if c["value"] != c["value"] else round(c["value"], 3)): c for c in record["cells"]}


def test_demo_table_is_the_recorded_runs():
    """Each machine's ratio and score [interval], then, for a cell with several surrogate seeds, each seed's score."""
    runs = [recorded_cells(name) for name in DEMO_RUNS]
    rows = table_rows("## Results at a glance")
    assert [len(rows)] * len(runs) == [len(cells) for cells in runs]
    for label, parameter, *machines in rows:
        value = re.search(r"-?\d+(\.\d+)?", parameter.translate(MINUS))
        key = (LABELS[label.lower()], None if value is None else round(float(value.group()), 3))
        for cells, ratio, score in zip(runs, machines[::2], machines[1::2], strict=True):
            cell = cells[key]
            assert float(ratio) == pytest.approx(cell["compression_ratio"], abs=5e-4), label
            seeds = [cell[k] for k in sorted(cell) if k.startswith("seed:") and cell[k] == cell[k]]
            expected = [cell["average"], cell["ci_low:average"], cell["ci_high:average"], *seeds]
            assert [float(x) for x in re.findall(r"\d+\.\d+", score)] == pytest.approx(expected, abs=0.051), label


def test_stage_times_are_the_recorded_runs():
    rows = table_rows("## Quick start")
    assert rows
    for machine, dtype, install, *stages, total in rows:
        record = json.loads((RECORDS / re.search(r"\(benchmarks/cpu/(\w+\.json)\)", machine).group(1)).read_text())
        assert dtype == record["dtype"]
        seconds = [float(re.match(r"[\d.]+", cell).group()) for cell in (install, *stages, total)]
        recorded = [record["install_s"], *(record["stage_s"][s] for s in ("prepare", "oracle", "surrogates"))]
        recorded += [record["stage_s"]["evaluation"], record["total_s"]]
        assert seconds == pytest.approx(recorded, abs=0.5), machine


def test_evaluation_floor_ratios_are_the_record():
    record = {r["dtype"]: r for r in json.loads((RECORDS / "eval_floor.json").read_text())["records"]}
    row = next(r for r in table_rows("## Speed and memory") if r[0].startswith("evaluation job"))
    quoted = dict(re.findall(r"([\d.]+)× \((\w+)\)", row[1]))
    assert {dtype: float(x) for x, dtype in quoted.items()} == pytest.approx(
        {dtype: round(r["job_over_floor"], 2) for dtype, r in record.items()}
    )


def test_training_floor_is_the_record():
    record = json.loads((RECORDS / "training_floor.json").read_text())
    row = next(r for r in table_rows("## Speed and memory") if r[0].startswith("KVzap-MLP training"))
    minutes, ratio = map(float, re.findall(r"(\d+\.\d+)", row[1]))
    assert (minutes, ratio) == pytest.approx((round(record["core_minutes"], 2), round(record["fit_over_floor"], 2)))
    assert f"{record['pairs']:,} pairs" in row[0]
    reading = record["reading"]
    row = next(r for r in table_rows("## Speed and memory") if r[0].startswith("KVzap-MLP minibatch reading"))
    assert [float(x) for x in re.findall(r"(\d+\.\d+)", row[1])] == pytest.approx(
        [round(reading["fresh_ms"], 1), round(reading["reused_ms"], 1), round(reading["fresh_over_reused"], 2)]
    )


def test_mlp_against_linear_on_a_third_cpu_is_the_record():
    """docs/results.md's Xeon sentence: the MLP's seed means it quotes are both records', each inside KVzap-Linear's
    interval or above it, Linear's scores equal across the machines, and every seed within one sample of the EPYC's."""
    epyc, xeon = recorded_cells(DEMO_RUNS[0]), recorded_cells("demo_run_xeon_bf16.json")
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8").split("A third CPU", 1)[1].split("\n\n", 1)[0]
    quoted = [[float(x) for x in m.split(" / ")] for m in re.findall(r"\d+\.\d / \d+\.\d / \d+\.\d", text)]
    taus = (-2.6, -1.6, -1.0)
    assert quoted == [
        [pytest.approx(run[("kvzap_mlp", t)]["average"], abs=0.051) for t in taus] for run in (xeon, epyc)
    ]
    for t in taus:
        mlp, linear = xeon[("kvzap_mlp", t)], xeon[("kvzap_linear", t)]
        assert mlp["average"] >= linear["ci_low:average"]
        assert linear["average"] == epyc[("kvzap_linear", t)]["average"]
        seeds = [k for k in mlp if k.startswith("seed:")]
        assert max(abs(mlp[k] - epyc[("kvzap_mlp", t)][k]) for k in seeds) <= 100 / 30 + 0.01  # one sample of 30


def test_forecast_claim_is_the_record():
    """The README's word on the calibrated forecast is its record's: every stage within the quoted share."""
    stages = json.loads((RECORDS / "demo_forecast.json").read_text())["forecast"]["stages"]
    quoted = re.search(r"the forecast gave each stage within (\d+) %", " ".join(README.split()))
    assert quoted and max(abs(stage["ratio"] - 1) for stage in stages) * 100 <= int(quoted.group(1))
