"""Fixed-budget variants for the paper's ablation (Fig. 5 right): top-k per head, and top-k per layer.

Both judge the tokens leaving the window in one batch, which only makes sense at prefill: they take no
`decoding`. Each judgement keeps kvpress's budget of the n tokens it judges, max(1, int(n * (1 - ratio))) per head
(a head is never emptied), and the per-layer press AdaKV's safeguard: each head first keeps its top
int(budget * safeguard) tokens, at least one when safeguard > 0. So with window=0 they make the selections of kvpress's
`KVzapPress(compression_ratio)` (per head) and `AdaKVPress(KVzapPress, alpha_safeguard)` (per layer).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from kvzap.pruning.windowed_press import WindowedPress
from kvzap.window import WINDOW


def _fraction(value) -> bool:
    """True for a real number in [0, 1]."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and 0 <= value <= 1


def _top_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores (..., n) -> bool (..., n) marking the k largest along the last dim."""
    keep = torch.zeros_like(scores, dtype=torch.bool)
    return keep.scatter_(-1, scores.topk(k, dim=-1).indices, True)


@dataclass
class _FixedRatioPress(WindowedPress):
    """ratio: the fraction of leaving tokens removed; window: the most recent tokens always kept (paper: 128)."""

    ratio: float
    window: int = WINDOW
    decoding: ClassVar[bool] = False  # a fixed share of a batch of tokens: prefill only

    def __post_init__(self):
        super().__post_init__()
        if not _fraction(self.ratio) or self.ratio == 1:
            raise ValueError(f"ratio must be a number in [0, 1) (the fraction removed), got {self.ratio!r}")

    def kept_per_head(self, n: int) -> int:
        """kvpress's budget of n judged tokens: never 0, so a short prefill cannot empty a head."""
        return max(1, int(n * (1 - self.ratio)))


@dataclass
class TopKPerHeadPress(_FixedRatioPress):
    """Each kv-head keeps the same number of leaving tokens: its top (1 - ratio) fraction by score."""

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        return _top_mask(scores, self.kept_per_head(scores.shape[-1]))


@dataclass
class TopKPerLayerPress(_FixedRatioPress):
    """A layer keeps H * k leaving tokens chosen across its kv-heads; each head first keeps its top
    `guarded_per_head(k)` (AdaKV's safeguard)."""

    safeguard: float = field(default=0.2, kw_only=True)

    def __post_init__(self):
        super().__post_init__()
        if not _fraction(self.safeguard):
            raise ValueError(
                f"safeguard must be a number in [0, 1] (the share of each head's budget it always keeps), "
                f"got {self.safeguard!r}"
            )

    def guarded_per_head(self, kept: int) -> int:
        """AdaKV's safeguard of a head's budget: int(kept * safeguard), at least one token unless safeguard is 0."""
        guarded = int(kept * self.safeguard)
        return max(1, guarded) if self.safeguard > 0 else guarded

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        batch, heads, n = scores.shape
        k = self.kept_per_head(n)
        guarded = scores.masked_fill(_top_mask(scores, self.guarded_per_head(k)), torch.inf)
        return _top_mask(guarded.reshape(batch, heads * n), heads * k).view(batch, heads, n)
