"""Threshold calibration: which tau gives "3x" (ratio 0.67) on this model, scorer and kind of text.

Prefill attention is dense and pruning comes after it, so a prefill's scores do not depend on tau: one
forward per calibration text records every judged score, and the prefill compression ratio of any tau
follows exactly (fraction of (layer, kv-head, token) entries below tau, mean over layers, as DMSPress
counts it). Ratios are averaged over texts; per-prompt ratios vary (paper Fig. 5), so report the curve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from transformers import DynamicCache

from kvzap.pruning.windowed_press import WindowedPress
from kvzap.window import WINDOW


@dataclass
class _ScoreRecorder(WindowedPress):
    """Keeps every entry and remembers, per layer, the scores of the tokens it judged (prefill only)."""

    window: int = WINDOW
    decoding: ClassVar[bool] = False
    judged: list[torch.Tensor] = field(default_factory=list, init=False, repr=False)

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        self.judged.append(scores.flatten().float().cpu())
        return torch.ones_like(scores, dtype=torch.bool)


@dataclass
class ScoreSample:
    """One calibration text: judged scores per layer, and the entries per layer (kv-heads x tokens)."""

    layer_scores: list[torch.Tensor]
    entries_per_layer: int

    def ratio(self, threshold: float) -> float:
        removed = torch.stack([(s < threshold).sum() for s in self.layer_scores]).double()
        return (removed / self.entries_per_layer).mean().item()


@torch.no_grad()
def collect_scores(model, input_ids: list[torch.Tensor], scorer, window: int = WINDOW) -> list[ScoreSample]:
    """Prefill each (1, T) id tensor once under a recording press."""
    samples = []
    for ids in input_ids:
        recorder = _ScoreRecorder(scorer, window=window)
        with recorder(model):
            model.model(input_ids=ids.to(model.device), past_key_values=DynamicCache(config=model.config))
        entries = ids.shape[1] * model.config.num_key_value_heads
        samples.append(ScoreSample(recorder.judged, entries))
    return samples


def mean_ratio(samples: list[ScoreSample], threshold: float) -> float:
    return sum(s.ratio(threshold) for s in samples) / len(samples)


def check_target(target) -> None:
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 <= target < 1:
        raise ValueError(f"target ratio {target!r} must be a number in [0, 1) (the fraction of entries removed)")


def judged_scores(samples: list[ScoreSample]) -> torch.Tensor:
    """Every judged score of every sample; refuses samples where no token left the window."""
    scores = [s for sample in samples for s in sample.layer_scores]
    if not scores or not sum(s.numel() for s in scores):
        raise ValueError(
            "No calibration token left the window, so no score was judged: use texts longer than the window "
            "(or a smaller window)."
        )
    return torch.cat(scores)


def threshold_for(samples: list[ScoreSample], target: float, iterations: int = 60) -> float:
    """Smallest-error tau with mean ratio ~= target, by bisection (the ratio never decreases with tau)."""
    check_target(target)
    scores = judged_scores(samples)
    low, high = scores.min().item() - 1.0, scores.max().item() + 1.0
    if target >= mean_ratio(samples, high):
        raise ValueError(
            f"target ratio {target} is out of reach: with this window at most "
            f"{mean_ratio(samples, high):.3f} of the entries can be removed"
        )
    for _ in range(iterations):
        middle = (low + high) / 2
        low, high = (middle, high) if mean_ratio(samples, middle) < target else (low, middle)
    return high


def calibrate(samples: list[ScoreSample], targets: list[float], curve_points: int = 41) -> dict:
    """{"thresholds": [{target, threshold, compression_ratio}], "curve": [{threshold, compression_ratio}]}."""
    for target in targets:
        check_target(target)
    scores = judged_scores(samples)
    lo, hi = torch.quantile(scores[torch.randperm(len(scores))[:100_000]], torch.tensor([0.01, 0.99])).tolist()
    grid = torch.linspace(lo, hi, curve_points).tolist()
    taus = {t: threshold_for(samples, t) for t in targets}
    found = [{"target": t, "threshold": tau, "compression_ratio": mean_ratio(samples, tau)} for t, tau in taus.items()]
    return {"thresholds": found, "curve": [{"threshold": t, "compression_ratio": mean_ratio(samples, t)} for t in grid]}
