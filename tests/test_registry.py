"""kvzap.evaluation.methods is the one list of methods: a new method is one entry, seen by the config checks, the sweep,
the tables and the figure legends."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import yaml
from snakemake.utils import validate as fill_defaults

from kvzap.evaluation import methods
from kvzap.plan import checks, errors, schema, sweep
from kvzap.report import figures, tables

ROOT = Path(__file__).resolve().parents[1]
CI = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())


@pytest.fixture
def made_up(monkeypatch):
    monkeypatch.setitem(methods.METHODS, "fancy_press", methods.MethodInfo("ratio", "Fancy Press"))
    return "fancy_press"


def _planned(config):
    schema.validate(config, schema.SCHEMA)
    fill_defaults(config, str(schema.SCHEMA))
    checks.check(config)
    return config


def test_a_new_method_is_one_registry_entry(made_up):
    config = copy.deepcopy(CI)
    config["evaluation"]["methods"].append(made_up)
    config["figures"]["ruler_tradeoff"]["methods"] = ["full", made_up]
    cells = sweep.cells(_planned(config))
    assert [c.value for c in cells if c.method == made_up] == ["0.5"]  # swept over evaluation.ratios
    assert methods.label(made_up) == "Fancy Press"
    results = pd.DataFrame(
        [
            dict(
                model="m",
                benchmark="b",
                benchmark_type="ruler",
                subset="512",
                method=m,
                value=v,
                compression_ratio=r,
                average=a,
            )
            for m, v, r, a in (("full", None, 0.0, 90.0), (made_up, 0.5, 0.5, 80.0))
        ]
    )
    fig, ax = plt.subplots()
    figures._curves(ax, results, "average", None)
    assert set(ax.get_legend_handles_labels()[1]) == {"Full cache", "Fancy Press"}
    plt.close(fig)
    assert made_up not in tables.KVZAP_METHODS  # only thresholded KVzap at the default window enters Table 2


def test_unregistered_method_is_refused():
    config = copy.deepcopy(CI)
    config["evaluation"]["methods"].append("fancy_press")
    with pytest.raises(errors.ConfigError, match="unknown method"):
        _planned(config)


def test_registry_and_plan_import_without_torch():
    code = "import sys, kvzap.plan, kvzap.evaluation.methods; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
