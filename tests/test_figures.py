"""Figures read what the rule hands them and who each cell says it is, never a path they rebuild."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import pandas as pd
import pytest

from kvzap.plan import checks, commands, errors, inputs, paths, sweep
from kvzap.report import figures
from plan_helpers import BASE, planned

TAU = -4.1234567  # a threshold whose short form (-4.12346) names no cell


@pytest.fixture
def config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # results roots are relative, under results/
    config = copy.deepcopy(BASE)
    config["results"] = "results/figures-test"
    config["models"]["smollm2-135m"]["thresholds"] = [TAU, -6]
    config["figures"] = {"dist": {"kind": "ratio_distribution", "method": "kvzap_mlp", "value": TAU}}
    return planned(config)


def _write_cells(config: dict) -> None:
    """Each cell's predictions carry a compression ratio that tells the cells apart."""
    for k, cell in enumerate(sweep.cells(config)):
        folder = Path(paths.cell_dir(config["results"], cell))
        folder.mkdir(parents=True)
        value = None if cell.value == "none" else float(cell.value)
        identity = {"model": cell.model, "bench": cell.bench, "method": cell.method, "value": value}
        (folder / "metrics.json").write_text(json.dumps(identity))
        pd.DataFrame({"compression_ratio": [k / 10, k / 10]}).to_csv(folder / "predictions.csv", index=False)


def test_ratio_distribution_reads_the_cell_of_the_exact_threshold(config, tmp_path, monkeypatch):
    _write_cells(config)
    predictions = inputs.figure_inputs(config, "dist")["predictions"]
    assert len(predictions) == 2  # both thresholds of kvzap_mlp: the figure picks by identity, not by path
    tables = Path(config["results"]) / "tables"
    tables.mkdir()
    pd.DataFrame({"model": ["smollm2-135m"], "benchmark": ["ruler-512"]}).to_csv(tables / "results.csv", index=False)
    drawn = {}
    monkeypatch.setattr(
        figures, "_save", lambda fig, out: drawn.update(labels=[t.get_text() for t in fig.axes[0].get_xticklabels()])
    )
    argv = shlex.split(commands.figure_args(config, "dist", predictions)) + ["--out", str(tmp_path / "dist.png")]
    monkeypatch.setattr("sys.argv", ["kvzap.report.figures", *argv])
    figures.main()
    expected = [c for c in sweep.cells(config) if c.method == "kvzap_mlp" and c.value == sweep.value_label(TAU)]
    k = sweep.cells(config).index(expected[0])
    assert drawn["labels"] == [f"ruler-512\n(mean {k / 10:.2f})"]


def test_surrogate_fit_needs_both_surrogates(config):
    config = copy.deepcopy(config)
    config["training"]["surrogates"] = ["linear"]
    config["figures"] = {"fit": {"kind": "surrogate_fit"}}
    with pytest.raises(errors.ConfigError, match="compares both surrogates"):
        checks.check(config)


def test_figure_kinds_are_one_list():
    """The schema's enum, the report's kinds (their keys and captions) and the figures module's drawers agree."""
    from kvzap.plan import schema
    from kvzap.report import outputs

    spec = json.loads(schema.SCHEMA.read_text())  # the enum sits deep under figures: found by one of its members
    enum = next(v["enum"] for v in _walk(spec) if isinstance(v, dict) and "tradeoff" in v.get("enum", []))
    assert set(enum) == set(outputs.FIGURES)
    assert all(callable(getattr(figures, kind)) for kind in outputs.FIGURES)


def _walk(node):
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from _walk(child)
