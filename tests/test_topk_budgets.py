"""The fixed-budget presses keep what kvpress keeps: TopKPerHeadPress the tokens of ScorerPress.compress, and
TopKPerLayerPress those AdaKVPress leaves unmasked (budget floor and safeguard included), token for token on the same
scores; with a window, the same budgets apply to each judgement's leaving tokens, so no head is emptied there either."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from kvpress import AdaKVPress, KnormPress, ScorerPress
from transformers import DynamicCache

from kvzap.pruning import TopKPerHeadPress, TopKPerLayerPress
from tiny_models import tiny_model


@dataclass
class GivenScores(ScorerPress):
    """A kvpress ScorerPress that scores with a given (B, H, n) tensor, so theirs and ours judge the same scores."""

    scores: torch.Tensor = field(default=None, repr=False)

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return self.scores.clone()


def _scores(n: int, seed: int) -> torch.Tensor:
    return torch.randn(2, 3, n, generator=torch.Generator().manual_seed(seed))


def _kvpress_kept_per_head(scores: torch.Tensor, ratio: float) -> torch.Tensor:
    """What ScorerPress.compress keeps: keys coded by their position come back as the kept positions."""
    batch, heads, n = scores.shape
    keys = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1).expand(batch, heads, n, 1)
    kept, _ = GivenScores(compression_ratio=ratio, scores=scores).compress(
        SimpleNamespace(head_dim=1), None, keys, keys, None, {}
    )
    keep = torch.zeros_like(scores, dtype=torch.bool)
    return keep.scatter_(-1, kept[..., 0].long(), True)


def _kvpress_kept_per_layer(scores: torch.Tensor, ratio: float, safeguard: float) -> torch.Tensor:
    """What AdaKVPress leaves unmasked."""
    batch, heads, n = scores.shape
    module = SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa"), masked_key_indices=None)
    keys = torch.zeros(batch, heads, n, 1)
    AdaKVPress(GivenScores(compression_ratio=ratio, scores=scores), alpha_safeguard=safeguard).compress(
        module, None, keys, keys, None, {}
    )
    keep = torch.ones_like(scores, dtype=torch.bool)
    if module.masked_key_indices is not None:
        keep[module.masked_key_indices] = False
    return keep


CASES = list(itertools.product([1, 2, 3, 7, 64], [0.0, 0.2, 0.5, 0.6, 0.9, 0.99]))


@pytest.mark.parametrize("n, ratio", CASES)
def test_per_head_keeps_what_scorer_press_compress_keeps(n, ratio):
    scores = _scores(n, seed=n)
    ours = TopKPerHeadPress(KnormPress(), ratio, window=0).select(scores)
    assert torch.equal(ours, _kvpress_kept_per_head(scores, ratio))
    assert bool((ours.sum(-1) >= 1).all())


@pytest.mark.parametrize("safeguard", [0.0, 0.2, 0.5, 1.0])
@pytest.mark.parametrize("n, ratio", CASES)
def test_per_layer_keeps_what_adakv_keeps(n, ratio, safeguard):
    scores = _scores(n, seed=n)
    scores[:, 0] += 3  # one head outscores the others: only the safeguard keeps theirs
    ours = TopKPerLayerPress(KnormPress(), ratio, window=0, safeguard=safeguard).select(scores)
    assert torch.equal(ours, _kvpress_kept_per_layer(scores, ratio, safeguard))


@pytest.mark.parametrize(
    "cls, leaving, ratio", [(TopKPerHeadPress, 1, 0.5), (TopKPerLayerPress, 1, 0.5), (TopKPerLayerPress, 2, 0.6)]
)
def test_a_window_judgement_keeps_a_token_per_head(cls, leaving, ratio):
    window, model = 8, tiny_model("llama")
    cache = DynamicCache()
    with cls(KnormPress(), ratio, window)(model):
        model(torch.arange(4, 4 + window + leaving)[None], past_key_values=cache)
    for layer in cache.layers:
        assert layer.rows.length.tolist() == [1, 1]  # max(1, int(leaving * (1 - ratio))) judged tokens kept per head
