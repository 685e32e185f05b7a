"""A trained-surrogate folder without training one, for the publishing tests: the files kvzap.training.fit leaves,
with fixed R^2 values that the cards and checks can be asserted against."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from kvzap.provenance import stamp
from kvzap.surrogate.model import Surrogate

BASE = "Qwen/Qwen3-8B"


def make_surrogate(root: Path, kind: str, base_model: str = BASE) -> tuple[Path, Surrogate]:
    """A trained-surrogate folder as kvzap.training.fit writes it (weights, config, metrics: R^2 per layer/head)."""
    torch.manual_seed(0)
    folder = root / "surrogates" / kind
    model = Surrogate(input_dim=16, output_dim=2, n_modules=3, hidden_dim=None if kind == "linear" else 4)
    model.save_pretrained(folder, extra_config={"base_model": base_model})
    metrics = {
        **stamp({"kind": kind}, {"model_id": base_model, "revision": "rev123"}, 7),
        "kind": kind,
        "r2_mean": 0.45,
        "r2": [[0.5, 0.6], [0.4, 0.7], [0.3, 0.2]],
        "n_train_pairs": 100,
        "n_test_pairs": 10,
        "history": [],
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder, model
