"""kvzap.report.aggregate: every table written, and partial studies (missing cells) never pass unmarked."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cell_fixtures import cell_dir, write_aime_cell, write_cell
from kvzap.report import aggregate

SRC = Path(__file__).resolve().parents[1] / "src"
CELL_TABLES = ("results", "best", "best_auto", "aime_rollouts", "window_ablation")


@pytest.fixture
def cells(tmp_path):
    root = tmp_path / "results"
    paths = [
        write_cell(root, "m", "longbench", "lcc", "full", None, ratio=0.0, average=60.0),
        write_cell(root, "m", "longbench", "lcc", "kvzap_mlp", -4.0, ratio=0.6, average=59.5),
        write_cell(root, "m", "longbench", "lcc", "kvzap_mlp_w0", -4.0, ratio=0.3, average=40.0),
        write_aime_cell(root, "m", "full", None, [[True, True], [False, True]], ratio=0.0),
        write_aime_cell(root, "m", "kvzap_mlp", -4.0, [[True, False], [False, True]], ratio=0.7),
    ]
    return root, paths


def test_missing_cell_is_an_error_naming_it(cells, tmp_path):
    root, paths = cells
    lost = cell_dir(root, "m", "longbench", "qasper", "kvzap_mlp", -4.0) / "metrics.json"
    with pytest.raises(FileNotFoundError, match=f"(?s)1 expected cell.*{lost}.*--allow-missing"):
        aggregate.aggregate(paths + [lost], [], tmp_path / "tables")
    assert not (tmp_path / "tables" / "results.csv").exists()


def test_allow_missing_names_the_missing_cells_and_marks_every_table_partial(cells, tmp_path):
    root, paths = cells
    lost = cell_dir(root, "m", "longbench", "qasper", "kvzap_mlp", -4.0) / "metrics.json"
    out = tmp_path / "tables"
    results = aggregate.aggregate(
        paths + [lost], [], out, allow_missing=True, table2_choice={"m": {"method": "kvzap_mlp", "value": -4}}
    )
    assert len(results) == len(paths)
    missing = pd.read_csv(out / "missing.csv")
    assert missing["path"].tolist() == [str(lost)]  # the path names model, benchmark, subset, method, value
    markdown = (out / "results.md").read_text()
    assert (
        markdown.startswith("# PARTIAL RESULTS: 1 of 6 expected cells are missing")
        and str(lost) in markdown.split("##")[0]
    )
    for name in CELL_TABLES:
        table = pd.read_csv(out / f"{name}.csv")
        assert len(table) and table["partial"].all(), name
    assert markdown.count("(PARTIAL)") == len(CELL_TABLES)
    assert json.loads((out / "provenance.json").read_text())["params"]["missing"] == [str(lost)]


def test_complete_study_writes_every_table_unmarked(cells, tmp_path):
    _, paths = cells
    out = tmp_path / "tables"
    aggregate.aggregate(paths, [], out, table2_choice={"m": {"method": "kvzap_mlp", "value": -4}})
    for name in CELL_TABLES:
        assert not pd.read_csv(out / f"{name}.csv")["partial"].any(), name
    assert pd.read_csv(out / "missing.csv").empty
    markdown = (out / "results.md").read_text()
    assert "PARTIAL" not in markdown
    for title in ("Table 1", "Table 2", "Table 3", "Table 4", "Sliding-window ablation", "Missing cells"):
        assert f": {title}" in markdown
    rollouts = pd.read_csv(out / "aime_rollouts.csv", converters={"correct": json.loads})
    assert rollouts["correct"].tolist() == [[1, 2], [1, 1]]  # full cache first, then kvzap_mlp -4


def test_cli_writes_tables_2_and_3(cells, tmp_path):
    _, paths = cells
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(
        json.dumps(
            dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=12288)
        )
    )
    record = tmp_path / "results" / "m" / "model.json"
    record.write_text(json.dumps({"path": str(hf)}))
    out = tmp_path / "tables"
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "kvzap.report.aggregate",
            "--cells",
            *map(str, paths),
            "--out",
            str(out),
            "--table2",
            json.dumps({"m": {"method": "kvzap_mlp", "value": -4}}),
            "--tolerance",
            "0.5",
            "--models",
            str(record),
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    best = pd.read_csv(out / "best.csv").set_index("benchmark")
    assert best.loc["longbench", ["full", "kvzap", "compression_ratio"]].tolist() == [60.0, 59.5, 0.6]
    assert best.loc["average", "compression_ratio"] == pytest.approx((0.6 + 0.7) / 2)
    assert pd.read_csv(out / "best_auto.csv")["tolerance"].eq(0.5).all()
    assert pd.read_csv(out / "overhead.csv")[["model", "D_int"]].values.tolist() == [["m", 12288]]


def test_results_name_each_cells_attention_and_flag_a_gpu_cell_varlen_never_served(tmp_path):
    """A GPU cell served by the decoding kernel alone (varlen unavailable) is flagged in results.csv and in
    results.md; one where varlen served beside it (padded windows) is not, nor a cell written without a record."""

    def served(kernels, device):
        return {"implementations": ["kvzap"], "segment_kernels": kernels, "devices": [device], "compiled": False}

    cells = [
        ("full", None, {}),  # no record
        ("kvzap_linear", -4.0, {"attention": served(["decode"], "cuda")}),
        ("kvzap_mlp", -4.0, {"attention": served(["decode", "varlen"], "cuda")}),
    ]
    root = tmp_path / "results"
    paths = [
        write_cell(root, "m", "longbench", "lcc", method, value, ratio=0.5, average=60.0, **record)
        for method, value, record in cells
    ]
    out = tmp_path / "tables"
    aggregate.aggregate(paths, [], out)
    results = pd.read_csv(out / "results.csv", keep_default_na=False).set_index("method")
    assert results.loc["kvzap_linear", ["attention", "attention_warning"]].tolist() == [
        "kvzap (decode) on cuda",
        "⚠ no varlen on GPU",
    ]
    mlp = results.loc["kvzap_mlp", ["attention", "attention_warning"]].tolist()
    assert mlp == ["kvzap (decode, varlen) on cuda", ""]
    assert results.loc["full", ["attention", "attention_warning"]].tolist() == ["", ""]
    flagged = [line for line in (out / "results.md").read_text().splitlines() if "⚠ no varlen on GPU" in line]
    assert len(flagged) == 1 and "kvzap_linear" in flagged[0]
