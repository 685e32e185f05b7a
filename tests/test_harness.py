"""The evaluation harness, tables and figures, end to end on a tiny random model (no hub)."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from kvzap.evaluation import job, merge, methods, presses
from kvzap.evaluation.spec import CellSpec, JobError, JobSpec
from kvzap.report import aggregate, figures
from kvzap.surrogate.model import Surrogate
from tiny_models import tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    tok = tiny_tokenizer()
    model = tiny_model("llama", len(tok), max_position_embeddings=2048)
    model.save_pretrained(root / "hf")
    tok.save_pretrained(root / "hf")
    (root / "model.json").write_text(json.dumps({"model_id": "tiny", "path": str(root / "hf"), "revision": "r0"}))
    Surrogate(64, 2, 2).save_pretrained(root / "linear")
    return root


def _cell(root, out, method, value=None, subset="256", shard=(0, 1), **settings):
    spec = JobSpec(
        model=str(root / "model.json"),
        benchmark="ruler",
        subsets=(subset,),
        cells=(CellSpec(method, value, {subset: str(out)}),),
        model_name="m",
        bench_name=f"ruler-{subset}",
        tasks=("niah_single_2", "vt"),
        n_samples=2,
        max_new_tokens=4,
        shard=shard[0],
        n_shards=shard[1],
        **{"surrogate_linear": (str(root / "linear"),), **settings},
    )
    return job.evaluate(spec)[0]


def test_sharded_cell_merges_to_the_unsharded_one(tiny_setup, tmp_path, monkeypatch):
    _cell(tiny_setup, tmp_path / "whole", "kvzap_linear", 0.0)
    whole = merge.merge([tmp_path / "whole"], tmp_path / "single")
    parts = [tmp_path / f"part{k}" for k in range(3)]
    for k, part in enumerate(parts):
        assert _cell(tiny_setup, part, "kvzap_linear", 0.0, shard=(k, 3))["n_samples"] in (1, 2)
    # the command line of rules/evaluate.smk's merge
    monkeypatch.setattr("sys.argv", ["merge", "--shards", *map(str, parts), "--out", str(tmp_path / "merged")])
    merge.main()
    merged = json.loads((tmp_path / "merged" / "metrics.json").read_text())
    for key in ("per_task", "average", "compression_ratio", "n_samples"):
        assert merged[key] == pytest.approx(whole[key])
    assert merged["attention"] == whole["attention"] and whole["attention"]["segment_kernels"]  # the shards' union
    columns = ["sample_id", "prediction", "compression_ratio", "answers"]
    frame = lambda d: pd.read_csv(d / "predictions.csv", keep_default_na=False).sort_values("sample_id")[columns]  # noqa: E731
    pd.testing.assert_frame_equal(
        frame(tmp_path / "merged").reset_index(drop=True), frame(tmp_path / "single").reset_index(drop=True)
    )
    with pytest.raises(ValueError, match="incomplete"):
        merge.merge(parts[:2], tmp_path / "broken")
    monkeypatch.setattr("sys.argv", ["merge", "--shards", str(tmp_path / "none"), "--out", str(tmp_path / "broken")])
    with pytest.raises(SystemExit, match=r"none has no metrics.json or predictions.csv\. Fix: run"):
        merge.main()


def test_cells_tables_and_figures(tiny_setup, tmp_path):
    cells = [("full", None), ("knorm", 0.5), ("kvzap_linear", 0.0), ("kvzap_linear", -1e9)]
    paths = []
    for method, value in cells:
        out = tmp_path / "m" / "eval" / "ruler-256" / "256" / method / ("none" if value is None else f"{value:g}")
        metrics = _cell(tiny_setup, out, method, value)
        assert set(metrics["per_task"]) == {"niah_single_2", "vt"}
        assert metrics["provenance"]["params"]["dataset_revision"] == "offline"  # what was read, recorded
        predictions = pd.read_csv(out / "predictions.csv")
        assert len(predictions) == 4 and "prediction" in predictions
        paths.append(out / "metrics.json")
    ratios = {m: json.loads(p.read_text())["compression_ratio"] for (m, v), p in zip(cells, paths) if v != 0.0}
    assert ratios["full"] == 0.0 and ratios["knorm"] == 0.5
    assert ratios["kvzap_linear"] == 0.0  # tau far below every score prunes nothing
    assert 0.0 < json.loads(paths[2].read_text())["compression_ratio"] < 1.0
    # what served each cell: sdpa where nothing is pruned or kvpress drops entries from a dense cache, kvzap's
    # attention and its CPU kernels over KVzap's pruned layers (the prefill's causal forward, then decoding steps)
    attention = [json.loads(path.read_text())["attention"] for path in paths]
    dense = {"implementations": ["sdpa"], "segment_kernels": [], "devices": ["cpu"], "compiled": False}
    pruned = {
        "implementations": ["kvzap"],
        "segment_kernels": ["decode", "flash"],
        "devices": ["cpu"],
        "compiled": False,
    }
    assert attention == [dense, dense, pruned, pruned]

    results = aggregate.aggregate(paths, [], tmp_path / "tables")
    assert len(results) == 4 and "task:vt" in results
    assert results["attention"].tolist() == ["sdpa on cpu"] * 2 + ["kvzap (decode, flash) on cpu"] * 2
    assert (tmp_path / "tables" / "results.md").read_text().startswith("## results")
    provenance = json.loads((tmp_path / "tables" / "provenance.json").read_text())
    assert len(provenance["params"]["sources"]) == 4 and provenance["git_commit"]
    figures.tradeoff(results, {"benchmark": "ruler-256"}, tmp_path / "fig.png")
    figures.per_task(results, {"benchmark": "ruler-256"}, tmp_path / "task.png")
    assert (tmp_path / "fig.png").stat().st_size > 1000 and (tmp_path / "task.pdf").exists()


@pytest.mark.parametrize("policy", ["run", "truncate_middle"])
def test_samples_past_the_models_positions_run_and_are_counted(tiny_setup, tmp_path, policy):
    """4096-token rows on a model of 2048 positions: never a failed job. `run` (kvpress's, the paper's) runs them as
    they are, `truncate_middle` cuts their middle; either way the cell, its shards' merge and the table count them."""
    parts = [tmp_path / f"part{k}" for k in range(2)]
    for k, part in enumerate(parts):
        _cell(tiny_setup, part, "full", subset="4096", shard=(k, 2), long_samples=policy)
    metrics = merge.merge(parts, tmp_path / "cell")
    assert metrics["long_samples"]["policy"] == policy and metrics["long_samples"]["max_positions"] == 2048
    assert metrics["long_samples"]["count"] == 4 == metrics["n_samples"]
    assert metrics["long_samples"]["sample_ids"] == sorted(f"{t}-{i}" for t in ("niah_single_2", "vt") for i in (0, 1))
    assert pd.read_csv(tmp_path / "cell" / "predictions.csv")["past_positions"].all()
    assert aggregate.cell_row(tmp_path / "cell" / "metrics.json")["past_positions"] == 4
    short = _cell(tiny_setup, tmp_path / "short", "full", long_samples=policy)
    assert short["long_samples"]["count"] == 0


def test_missing_surrogate_is_named(tiny_setup, tmp_path):
    spec = JobSpec(
        model=str(tiny_setup / "model.json"),
        benchmark="ruler",
        subsets=("256",),
        cells=(CellSpec("kvzap_mlp", -4, {"256": str(tmp_path)}),),
        model_name="m",
        bench_name="r",
    )
    with pytest.raises(JobError, match="mlp surrogate"):
        job.evaluate(spec)


def test_every_registered_method_builds():
    assert set(presses.PRESSES) == set(methods.METHODS)
    for name, info in methods.METHODS.items():
        if info.surrogate or info.needs_hub:
            continue
        press = presses.build(name, 0.5, {})
        assert (press is None) == (name == "full")
    with pytest.raises(ValueError, match="Unknown method 'kvzapp'"):
        presses.get("kvzapp")


def test_kvzap_presses_protect_the_window_their_registry_entry_names(tiny_setup):
    """methods.METHODS[m].window (None: kvzap.window.WINDOW) is the window the built press keeps."""
    from kvzap.window import WINDOW  # written out here, not read through the property under test

    surrogates = {"linear": tiny_setup / "linear", "mlp": tiny_setup / "linear"}  # a folder is enough to build
    for name, info in methods.METHODS.items():
        if info.surrogate:
            press = presses.build(name, -1.0 if info.parameter == "threshold" else 0.5, surrogates)
            assert press.window == (WINDOW if info.window is None else info.window), name


def test_best_configuration_respects_tolerance():
    rows = [
        dict(model="m", benchmark="b", subset="s", method="full", value=None, average=90.0, compression_ratio=0.0),
        dict(model="m", benchmark="b", subset="s", method="kvzap_mlp", value=-4, average=89.5, compression_ratio=0.6),
        dict(model="m", benchmark="b", subset="s", method="kvzap_mlp", value=-3, average=80.0, compression_ratio=0.9),
        dict(
            model="m", benchmark="b", subset="s", method="kvzap_linear", value=-5, average=90.0, compression_ratio=0.4
        ),
    ]
    best = aggregate.best_configurations(pd.DataFrame(rows))
    assert best.iloc[0][["method", "value", "compression_ratio"]].tolist() == ["kvzap_mlp", -4, 0.6]


def _set_methods(c):
    c["evaluation"]["methods"] = ["full", "kvzapp"]


def _set_threshold(c):
    c["models"]["smollm2-135m"]["thresholds"] = [-4, "high"]


def _set_benchmark(c):
    c["evaluation"]["benchmarks"]["ruler-512"]["benchmark"] = "rulerr"


def _set_figure(c):
    c["figures"]["ruler_tradeoff"]["benchmark"] = "longbench-x"


@pytest.mark.parametrize(
    "change, message",
    [(_set_methods, "kvzapp"), (_set_threshold, "high"), (_set_benchmark, "rulerr"), (_set_figure, "longbench-x")],
)
def test_bad_config_fails_before_any_job(tmp_path, change, message):
    config = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())
    change(config)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert "prepare_model" not in result.stdout


def test_a_cell_with_several_surrogate_seeds_scores_their_mean(tiny_setup, tmp_path):
    """One folder per training seed: every seed answers every row (one shared prefill), the cell's score is the mean
    of the seeds' own averages (each recorded), sharded or not, and the table carries each seed's."""
    folders = []
    for seed in (42, 43, 44):
        torch.manual_seed(seed)
        folder = tmp_path / f"linear-{seed}"
        Surrogate(64, 2, 2).save_pretrained(folder)
        (folder / "metrics.json").write_text(json.dumps({"seed": seed}))
        folders.append(str(folder))
    extra = {"surrogate_linear": tuple(folders)}
    whole = _cell(tiny_setup, tmp_path / "whole", "kvzap_linear", 0.0, **extra)
    assert set(whole["seeds"]) == {"42", "43", "44"}
    assert whole["average"] == pytest.approx(sum(whole["seeds"].values()) / 3, abs=0.01)
    predictions = pd.read_csv(tmp_path / "whole" / "predictions.csv")
    assert sorted(predictions["seed"].unique()) == [42, 43, 44] and len(predictions) == 3 * whole["n_samples"]
    parts = [tmp_path / f"part{k}" for k in range(2)]
    for k, part in enumerate(parts):
        _cell(tiny_setup, part, "kvzap_linear", 0.0, shard=(k, 2), **extra)
    merged = merge.merge(parts, tmp_path / "merged")
    assert merged["seeds"] == whole["seeds"] and merged["average"] == pytest.approx(whole["average"])
    row = aggregate.cell_row(tmp_path / "merged" / "metrics.json")
    assert row["n_seeds"] == 3 and row["seed:43"] == whole["seeds"]["43"]
