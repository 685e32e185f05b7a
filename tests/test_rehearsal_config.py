"""config/rehearsal.yaml is an overlay that makes config/paper.yaml small: it may change sizes (rows, tokens,
epochs, swept values) and resources only, so the rehearsal runs the paper's models, ids, methods, benchmarks,
subsets, figures and tables."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import yaml

from kvzap.plan import overlays

ROOT = Path(__file__).resolve().parents[1]
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
OVERLAY = yaml.safe_load((ROOT / "config" / "rehearsal.yaml").read_text())
REHEARSAL = overlays.load([ROOT / "config" / "paper.yaml", ROOT / "config" / "rehearsal.yaml"])
SIZES = (  # the keys the overlay may set, as slash paths (* is one key)
    "results",
    "models/*/dtype",
    "models/*/thresholds",
    "models/*/resources/*/cpus",
    "models/*/resources/*/mem_mb",
    "models/*/resources/*/runtime",
    "oracle/min_tokens",
    "oracle/max_tokens",
    "oracle/n_test",
    "oracle/n_train",
    "oracle/tokens_per_prompt",
    "oracle/shard_tokens",
    "training/epochs",
    "training/batch_size",
    "evaluation/batch_size/*",
    "evaluation/ratios",
    "evaluation/benchmarks/*/n_samples",
    "evaluation/benchmarks/*/max_new_tokens",
    "evaluation/benchmarks/*/rollouts",
    "evaluation/benchmarks/*/shards",
    "ablations/kv_input/n_train",
)


def _leaves(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        out += _leaves(value, path + "/") if isinstance(value, dict) else [path]
    return out


def test_the_overlay_sets_sizes_and_resources_only():
    other = [path for path in _leaves(OVERLAY) if not any(fnmatchcase(path, pattern) for pattern in SIZES)]
    assert not other, f"config/rehearsal.yaml sets more than sizes: {other}"


def test_the_overlay_names_only_the_papers_models_and_benchmarks():
    assert OVERLAY["models"].keys() <= PAPER["models"].keys()
    assert OVERLAY["evaluation"]["benchmarks"].keys() <= PAPER["evaluation"]["benchmarks"].keys()
    assert REHEARSAL["models"].keys() == PAPER["models"].keys()


def test_swept_values_are_a_subset_of_the_papers():
    for name, paper in PAPER["models"].items():
        rehearsal = REHEARSAL["models"][name]
        assert set(rehearsal["thresholds"]) <= set(paper["thresholds"])
        assert rehearsal["dtype"] in (paper["dtype"], "float32")
    assert set(REHEARSAL["evaluation"]["ratios"]) <= set(PAPER["evaluation"]["ratios"])


def test_table_2_thresholds_are_rehearsed():
    for model, fixed in PAPER["tables"]["best"].items():
        assert fixed["value"] in REHEARSAL["models"][model]["thresholds"]


def test_results_never_mix_with_real_results():
    assert REHEARSAL["results"] != PAPER.get("results", "results")


def test_the_check_refuses_a_structural_change():
    """The allowed paths are not so loose that a changed method list or model id would pass."""
    assert not any(fnmatchcase("evaluation/benchmarks/ruler-4k/methods", p) for p in SIZES)
    assert not any(fnmatchcase("models/qwen3-8b/id", p) for p in SIZES)
