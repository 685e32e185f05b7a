"""config/rehearsal.yaml is config/paper.yaml made small: same models, ids, methods, benchmarks, subsets, figures
and tables; only sizes differ (rows, tokens, epochs, swept values, resources)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
REHEARSAL = yaml.safe_load((ROOT / "config" / "rehearsal.yaml").read_text())
SIZE_KEYS = {"n_samples", "max_new_tokens", "rollouts", "shards"}  # benchmark keys the rehearsal may shrink


def test_same_models_with_a_subset_of_the_thresholds():
    assert PAPER["models"].keys() == REHEARSAL["models"].keys()
    for name, paper in PAPER["models"].items():
        rehearsal = REHEARSAL["models"][name]
        for key in ("id", "skip_methods"):
            assert rehearsal.get(key) == paper.get(key), (name, key)
        assert rehearsal["dtype"] in (paper["dtype"], "float32")  # CPU speed: bf16 is 3-7x slower on CPUs
        assert set(rehearsal["thresholds"]) <= set(paper["thresholds"])
        assert rehearsal["resources"].keys() == paper["resources"].keys()
        for stage, spec in paper["resources"].items():
            assert rehearsal["resources"][stage].get("gpu") == spec.get("gpu"), (name, stage)  # same GPU placement


def test_same_benchmarks_methods_and_subsets():
    assert REHEARSAL["evaluation"]["methods"] == PAPER["evaluation"]["methods"]
    assert set(REHEARSAL["evaluation"]["ratios"]) <= set(PAPER["evaluation"]["ratios"])
    assert REHEARSAL["evaluation"]["benchmarks"].keys() == PAPER["evaluation"]["benchmarks"].keys()
    for name, paper in PAPER["evaluation"]["benchmarks"].items():
        rehearsal = REHEARSAL["evaluation"]["benchmarks"][name]
        structural = (paper.keys() | rehearsal.keys()) - SIZE_KEYS
        assert {k: paper.get(k) for k in structural} == {k: rehearsal.get(k) for k in structural}, name


def test_same_figures_tables_corpus_and_publishing():
    for key in ("figures", "tables", "publish", "seed"):
        assert REHEARSAL[key] == PAPER[key], key
    assert REHEARSAL["oracle"]["corpus"] == PAPER["oracle"]["corpus"]
    assert REHEARSAL["training"]["surrogates"] == PAPER["training"]["surrogates"]
    assert REHEARSAL["ablations"]["kv_input"]["models"] == PAPER["ablations"]["kv_input"]["models"]
    assert REHEARSAL["results"] != PAPER.get("results", "results")  # never mixes with real results


def test_table_2_thresholds_are_rehearsed():
    for model, fixed in PAPER["tables"]["best"].items():
        assert fixed["value"] in REHEARSAL["models"][model]["thresholds"]
