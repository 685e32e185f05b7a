"""KVzapPress: the DMS inference rule of the paper, keep an entry iff its score >= threshold."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from kvzap.pruning.windowed_press import WindowedPress
from kvzap.window import WINDOW


@dataclass
class KVzapPress(WindowedPress):
    """KVzap (arXiv 2601.07891, Alg. 1): entries scoring below `threshold` are removed once out of the window.

    Same signature, policy and compression-ratio accounting as kvpress's
    `DMSPress(press, threshold, sliding_window_size, decoding)`, but with `evict=True` the removed entries are freed.

    threshold : keep an entry iff its score >= threshold (a log-score, e.g. -4.0; -inf prunes nothing).
    window : the most recent `window` tokens are always kept (paper: 128); each token is judged once, when it leaves.
    decoding : also prune during generation (the AIME setting); False prunes the prefill only (RULER, LongBench).
    """

    threshold: float
    window: int = WINDOW
    decoding: bool = False

    def __post_init__(self):
        super().__post_init__()
        tau = self.threshold
        if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or math.isnan(tau):
            raise ValueError(f"threshold must be a number (a log-score such as -4.0), got {self.threshold!r}")
        if not isinstance(tau, (int, float)):
            self.threshold = float(tau)  # numpy / torch scalars: compared per token, and printed in reprs

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        return scores >= self.threshold
