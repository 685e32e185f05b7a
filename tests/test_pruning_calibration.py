"""Threshold calibration: the tau it returns gives the target ratio when the press actually runs."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from kvzap.pruning import KVzapPress
from kvzap.pruning.calibration import calibrate, collect_scores, mean_ratio
from kvzap.pruning.scorer_presses import SurrogateScorerPress
from kvzap.surrogate.model import Surrogate
from tiny_models import tiny_model

WINDOW = 16


@pytest.fixture(scope="module")
def setup():
    model = tiny_model("llama", 500)
    scorer = SurrogateScorerPress(surrogate=Surrogate(64, 2, 2))
    texts = [torch.randint(0, 500, (1, n), generator=torch.Generator().manual_seed(n)) for n in (90, 130, 170)]
    return model, scorer, texts


def test_calibrated_threshold_reaches_target(setup):
    model, scorer, texts = setup
    result = calibrate(collect_scores(model, texts, scorer, WINDOW), targets=[0.5])
    (found,) = result["thresholds"]
    achieved = []
    for ids in texts:
        press = KVzapPress(scorer, threshold=found["threshold"], window=WINDOW)
        with press(model):
            model.model(input_ids=ids, past_key_values=DynamicCache())
        achieved.append(press.compression_ratio)
    assert sum(achieved) / len(achieved) == pytest.approx(found["compression_ratio"], abs=1e-9)
    assert found["compression_ratio"] == pytest.approx(0.5, abs=0.01)
    ratios = [point["compression_ratio"] for point in result["curve"]]
    assert ratios == sorted(ratios) and ratios[0] < 0.1 and ratios[-1] > 0.6


def test_unreachable_target_is_refused(setup):
    model, scorer, texts = setup
    samples = collect_scores(model, texts, scorer, WINDOW)
    assert mean_ratio(samples, float("inf")) < 0.95  # the window is always kept
    with pytest.raises(ValueError, match="out of reach"):
        calibrate(samples, targets=[0.99])
